"""Items dead-lettered at once because their webhook destination already holds its bound of
pending items ("outbox full for this destination") are dead letters like the others: the
outbox returns them from the transaction that moved them, the table keeps only the newest
``dead_letters_max``, and the notifier counts them in ``ds_notifier_outbox_dead_letters``
and raises DEAD_LETTER for them. They used to be written to the table silently, beyond its
bound. A real SQLite outbox; the second test the real pipeline, render relay and servicer
(the harness: tests/support/notifier_rpc.py, Kafka confirmed in process).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.notifier import fault_events
from services.notifier.event_codec import decode_event
from services.notifier.outbox import WEBHOOK_LANE, DeadLetter, Outbox, OutboxItem, moved_together
from services.notifier.relay import RelayHooks
from tests.support.notifier_rpc import FAULTS_TOPIC, Notifier, fault, report, run

URL = "https://h/hook"
FULL = "outbox full for this destination (2 pending)"


def alerts(n: int, prefix: str) -> list[OutboxItem]:
    return [
        OutboxItem(id=f"{prefix}-{i}", destination=URL, value=f"{prefix} {i}".encode(),
                   lane=WEBHOOK_LANE, kind="alert")
        for i in range(n)
    ]  # fmt: skip


def test_the_outbox_returns_what_it_dead_letters_when_full_and_keeps_its_bound(
    tmp_path: Path,
) -> None:
    outbox = Outbox(tmp_path / "outbox.db", max_pending_per_destination=2, dead_letters_max=3)
    try:
        moved = outbox.complete([], alerts(7, "a"))
        again = outbox.append(alerts(1, "b"))
        assert [i.id for i in outbox.pending(WEBHOOK_LANE, 10)] == ["a-0", "a-1"]
        kept = [d.item.id for d in outbox.dead_letters(100)]
        print("dead-letter table:", kept)
        assert kept == ["a-5", "a-6", "b-0"], "the newest dead_letters_max (3) are kept"
        print("dead-lettered by complete():", moved, "by append():", again)
        assert moved is not None and again is not None, "what was dead-lettered is returned"
        assert [(d.item.id, d.error) for d in moved] == [(f"a-{i}", FULL) for i in range(2, 7)]
        assert [(d.item.id, d.error) for d in again] == [("b-0", FULL)]
        # The caller tells the dead-letter hook of each transaction's in bulk: one
        # DEAD_LETTER naming how many (as the webhook budget's bulk moves).
        told: list[tuple[list[str], str]] = []
        hooks = RelayHooks(
            delivered=lambda _items: (),
            dead_letter=lambda items, why: told.append(([i.id for i in items], why)),
            reconciled=lambda _n: None,
        )
        hooks.report_dead_letters(moved)
        assert told == [([f"a-{i}" for i in range(2, 7)], FULL)]
        (opened, _resolved) = fault_events.dead_letter([d.item for d in moved], FULL, "n1")
        assert (opened.attributes["count"], opened.attributes["error"]) == ("5", FULL)
    finally:
        outbox.close()


def test_alerts_for_a_full_destination_are_counted_and_raise_dead_letter(
    tmp_path: Path,
) -> None:
    async def body(n: Notifier) -> None:
        for name in ("one", "two"):  # a fault: two alerts for URL, rendered in one round
            hook = notifier_pb2.AlertTemplate(
                caller="team-a", name=name, open_template="{{ type }} in {{ group }}",
                fault_types=[common_pb2.FAULT_TYPE_COMMIT_FAILED],
                webhook=notifier_pb2.WebhookRoute(url=URL),
            )  # fmt: skip
            await n.stub.PutAlertTemplate(notifier_pb2.PutAlertTemplateRequest(template=hook))
        for i in range(3):  # 6 alerts for URL; no webhook relay runs: 2 fit, 4 do not
            await n.stub.ReportFault(report(fault(group=f"g{i}")))

        def dead_letter_events() -> list[common_pb2.FaultEvent]:
            events = [
                decode_event(item.value, dict(item.headers)["content-type"])
                for item in n.kafka.to(FAULTS_TOPIC)
            ]
            return [
                e for e in events
                if e.type == common_pb2.FAULT_TYPE_DEAD_LETTER
                and e.state == common_pb2.FAULT_STATE_OPEN
            ]  # fmt: skip

        for _ in range(300):  # the pipeline reports its own faults as tasks on the loop
            if len(dead_letter_events()) >= 2:
                break
            await asyncio.sleep(0.05)
        letters = n.outbox.dead_letters(100)
        counted = n.registry.get_sample_value(
            "ds_notifier_outbox_dead_letters_total", {"kind": "alert"}
        )
        events = dead_letter_events()
        print("dead-letter table:", [(d.item.id, d.error) for d in letters])
        print("counted:", counted, "DEAD_LETTER (open):", [dict(e.attributes) for e in events])
        assert [d.error for d in letters] == [FULL] * 3, "the newest dead_letters_max (3)"
        assert n.outbox.count(WEBHOOK_LANE) == 2
        assert counted == 4.0, "each counted in ds_notifier_outbox_dead_letters_total"
        # One DEAD_LETTER per round's bulk (a fault's two alerts), naming how many.
        assert [(e.attributes["count"], e.attributes["error"]) for e in events] == [
            ("2", FULL),
            ("2", FULL),
        ]
        assert all(e.attributes["kind"] == "alert" for e in events)
        assert events[-1].attributes["last_id"] == letters[-1].item.id

    run(tmp_path, body, max_pending_per_destination=2, dead_letters_max=3)


def test_dead_letters_are_reported_in_runs_of_one_destination_and_one_reason() -> None:
    a, b = alerts(3, "a"), [OutboxItem(id="b-0", destination="https://h/other", value=b"b",
                                       lane=WEBHOOK_LANE, kind="alert")]  # fmt: skip
    letters = [DeadLetter(a[0], FULL, 1), DeadLetter(a[1], FULL, 1), DeadLetter(b[0], FULL, 1),
               DeadLetter(a[2], "other", 1)]  # fmt: skip
    runs = [([i.id for i in items], why) for items, why in moved_together(letters)]
    assert runs == [(["a-0", "a-1"], FULL), (["b-0"], FULL), (["a-2"], "other")]
    assert moved_together([]) == []
