"""The notifier's durable outbox: SQLite in WAL mode, ``synchronous=FULL``.

Everything the notifier must send — fault events and rendered alerts for Kafka, alerts for
webhooks — is first written here, in the same transaction as the record of the report that
caused it, and only then acknowledged to the reporter. Relays take pending items in order
(``seq``), send them, and delete them once the destination confirmed. A kill -9 at any
point loses nothing: an item is either not yet acknowledged to its reporter (who retries
with the same id) or durable here until it is confirmed delivered. An item delivered but
not yet deleted when the process died is found again on restart by the Kafka relay's
reconciliation (``relay.py``), so it is not sent twice.

Two lanes keep a slow webhook from holding back Kafka: ``kafka`` (one ordered stream) and
``webhook`` (sent independently, retried with backoff). A third, ``render``, holds alerts
still to be rendered (``render_relay.py``), queued when their fault was published.

An item its destination refuses for good (Kafka's producer refuses it outright, the broker
answers a permanent error, a webhook answers 4xx) is moved to the ``dead_letter`` table in
one transaction, with the error, so the items behind it go on; the table keeps the newest
``dead_letters_max`` for an operator to look at (``sqlite3 OUTBOX 'select * from
dead_letter'``). A webhook item queued for a destination that already holds
``max_pending_per_destination`` pending items goes there at once, in the transaction that
queued it; :meth:`Outbox.append` and :meth:`Outbox.complete` return those, for the caller
to report like every other dead letter (``RelayHooks.report_dead_letters``).

Thread-safe: one connection guarded by a lock; every method is a short transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KAFKA_LANE = "kafka"
WEBHOOK_LANE = "webhook"
# Pending webhook items per destination; past it a new item is dead-lettered at once (the
# default of the setting webhook_max_pending).
MAX_PENDING_PER_DESTINATION = 10_000
# Alerts to render: (template, fault) jobs the render relay turns into kafka or webhook
# items, so no template is ever rendered on the Kafka relay's thread.
RENDER_LANE = "render"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    lane TEXT NOT NULL,
    id TEXT NOT NULL UNIQUE,
    destination TEXT NOT NULL,
    key BLOB,
    value BLOB NOT NULL,
    headers TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_lane ON outbox (lane, seq);
CREATE INDEX IF NOT EXISTS outbox_destination ON outbox (lane, destination, seq);
CREATE TABLE IF NOT EXISTS received (
    id TEXT PRIMARY KEY,
    event_id TEXT NOT NULL,
    suppressed INTEGER NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letter (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    lane TEXT NOT NULL,
    id TEXT NOT NULL,
    destination TEXT NOT NULL,
    key BLOB,
    value BLOB NOT NULL,
    headers TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    failed_ms INTEGER NOT NULL,
    error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    event BLOB NOT NULL
);
"""


@dataclass(frozen=True)
class OutboxItem:
    """One message to send: ``destination`` is a Kafka topic or a webhook URL."""

    id: str
    destination: str
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    lane: str = KAFKA_LANE
    kind: str = "fault"  # "fault" or "alert": what the relay tells watchers about
    seq: int = 0  # assigned by the outbox
    created_ms: int = 0
    attempts: int = 0

    def header_pairs(self) -> list[tuple[str, str | bytes | None]]:
        return [(k, v.encode()) for k, v in self.headers]


@dataclass(frozen=True)
class DeadLetter:
    """An item moved out of the outbox because its destination refused it for good."""

    item: OutboxItem
    error: str
    failed_ms: int


@dataclass(frozen=True)
class Received:
    """A report already received: what it was answered (idempotent re-reports)."""

    event_id: str
    suppressed: bool


