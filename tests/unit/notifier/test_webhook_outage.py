"""A webhook destination down for 10 minutes, simulated (issue 37 acceptance): the relay's
rounds driven by a simulated clock against a real outbox (SQLite), the failing URL's POST
answering 503, the healthy one's 204. The failing destination's items must be
dead-lettered once its retry budget is spent, not one item per 12 attempts: the relay used
to count the budget per item and try only the oldest item of a failing URL once a minute,
so a real 10-minute outage at 2 events/s dead-lettered 1 item and left 1,199 pending.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from services.notifier import relay as relay_module
from services.notifier.egress import EgressPolicy
from services.notifier.outbox import WEBHOOK_LANE, Outbox, OutboxItem
from services.notifier.relay import RelayHooks, WebhookRelay

DOWN, UP = "http://down.example/hook", "http://up.example/hook"
RATE = 2  # items per second to each destination
STEP = 2.0  # seconds of simulated time between relay wake-ups
MAX_BACKOFF = 60.0
ATTEMPTS = 12


class SimClock:
    """Stands in for the ``time`` module the relay reads (monotonic and wall clock)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_790_000_000.0 + self.now


class Sim:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = SimClock()
        monkeypatch.setattr(relay_module, "time", self.clock)
        self.outbox = Outbox(tmp_path / "outbox.db")
        self.down = True
        self.posts: dict[str, list[str]] = {DOWN: [], UP: []}
        self.delivered: list[str] = []
        self.dead: list[tuple[str, str]] = []
        hooks = RelayHooks(
            delivered=lambda items: self._delivered(items),
            dead_letter=lambda items, why: self.dead.extend((i.id, why) for i in items),
            reconciled=lambda _n: None,
        )
        self.relay = WebhookRelay(
            self.outbox, hooks=hooks, egress=EgressPolicy(["*.example"]),
            max_backoff=MAX_BACKOFF, max_attempts=ATTEMPTS,
        )  # fmt: skip
        self.relay._post = self._post  # type: ignore[method-assign]
        self.n = 0

    def _delivered(self, items: object) -> list[OutboxItem]:
        self.delivered.extend(item.id for item in items)  # type: ignore[attr-defined]
        return []

    def _post(self, item: OutboxItem) -> str | None:
        self.posts[item.destination].append(item.id)
        return "HTTP 503" if item.destination == DOWN and self.down else None

    def run(self, seconds: float) -> None:
        """``seconds`` of simulated time: RATE items to each URL a second, queued each STEP,
        then rounds while they send (as the relay's thread does)."""
        for _ in range(int(seconds / STEP)):
            self.clock.now += STEP
            self.outbox.append(
                [self.item(url) for _ in range(int(RATE * STEP)) for url in (DOWN, UP)]
            )
            while self.relay._round():
                pass

    def item(self, url: str) -> OutboxItem:
        self.n += 1
        name = "down" if url == DOWN else "up"
        return OutboxItem(
            id=f"{name}-{self.n:06d}", destination=url, value=b"x", lane=WEBHOOK_LANE,
            kind="alert", created_ms=int(self.clock.time() * 1000),
        )  # fmt: skip

    def pending(self, url: str) -> list[str]:
        return [i.id for i in self.outbox.pending(WEBHOOK_LANE, 100_000) if i.destination == url]


def test_a_destination_down_for_10_minutes_has_its_items_dead_lettered_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = Sim(tmp_path, monkeypatch)
    sim.run(600)
    queued = 600 * RATE
    pending = sim.pending(DOWN)
    print(
        f"10 min down: {len(sim.posts[DOWN])} POSTs to it, {len(sim.dead)} dead-lettered, "
        f"{len(pending)} pending; healthy: {len(sim.delivered)} delivered"
    )
    # The healthy destination: every item, in order, in its own round.
    assert sim.delivered == [f"up-{i:06d}" for i in range(2, 2 * queued + 1, 2)]
    # The failing one: never hammered (backoff to 60 s) ...
    assert len(sim.posts[DOWN]) <= ATTEMPTS + 600 / MAX_BACKOFF + 1
    # ... and, its budget spent, what waits for it is dead-lettered: at most the items
    # queued since its last failed attempt are pending, nothing is lost.
    assert len(pending) <= RATE * (MAX_BACKOFF + 2 * STEP), len(pending)
    assert len(sim.dead) + len(pending) == queued
    assert all("retry budget" in why for _id, why in sim.dead)
    sim.outbox.close()


