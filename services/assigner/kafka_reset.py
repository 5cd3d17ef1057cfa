"""The Kafka edge of an offset reset: the partitions' offsets, the broker's
offsets-for-times, and committing a group's new offsets with commit metadata.

Every method blocks (confluent-kafka calls): call it through ``asyncio.to_thread``. The
offsets are read fresh (:class:`~services.assigner.kafka_offsets.KafkaOffsets`, never the
1 s cache DescribeGroup reads through: a reset reads the commits its pause just made).

Commits go through a short-lived consumer of the group that never subscribes, the way a
sidecar commits (generation -1): Kafka accepts that only while the group has no members,
which is the rule of a reset anyway (a leased group never has any; a kafka_group one is
checked empty first). A group that gained a member meanwhile answers UNKNOWN_MEMBER_ID
or ILLEGAL_GENERATION: GROUP_NOT_EMPTY. The metadata is the sidecars'
(:mod:`services.runtime.commitmeta`): the new lease epoch, "assigner" as the committer,
nothing acked above the new offset — so the next owner skips nothing.

A leased group's reset fences first (``fence_leases``, issue 36): under ``commit_fencing:
kafka`` a holder cut off from the assigner has no deadline and keeps committing through
its lease's transactional producer, so the pause's "lapsed" does not stop it. Before the
commit, each partition's lease ``transactional.id`` is initialised here
(:func:`~services.runtime.commitmeta.lease_transactional_id`, the sidecars' own): the
broker aborts the holder's open transaction and refuses its every later commit
(``_FENCED``; the holder drops the lease), and InitProducerId answers only once the
holder's last transaction is complete, so no commit of its lands after the reset's. The
re-grant initialises the id again (fencing this producer, closed by then). Under
``commit_fencing: lease`` nobody holds the id: the initialisations only cost a round
trip or two per partition, in parallel.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from dsclient.reasons import DsError, Reason
from services.assigner.kafka_offsets import KafkaOffsets
from services.assigner.offsets import Offsets, unavailable
from services.runtime import commitmeta
from services.runtime.kafka import is_retriable, new_consumer, new_producer
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TopicPartition

RESET_TIMEOUT_SECONDS = 10.0
COMMITTER_ID = commitmeta.ASSIGNER
_NOT_EMPTY = frozenset(
    {KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS}
)
_RETRY_SECONDS = 0.1
PARALLEL_FENCES = 8  # lease transactional ids initialised at once


class KafkaResets:
    """Offsets, offsets-for-times and commits of an offset reset
    (:class:`~services.assigner.resets.OffsetResets`)."""

    def __init__(
        self,
        settings: ServiceSettings,
        offsets: KafkaOffsets,
        *,
        timeout: float = RESET_TIMEOUT_SECONDS,
    ) -> None:
        self.settings = settings
        self._offsets = offsets
        self.timeout = timeout

    def read(self, group: str, partitions: Sequence[TopicPartition]) -> Offsets:
        """Committed offset, log start and end of each partition, read now."""
        return self._offsets.read(group, partitions)

    def offsets_for_times(self, times: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The first offset whose timestamp is >= the given one (ms), per partition; -1
        where no record is that recent (the reset then takes the end offset)."""
        if not times:
            return {}
        consumer = new_consumer(
            self.settings, group="ds-assigner-reset-times", client_id="ds-assigner-reset"
        )
        try:
            found = consumer.offsets_for_times(
                [_ktp(tp, ts) for tp, ts in sorted(times.items())], timeout=self.timeout
            )
        except KafkaException as exc:
            raise unavailable(f"cannot look offsets up by time: {_text(exc)}") from exc
        finally:
            consumer.close()
        out = {}
        for ktp in found:
            if ktp.error is not None:
                where = f"{ktp.topic}/{ktp.partition}"
                raise unavailable(f"cannot look {where} up by time: {ktp.error}")
            out[TopicPartition(str(ktp.topic), int(ktp.partition or 0))] = int(ktp.offset)
        return out

    def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, int]],
        *,
        fence_leases: bool = False,
    ) -> None:
        """Commit each partition's (offset, lease epoch) for ``group``, synchronously and
        all in one request; retried on a coordinator moving, until the timeout. With
        ``fence_leases`` each partition's lease transactional id is initialised first
        (module docstring); KAFKA_UNAVAILABLE, nothing committed, if one cannot be."""
        if not offsets:
            return
        if fence_leases:
            self._fence(group, sorted(offsets))
        request = [
            _ktp(tp, offset, commitmeta.encode(epoch, COMMITTER_ID, offset, ()))
            for tp, (offset, epoch) in sorted(offsets.items())
        ]
        consumer = new_consumer(self.settings, group=group, client_id="ds-assigner-reset")
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                error = _commit_error(consumer, request)
                if error is None:
                    return
                if error.code() in _NOT_EMPTY:
                    raise DsError(
                        Reason.GROUP_NOT_EMPTY,
                        f"Kafka refused the commit for group {group!r} ({error.str()}): the "
                        "group has members now; stop them and reset again",
                        metadata={"group": group, "members": "?"},
                    )
                if not is_retriable(error) or time.monotonic() >= deadline:
                    raise unavailable(
                        f"cannot commit the new offsets of group {group!r}: {error.str()}", group
                    )
                time.sleep(_RETRY_SECONDS)
        finally:
            consumer.close()

    def _fence(self, group: str, tps: Sequence[TopicPartition]) -> None:
        """Initialise the lease transactional id of each of ``tps``, in parallel."""
        with ThreadPoolExecutor(min(PARALLEL_FENCES, len(tps))) as pool:
            failures = [e for e in pool.map(lambda tp: self._fence_one(group, tp), tps) if e]
        if failures:
            raise unavailable(
                f"cannot fence the holders of group {group!r} before its reset: "
                + "; ".join(failures),
                group,
            )

    def _fence_one(self, group: str, tp: TopicPartition) -> str | None:
        """None once the id is initialised (the previous producer under it fenced), else
        why not."""
        txn_id = commitmeta.lease_transactional_id(group, tp.topic, tp.partition)
        producer = new_producer(
            self.settings,
            client_id="ds-assigner-reset",
            # Eager connections: no wait for librdkafka's 500 ms PID retry timer (the
            # lease producers' setting, services/consumer_sidecar/kafka_fenced_commits.py).
            overrides={"transactional.id": txn_id, "enable.sparse.connections": False},
        )
        try:
            producer.init_transactions(self.timeout)
        except KafkaException as exc:
            return f"{tp.topic}/{tp.partition}: {_text(exc)}"
        finally:
            _close(producer)
        return None


def _close(producer: Producer) -> None:
    """Close a fencing producer (it never produced: nothing to flush)."""
    with contextlib.suppress(KafkaException):
        producer.close()


def _commit_error(consumer: Consumer, request: list[KafkaTopicPartition]) -> KafkaError | None:
    """The commit's error (the request's, or the first partition's), None on success."""
    try:
        result = consumer.commit(offsets=request, asynchronous=False)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError):
            return error
        raise
    for ktp in result or []:
        if ktp.error is not None:
            return ktp.error
    return None


def _ktp(tp: TopicPartition, offset: int, metadata: str | None = None) -> KafkaTopicPartition:
    if metadata is None:
        return KafkaTopicPartition(tp.topic, tp.partition, offset)
    return KafkaTopicPartition(tp.topic, tp.partition, offset, metadata=metadata)


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return str(arg.str()) if hasattr(arg, "str") else str(arg)