class Outbox:
    def __init__(
        self,
        path: Path,
        *,
        received_max: int = 100_000,
        history_max: int = 10_000,
        dead_letters_max: int = 10_000,
        max_pending_per_destination: int = MAX_PENDING_PER_DESTINATION,
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._received_max = received_max
        self._history_max = history_max
        self._dead_letters_max = dead_letters_max
        self._max_per_destination = max_pending_per_destination
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed transaction survives power loss too, not only a process crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._closed = False

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    # ---- writes ---------------------------------------------------------------------

    def append(
        self, items: Sequence[OutboxItem], *, received: tuple[str, Received] | None = None
    ) -> list[DeadLetter]:
        """Durably queue ``items`` (in this order) and remember the report they came from,
        in one transaction. Items whose id is already queued are skipped. Returns the items
        dead-lettered instead of queued (their webhook destination was full)."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            # Something to send: fsync before answering (FULL). Only the record of a
            # suppressed report: a crash of the process still keeps it (WAL), and losing it
            # to a power cut only means a re-sent duplicate gets published; skip the fsync
            # so a storm of reports costs no disk flush each.
            self._db.execute(f"PRAGMA synchronous={'FULL' if items else 'NORMAL'}")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                dead = self._insert_all(items, now_ms)
                if received is not None:
                    report_id, answer = received
                    self._db.execute(
                        "INSERT OR REPLACE INTO received (id, event_id, suppressed, at_ms) "
                        "VALUES (?, ?, ?, ?)",
                        (report_id, answer.event_id, int(answer.suppressed), now_ms),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return dead

    def remove(self, seqs: Iterable[int]) -> None:
        self.complete(seqs, ())

    def complete(self, seqs: Iterable[int], follow_ups: Sequence[OutboxItem]) -> list[DeadLetter]:
        """Forget delivered items and queue what their delivery caused (the alerts of a
        published fault) in one transaction: a crash leaves either both or neither.
        Returns the follow-ups dead-lettered instead of queued (as :meth:`append`)."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])
                dead = self._insert_all(follow_ups, now_ms)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return dead

    def _insert_all(self, items: Sequence[OutboxItem], now_ms: int) -> list[DeadLetter]:
        """Inside a transaction: queue ``items``; returns those dead-lettered instead."""
        return [dead for item in items if (dead := self._insert(item, now_ms)) is not None]

    def _insert(self, item: OutboxItem, now_ms: int) -> DeadLetter | None:
        if item.lane == WEBHOOK_LANE and self._full(item.destination):
            # Bounded (issue 37, finding 7): a destination that does not take its items
            # cannot grow the outbox; what it cannot hold is dead-lettered at once.
            why = f"outbox full for this destination ({self._max_per_destination} pending)"
            self._add_dead_letters([item], why, now_ms)
            return DeadLetter(item, why, now_ms)
        self._db.execute(
            "INSERT OR IGNORE INTO outbox (lane, id, destination, key, value, "
            "headers, kind, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            _columns(item, now_ms),
        )
        return None

    def dead_letter(self, item: OutboxItem, error: str) -> None:
        """Move ``item`` to the dead-letter table (the oldest beyond the bound are
        forgotten), in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._move_to_dead_letters([item], error)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def dead_letter_waiting(
        self,
        lane: str,
        destination: str,
        error: str,
        *,
        up_to_seq: int | None = None,
        created_before_ms: int | None = None,
        limit: int = 1000,
    ) -> list[OutboxItem]:
        """Move the items of ``destination`` queued up to ``up_to_seq`` or created before
        ``created_before_ms`` (at most ``limit``, oldest first) to the dead-letter table,
        in one transaction; returns them (with their recorded attempts)."""
        if up_to_seq is None and created_before_ms is None:
            return []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(
                    "SELECT seq, id, destination, key, value, headers, kind, created_ms, "
                    "attempts FROM outbox WHERE lane = ? AND destination = ? "
                    "AND (seq <= ? OR created_ms < ?) ORDER BY seq LIMIT ?",
                    (lane, destination, -1 if up_to_seq is None else up_to_seq,
                     -1 if created_before_ms is None else created_before_ms, limit),
                ).fetchall()  # fmt: skip
                items = _items(rows, lane)
                self._move_to_dead_letters(items, error)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return items

    def _move_to_dead_letters(self, items: list[OutboxItem], error: str) -> None:
        """Inside a transaction: ``items`` out of the outbox and into the dead-letter table
        (:meth:`_add_dead_letters`)."""
        self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(item.seq,) for item in items])
        self._add_dead_letters(items, error, int(time.time() * 1000))

    def _add_dead_letters(self, items: Sequence[OutboxItem], error: str, now_ms: int) -> None:
        """Inside a transaction: ``items`` into the dead-letter table (with their attempts),
        then the oldest dead letters beyond the bound forgotten."""
        self._db.executemany(
            "INSERT INTO dead_letter (lane, id, destination, key, value, headers, "
            "kind, created_ms, attempts, failed_ms, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*_columns(item, now_ms), item.attempts, now_ms, error) for item in items],
        )
        self._db.execute(
            "DELETE FROM dead_letter WHERE seq <= (SELECT MAX(seq) FROM dead_letter) - ?",
            (self._dead_letters_max,),
        )

    def _full(self, destination: str) -> bool:
        row = self._db.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE lane = ? AND destination = ? "
            "LIMIT ?)",
            (WEBHOOK_LANE, destination, self._max_per_destination),
        ).fetchone()
        return int(row[0]) >= self._max_per_destination

    def record_attempt(self, seq: int) -> None:
        with self._lock:
            self._db.execute("UPDATE outbox SET attempts = attempts + 1 WHERE seq = ?", (seq,))

    def add_history(self, events: Sequence[tuple[str, bytes]]) -> None:
        """Published fault events (id, serialized), kept for ListFaults across restarts."""
        if not events:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany("INSERT OR IGNORE INTO history (id, event) VALUES (?, ?)", events)
            self._db.execute(
                "DELETE FROM history WHERE seq <= (SELECT MAX(seq) FROM history) - ?",
                (self._history_max,),
            )
            self._db.execute("COMMIT")

    def prune_received(self) -> int:
        """Forget the oldest received-report records beyond the bound."""
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM received WHERE id IN (SELECT id FROM received ORDER BY at_ms DESC "
                "LIMIT -1 OFFSET ?)",
                (self._received_max,),
            )
            return int(cursor.rowcount)

    # ---- reads ----------------------------------------------------------------------

    def pending(self, lane: str, limit: int, after_seq: int = 0) -> list[OutboxItem]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, id, destination, key, value, headers, kind, created_ms, attempts "
                "FROM outbox WHERE lane = ? AND seq > ? ORDER BY seq LIMIT ?",
                (lane, after_seq, limit),
            ).fetchall()
        return _items(rows, lane)

    def heads(self, lane: str, limit: int) -> list[OutboxItem]:
        """The oldest pending item of each destination (at most ``limit``, oldest first):
        what a relay that keeps each destination's order may send next."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, id, destination, key, value, headers, kind, created_ms, attempts "
                "FROM outbox WHERE seq IN (SELECT MIN(seq) FROM outbox WHERE lane = ? "
                "GROUP BY destination) ORDER BY seq LIMIT ?",
                (lane, limit),
            ).fetchall()
        return _items(rows, lane)

    def last_seq(self) -> int:
        """The seq of the last item queued (0 if none yet): what was queued before now."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = 'outbox'"
            ).fetchone()
        return 0 if row is None else int(row[0])

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """The newest ``limit`` dead letters, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, id, destination, key, value, headers, kind, created_ms, attempts, "
                "lane, failed_ms, error FROM dead_letter ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            DeadLetter(
                item=OutboxItem(
                    id=row[1],
                    destination=row[2],
                    key=row[3],
                    value=row[4],
                    headers=tuple((str(k), str(v)) for k, v in json.loads(row[5])),
                    lane=row[9],
                    kind=row[6],
                    seq=row[0],
                    created_ms=row[7],
                    attempts=row[8],
                ),
                error=row[11],
                failed_ms=row[10],
            )
            for row in reversed(rows)
        ]

    def count(self, lane: str) -> int:
        with self._lock:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM outbox WHERE lane = ?", (lane,)
            ).fetchone()
        return int(n)

    def received(self, report_id: str) -> Received | None:
        with self._lock:
            row = self._db.execute(
                "SELECT event_id, suppressed FROM received WHERE id = ?", (report_id,)
            ).fetchone()
        return None if row is None else Received(row[0], bool(row[1]))

    def history(self, limit: int) -> list[bytes]:
        """The last ``limit`` published events, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT event FROM history ORDER BY seq DESC LIMIT ?", (limit,)
            ).fetchall()
        return [row[0] for row in reversed(rows)]


def moved_together(letters: Sequence[DeadLetter]) -> list[tuple[list[OutboxItem], str]]:
    """``letters`` (in order) as the runs of one destination and one error: what a
    ``RelayHooks.dead_letter`` call is told of (one DEAD_LETTER, with a count, per run)."""
    runs: list[tuple[list[OutboxItem], str]] = []
    for letter in letters:
        run = runs[-1] if runs else None
        if run and run[1] == letter.error and run[0][-1].destination == letter.item.destination:
            run[0].append(letter.item)
        else:
            runs.append(([letter.item], letter.error))
    return runs


def _items(rows: Sequence[Any], lane: str) -> list[OutboxItem]:
    return [
        OutboxItem(
            id=row[1],
            destination=row[2],
            key=row[3],
            value=row[4],
            headers=tuple((str(k), str(v)) for k, v in json.loads(row[5])),
            lane=lane,
            kind=row[6],
            seq=row[0],
            created_ms=row[7],
            attempts=row[8],
        )
        for row in rows
    ]


def _columns(item: OutboxItem, now_ms: int) -> tuple[object, ...]:
    """An item's columns shared by the outbox and dead-letter tables, in their order
    (lane, id, destination, key, value, headers, kind, created_ms)."""
    return (
        item.lane,
        item.id,
        item.destination,
        item.key,
        item.value,
        json.dumps(list(item.headers)),
        item.kind,
        item.created_ms or now_ms,
    )
