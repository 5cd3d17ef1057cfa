"""The DEAD_LETTER fault the notifier raises for items moved to the dead-letter table
(``fault_events.dead_letter``): one item as before; a webhook destination's items moved
in bulk give one event pair naming how many, the first and the last, the URL redacted."""

from __future__ import annotations

from dataservice.common.v1 import common_pb2
from services.notifier import fault_events
from services.notifier.outbox import WEBHOOK_LANE, OutboxItem

URL = "https://hooks.example/services/T000/SECRET"


def alert(i: int) -> OutboxItem:
    return OutboxItem(id=f"a-{i}", destination=URL, value=b"12345", lane=WEBHOOK_LANE,
                      kind="alert")  # fmt: skip


def test_one_item_gives_one_open_and_resolved_pair_naming_it() -> None:
    events = fault_events.dead_letter([alert(1)], "permanent: HTTP 404", "n1")
    assert [e.state for e in events] == [
        common_pb2.FAULT_STATE_OPEN,
        common_pb2.FAULT_STATE_RESOLVED,
    ]
    for event in events:
        assert event.type == common_pb2.FAULT_TYPE_DEAD_LETTER
        assert event.attributes["id"] == "a-1" and "count" not in event.attributes
        assert event.attributes["bytes"] == "5"
        assert "SECRET" not in event.message and "SECRET" not in event.attributes["destination"]
        assert event.message.startswith("alert a-1 to ")


def test_items_moved_in_bulk_give_one_pair_with_their_count() -> None:
    items = [alert(i) for i in range(1, 608 + 1)]
    why = "permanent: retry budget spent (12 failed attempts in a row ...): HTTP 503"
    events = fault_events.dead_letter(items, why, "n1")
    print(events[0].message)
    assert len(events) == 2
    first = events[0]
    assert first.attributes["count"] == "608"
    assert (first.attributes["id"], first.attributes["last_id"]) == ("a-1", "a-608")
    assert first.attributes["bytes"] == str(5 * 608)
    assert first.attributes["error"] == why
    assert first.message.startswith("608 alerts (a-1 .. a-608) to ")
    assert "SECRET" not in first.message
    assert events[0].dedupe_key == events[1].dedupe_key
