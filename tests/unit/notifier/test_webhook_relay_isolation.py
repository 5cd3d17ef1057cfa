"""One failing webhook destination blocks no other (issue 37, finding 7). The relay used to
look only at the oldest 200 pending items, retry for ever and let the outbox grow: a
destination down with 200 items queued stopped every webhook. Now each destination's
oldest item is tried (its order kept), a destination past its retry budget has its
waiting items dead-lettered in bulk (``webhook_budget.py``), and each destination holds
a bounded number of pending items (past it, dead-lettered at once). A real relay thread,
a real outbox (SQLite) and real HTTP receivers on loopback.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from services.notifier.egress import EgressPolicy
from services.notifier.outbox import WEBHOOK_LANE, Outbox, OutboxItem
from services.notifier.relay import RelayHooks, WebhookRelay


class Receiver:
    """An HTTP receiver on loopback answering ``status`` and counting the bodies."""

    def __init__(self, status: int) -> None:
        self.bodies: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if status < 300:
                    receiver.bodies.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def items(url: str, n: int, prefix: str) -> list[OutboxItem]:
    return [
        OutboxItem(id=f"{prefix}-{i}", destination=url, value=f"{prefix} {i}".encode(),
                   lane=WEBHOOK_LANE, kind="alert")
        for i in range(n)
    ]  # fmt: skip


def until(condition: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def test_a_failing_destination_blocks_no_other_and_dead_letters_past_its_budget(
    tmp_path: Path,
) -> None:
    down, up = Receiver(503), Receiver(200)
    outbox = Outbox(tmp_path / "outbox.db")
    outbox.append(items(down.url, 250, "down"))  # queued first: more than 200
    outbox.append(items(up.url, 3, "up"))
    dead: list[str] = []
    hooks = RelayHooks(
        delivered=lambda _items: (),
        dead_letter=lambda items, _why: dead.extend(i.id for i in items),
        reconciled=lambda _n: None,
    )  # fmt: skip
    relay = WebhookRelay(
        outbox, hooks=hooks, egress=EgressPolicy(["127.0.0.1"]), timeout=2.0,
        max_backoff=0.05, max_attempts=3,
    )  # fmt: skip
    relay.start()
    try:
        delivered = until(lambda: len(up.bodies) == 3)
        print("the healthy destination got", up.bodies, "while the other answers 503")
        assert delivered and up.bodies == [b"up 0", b"up 1", b"up 2"], "in order, all"
        assert until(lambda: "down-0" in dead), "past its retry budget: dead-lettered"
        letters = {d.item.id: d for d in outbox.dead_letters(1000)}
        print(
            "dead-lettered:", len(letters), letters["down-0"].item.attempts, letters["down-0"].error
        )
        # The budget is the destination's: its 3rd failure in a row dead-letters all 250.
        assert letters["down-0"].item.attempts == 3 and "retry budget" in letters["down-0"].error
        assert sorted(letters) == sorted(f"down-{i}" for i in range(250))
        assert all("retry budget" in d.error for d in letters.values())
        assert outbox.count(WEBHOOK_LANE) == 0
    finally:
        relay.stop()
        down.close()
        up.close()
        outbox.close()


def test_each_destination_holds_a_bounded_number_of_pending_items(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.db", max_pending_per_destination=5)
    outbox.append(items("http://a.example/h", 8, "a"))
    outbox.append(items("http://b.example/h", 2, "b"))
    pending = outbox.pending(WEBHOOK_LANE, 100)
    print("pending:", [i.id for i in pending])
    assert [i.id for i in pending] == [*(f"a-{i}" for i in range(5)), "b-0", "b-1"]
    full = sorted(d.item.id for d in outbox.dead_letters(100))
    assert full == ["a-5", "a-6", "a-7"]
    assert all("outbox full" in d.error for d in outbox.dead_letters(100))
    outbox.close()