def test_when_the_destination_recovers_its_items_deliver_normally_with_a_fresh_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = Sim(tmp_path, monkeypatch)
    sim.run(400)  # past the budget (about 304 s)
    dead_in_outage = len(sim.dead)
    waiting = sim.pending(DOWN)
    assert dead_in_outage > 0
    sim.down = False
    sim.run(120)  # the next attempt (within 60 s) succeeds: what waits goes, in order
    delivered_down = [i for i in sim.delivered if i.startswith("down-")]
    print(
        f"recovered: {len(waiting)} waiting delivered first, {len(delivered_down)} in all, "
        f"{len(sim.dead)} dead-lettered (in the outage {dead_in_outage})"
    )
    assert delivered_down[: len(waiting)] == waiting
    assert delivered_down == sorted(delivered_down)
    assert len(sim.dead) == dead_in_outage and not sim.pending(DOWN)
    # A new failure starts a fresh run: one failed attempt dead-letters nothing.
    sim.down = True
    sim.run(10)
    assert len(sim.dead) == dead_in_outage and sim.pending(DOWN)
    sim.outbox.close()


def test_after_a_restart_a_failing_destination_resumes_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run of failures is in memory; a new relay resumes it from the oldest item's
    recorded attempts, so restarting the notifier does not give a dead URL a fresh budget."""
    sim = Sim(tmp_path, monkeypatch)
    sim.run(200)  # 10 failed attempts in a row, not yet the budget
    assert not sim.dead
    head = sim.outbox.heads(WEBHOOK_LANE, 10)
    recorded = {i.destination: i.attempts for i in head}[DOWN]
    restarted = WebhookRelay(
        sim.outbox, hooks=sim.relay._hooks, egress=EgressPolicy(["*.example"]),
        max_backoff=MAX_BACKOFF, max_attempts=ATTEMPTS,
    )  # fmt: skip
    restarted._post = sim._post  # type: ignore[method-assign]
    sim.relay = restarted
    sim.run(2 * STEP)  # tried at once, fails: recorded + 1
    print("restarted with", recorded, "recorded attempts;", len(sim.dead), "dead-lettered")
    if recorded + 1 >= ATTEMPTS:
        assert sim.dead
    sim.run(150)  # at most 2 more attempts (60 s apart): the budget is spent
    assert sim.dead and all("retry budget" in why for _id, why in sim.dead)
    assert len(sim.pending(DOWN)) <= RATE * (MAX_BACKOFF + 2 * STEP)
    sim.outbox.close()


def test_items_past_the_max_age_are_dead_lettered_when_a_destination_fails_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL that fails every other attempt never spends its budget (12 in a row), and it
    takes one item a round while 4 arrive: its backlog grows; a failed attempt dead-letters
    what waited longer than max_age."""
    sim = Sim(tmp_path, monkeypatch)
    sim.relay._budget = dataclasses.replace(sim.relay._budget, max_age_seconds=60.0)
    flips = iter(range(10**9))
    sim.relay._post = lambda item: (  # type: ignore[method-assign]
        sim.posts[item.destination].append(item.id)
        or ("HTTP 503" if item.destination == DOWN and next(flips) % 2 else None)
    )
    sim.run(300)
    pending = sim.outbox.pending(WEBHOOK_LANE, 100_000)
    oldest_ms = min(i.created_ms for i in pending if i.destination == DOWN)
    print(f"flapping: {len(sim.dead)} dead-lettered, {len(pending)} pending")
    assert sim.dead and all("webhook_max_age_seconds" in why for _id, why in sim.dead)
    # Nothing waits much longer than max age plus the gap between two attempts.
    assert sim.clock.time() * 1000 - oldest_ms <= (60.0 + MAX_BACKOFF + 2 * STEP) * 1000
    sim.outbox.close()
