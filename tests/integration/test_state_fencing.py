"""Two assigner leaders cannot both write ``__ds_assigner_state`` (issue 17, path 4).

A leader paused (SIGSTOP, a VM stall) past its Consul session wakes up after a standby
was elected and goes on writing epochs: nothing in the topic stopped it, so the new
leader's state could be overwritten by the old one's decisions. The state is written by
a transactional producer under one fixed ``transactional.id``: the new leader's term
(``init_transactions``) fences the old writer at the broker, its next write fails with
``Fenced``, nothing of it is read, and its owner is told to step down.

Real Kafka; two StateStores on one topic play the two leaders.
"""

from __future__ import annotations

import asyncio
import uuid

from services.assigner.state import StateStore
from services.devstack.kafka import TopicFactory
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TP
from services.runtime.txn_writer import Fenced, NoTerm

TP0 = TP("orders", 0)


def test_a_new_leaders_term_fences_the_old_leaders_state_writes(
    topic_factory: TopicFactory,
) -> None:
    name = topic_factory.reserve()
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    txn_id = f"ds-assigner-state-{uuid.uuid4().hex[:8]}"
    lost: list[str] = []
    old = StateStore(
        settings, topic=name, transactional_id=txn_id, on_lost=lambda: lost.append("old")
    )
    new = StateStore(
        settings, topic=name, transactional_id=txn_id, on_lost=lambda: lost.append("new")
    )
    try:
        old.ensure_topic()
        old.begin_term()

        async def scenario() -> tuple[BaseException | None, BaseException | None]:
            await old.put_epochs("g", [(TP0, 1)])  # the old leader's term: written
            await asyncio.to_thread(new.begin_term)  # a standby is elected: fences it
            await new.put_epochs("g", [(TP0, 2)])
            stale: BaseException | None = None
            try:
                await old.put_epochs("g", [(TP0, 1)])  # the old leader wakes up
            except Exception as exc:
                stale = exc
            after: BaseException | None = None
            try:
                await old.put_epochs("g", [(TP0, 1)])
            except Exception as exc:
                after = exc
            await new.put_epochs("g", [(TP0, 3)])  # the new leader goes on
            return stale, after

        stale, after = asyncio.run(scenario())
        print(f"old leader's write after the new term: {stale!r}; the next one: {after!r}")
        assert isinstance(stale, Fenced), stale
        assert isinstance(after, NoTerm), "a fenced writer never writes again in this term"
        assert lost == ["old"], "the old leader is told to step down, the new one is not"
        snapshot = new.load()
        assert snapshot.epochs == {"g": {TP0: 3}}
        assert snapshot.bad_records == {}
    finally:
        old.close()
        new.close()


def test_writes_without_a_term_fail_and_write_nothing(topic_factory: TopicFactory) -> None:
    name = topic_factory.reserve()
    settings = ServiceSettings(bootstrap=topic_factory.bootstrap)
    store = StateStore(settings, topic=name, transactional_id=f"t-{uuid.uuid4().hex[:8]}")
    try:
        store.ensure_topic()

        async def write() -> BaseException | None:
            try:
                await store.put_epochs("g", [(TP0, 5)])
            except Exception as exc:
                return exc
            return None

        assert isinstance(asyncio.run(write()), NoTerm)
        store.begin_term()
        assert asyncio.run(write()) is None
        store.end_term()
        assert isinstance(asyncio.run(write()), NoTerm)
        assert store.load().epochs == {"g": {TP0: 5}}
    finally:
        store.close()
