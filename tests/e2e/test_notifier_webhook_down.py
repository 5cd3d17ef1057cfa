"""Issue 37 acceptance on the real stack: one webhook destination down for a long time.

A real notifier on the shared Kafka with two alert templates, each to its own local HTTP
server: ``healthy`` answers 204 and records when each alert arrived; ``down`` answers 200
during a short baseline window, then 503 to everything for the outage. Fault events are
reported steadily (2/s) through the real ReportFault RPC, each for a group of its own (no
storm suppression, no send-interval hold-back), so every event is one alert per template.

At the end it prints, and asserts what is robust on a loaded machine:

* every event reached the healthy destination exactly once (count), with its delivery
  latency (report -> receipt) p50/p99/max in the baseline window and during the outage,
  printed side by side; asserted only that no outage alert waited as long as the relay's
  longest per-URL backoff (``max_backoff``, 60 s), i.e. the healthy URL never queued behind
  the failing one's backoff;
* the failing destination's items, from the notifier's own outbox database and its
  ``ds_notifier_outbox_dead_letters_total`` metric: the retry budget is the destination's
  (``services/notifier/webhook_budget.py``): once it failed ``webhook_max_attempts``
  attempts in a row (default 12, about 5 min with the backoff of 0.5 s doubling to 60 s;
  4 in the CI variant, 3.5 s), everything waiting for it is dead-lettered with "retry
  budget spent", and again after each later failed attempt. Asserted: nothing lost
  (pending + dead-lettered = the outage's items), the dead-lettered are the oldest, and
  what is still pending is at most what was queued since the last failed attempt: under
  half the outage's items (the backoff doubles) and under ``max_backoff``'s worth;
* the outbox depth (``ds_notifier_outbox_pending{lane="webhook"}`` sampled every second),
  whose max is printed and asserted under the per-destination bound (10 000 pending).

A second, short test fills a failing URL's bound of pending items (``webhook_max_pending``)
and checks that what is dead-lettered past it is counted, raised as DEAD_LETTER and kept
within ``dead_letters_max`` like every other dead letter.

The default (5 s baseline, 20 s outage) runs in CI; the 10-minute variant is ``long``
(run it by hand: ``pytest -q -s -p no:cacheprovider -m long`` and this file);
its output is in docs/operate/faults.md.
"""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2
from services.devstack.kafka import delete_topic
from services.notifier.outbox import MAX_PENDING_PER_DESTINATION, WEBHOOK_LANE
from services.notifier.pipeline import OUTBOX_GAUGE_SECONDS
from services.notifier.webhook_budget import MAX_WEBHOOK_ATTEMPTS, Budget
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.notifier import (
    fault,
    metric_value,
    notifier_config,
    notifier_stub,
    start_notifier,
)
from tests.support.ops import metrics
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import Receiver

RATE = 2.0  # events reported per second
MAX_BACKOFF = 60.0  # WebhookRelay's default max_backoff


def put_webhook_template(stub: Any, caller: str, name: str, url: str) -> None:
    """An alert template of ``caller`` posting COMMIT_FAILED faults to ``url``."""
    template = notifier_pb2.AlertTemplate(
        caller=caller,
        name=name,
        fault_types=[common_pb2.FAULT_TYPE_COMMIT_FAILED],
        open_template="{{ group }}",
    )
    template.webhook.url = url
    stub.PutAlertTemplate(
        notifier_pb2.PutAlertTemplateRequest(template=template, request_id=str(uuid.uuid4())),
        timeout=30,
    )


def budget_seconds(attempts: int) -> float:
    """When a URL failing from the start has spent its budget: the waits between its
    attempts (0.5 s doubling, capped at MAX_BACKOFF)."""
    return Budget(max_attempts=attempts, max_backoff=MAX_BACKOFF).span_seconds()


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    healthy, down = Receiver(204), Receiver(200)
    try:
        yield healthy, down
    finally:
        healthy.close()
        down.close()


def quantiles(latencies: list[float]) -> str:
    if not latencies:
        return "n=0"
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"n={len(ordered)} p50={statistics.median(ordered):.3f}s p99={p99:.3f}s "
        f"max={ordered[-1]:.3f}s"
    )


def outbox_view(path: Path, url: str) -> tuple[list[int], list[tuple[int, str, int]]]:
    """The notifier's own outbox (read-only, WAL): the creation times (ms) of ``url``'s
    pending items, and its dead letters as (attempts, error, creation time)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        pending = db.execute(
            "SELECT created_ms FROM outbox WHERE lane = ? AND destination = ? ORDER BY seq",
            (WEBHOOK_LANE, url),
        ).fetchall()
        dead = db.execute(
            "SELECT attempts, error, created_ms FROM dead_letter WHERE destination = ? "
            "ORDER BY seq",
            (url,),
        ).fetchall()
    finally:
        db.close()
    return [int(c) for (c,) in pending], [(int(a), str(e), int(c)) for a, e, c in dead]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    ("baseline", "outage", "attempts"),
    [
        # A budget of 4 attempts (3.5 s) so that CI sees it spent.
        pytest.param(5.0, 20.0, 4, id="20s", marks=pytest.mark.timeout(240)),
        pytest.param(
            8.0,
            600.0,
            MAX_WEBHOOK_ATTEMPTS,
            id="10min",
            marks=[pytest.mark.long, pytest.mark.timeout(1200)],
        ),
    ],
)
def test_a_webhook_down_delays_no_other_and_is_dead_lettered_past_its_budget(
    mesh: Mesh,
    tmp_path: Path,
    receivers: tuple[Receiver, Receiver],
    baseline: float,
    outage: float,
    attempts: int,
) -> None:
    healthy, down = receivers
    outbox = tmp_path / "outbox.sqlite"
    run = uuid.uuid4().hex[:8]
    # Templates of its own: on the shared broker another run's notifier would otherwise
    # load this run's templates (and this one theirs) from the default topic.
    templates_topic = f"ds.alert_templates.hookdown-{run}"
    config = notifier_config(
        tmp_path / "notifier.yaml",
        alerts={"webhook_egress": ["127.0.0.1"]},
        suppression_window_seconds={"*": 0},
        templates_topic=templates_topic,
        webhook_max_attempts=attempts,
    )
    notifier = start_notifier(mesh, outbox, config)
    notifier.wait_serving(90)
    try:
        scenario(notifier, outbox, run, healthy, down, baseline, outage, attempts)
    finally:
        delete_topic(mesh.bootstrap, templates_topic)


def scenario(
    notifier: ServiceProcess,
    outbox: Path,
    run: str,
    healthy: Receiver,
    down: Receiver,
    baseline: float,
    outage: float,
    attempts: int,
) -> None:
    budget = budget_seconds(attempts)
    with notifier_stub(notifier.grpc_addr) as stub:
        for name, receiver in (("healthy", healthy), ("down", down)):
            put_webhook_template(stub, f"hookdown-{run}", name, receiver.url)

        depth: list[float] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(1.0):
                try:
                    text = metrics(notifier)
                except OSError:
                    continue
                value = metric_value(text, "ds_notifier_outbox_pending", lane=WEBHOOK_LANE)
                if value is not None:
                    depth.append(value)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        sent: dict[str, tuple[float, bool]] = {}  # group -> (reported at, during the outage)
        start = time.monotonic()
        outage_from = start + baseline
        end = outage_from + outage
        i = 0
        while (now := time.monotonic()) < end:
            if now >= outage_from and down.status != 503:
                down.status = 503
            group = f"hookdown-{run}-{i:06d}"
            at = time.monotonic()
            stub.ReportFault(
                notifier_pb2.ReportFaultRequest(
                    event=fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, group, message=str(i))
                ),
                timeout=30,
            )
            sent[group] = (at, at >= outage_from)
            i += 1
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))

    def all_arrived() -> bool:
        return {g for g, _at, _id in healthy.received} >= set(sent)

    wait_for(all_arrived, 120, "every alert at the healthy webhook")
    time.sleep(OUTBOX_GAUGE_SECONDS + 1)  # a refresh of the outbox gauge after the last report
    sampling.set()
    sampler.join(10)
    text = metrics(notifier)
    dead_metric = metric_value(text, "ds_notifier_outbox_dead_letters_total", kind="alert")
    dead_faults = metric_value(
        text, "ds_notifier_faults_published_total", type="DEAD_LETTER", state="OPEN"
    )
    pending_down_at, dead_down = outbox_view(outbox, down.url)
    pending_healthy_at, dead_healthy = outbox_view(outbox, healthy.url)
    pending_down, pending_healthy = len(pending_down_at), len(pending_healthy_at)

    latency = {False: [], True: []}  # type: dict[bool, list[float]]
    for group, received_at, _id in healthy.received:
        if group in sent:
            reported_at, in_outage = sent[group]
            latency[in_outage].append(received_at - reported_at)
    ids = [i for _g, _at, i in healthy.received]
    baseline_down = sum(1 for g, _at, _i in down.received if g in sent and not sent[g][1])
    outage_events = sum(1 for _at, o in sent.values() if o)
    budget_spent = [e for _a, e, _c in dead_down if "retry budget spent" in e]
    bulks = sorted({e for e in budget_spent}, key=budget_spent.index)
    print(
        f"\nwebhook down for {outage:.0f}s after a {baseline:.0f}s baseline, "
        f"{RATE:.0f} events/s: {len(sent)} events ({outage_events} during the outage)\n"
        f"healthy: {len(healthy.received)} alerts received, {len(set(ids))} distinct ids, "
        f"{pending_healthy} pending, {len(dead_healthy)} dead-lettered\n"
        f"  latency baseline: {quantiles(latency[False])}\n"
        f"  latency outage:   {quantiles(latency[True])}\n"
        f"down: {baseline_down} alerts received in the baseline, {down.refused} POSTs "
        f"answered 503 in the outage; {len(dead_down)} dead-lettered "
        f"({len(budget_spent)} retry budget spent, budget {attempts} attempts "
        f"~{budget:.0f}s), {pending_down} pending\n"
        f"  dead-lettered in {len(bulks)} bulk moves: "
        f"{[(budget_spent.count(e), e[:110]) for e in bulks[:3]]}"
        f"{' ...' if len(bulks) > 3 else ''}\n"
        f"ds_notifier_outbox_dead_letters_total{{kind=alert}}={dead_metric}, "
        f"DEAD_LETTER faults published: {dead_faults}\n"
        f"outbox webhook lane depth: {len(depth)} samples, max {max(depth, default=0):.0f}, "
        f"last {depth[-1] if depth else None}"
    )

    # The healthy destination: every event, once, none held behind the failing URL.
    assert len(healthy.received) == len(sent) == len(set(ids))
    assert pending_healthy == 0 and not dead_healthy
    assert max(latency[True]) < MAX_BACKOFF, quantiles(latency[True])
    # The failing destination: everything is accounted for, in the outbox or dead-lettered;
    # past the destination's budget its items are dead-lettered for that reason, not
    # before, the oldest first.
    assert baseline_down == len(sent) - outage_events
    assert pending_down + len(dead_down) == outage_events
    assert down.refused >= 2
    assert len(budget_spent) == len(dead_down)
    assert (dead_metric or 0) == len(dead_down)
    if dead_down and pending_down_at:
        assert max(c for _a, _e, c in dead_down) <= min(pending_down_at)
    if outage > budget + 10:
        assert budget_spent, "nothing dead-lettered past the retry budget"
        assert down.refused >= attempts
        # Pending: at most what was queued since the last failed attempt; the backoff
        # doubles (so that is under half the outage), capped at MAX_BACKOFF.
        assert pending_down <= min(outage_events / 2, RATE * (MAX_BACKOFF + 10)), pending_down
        # One DEAD_LETTER fault per bulk move, not one per item.
        assert (dead_faults or 0) <= len(bulks) * (1 + len(dead_down) // 1000)
    elif outage < budget:
        assert not dead_down
    # Bounded: the lane never held more than the failing URL's bound (+ the healthy URL's
    # in-flight items).
    assert depth, "no ds_notifier_outbox_pending sample"
    assert max(depth) <= MAX_PENDING_PER_DESTINATION + RATE * 10


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_alerts_past_a_full_destination_are_dead_lettered_counted_and_bounded(
    mesh: Mesh, tmp_path: Path
) -> None:
    """A URL answering 503 with a budget it does not spend here and room for 5 pending
    items: of 12 alerts, 7 are dead-lettered at once ("outbox full for this destination"),
    counted in the metric and raised as DEAD_LETTER like any other dead letter, and the
    dead-letter table keeps only its newest ``dead_letters_max`` (4). Before the fix the
    7 were written to the table silently (metric absent, no DEAD_LETTER), past its bound."""
    down: Receiver[tuple[str, float, str]] = Receiver(503)
    outbox = tmp_path / "outbox.sqlite"
    run = uuid.uuid4().hex[:8]
    templates_topic = f"ds.alert_templates.hookfull-{run}"
    config = notifier_config(
        tmp_path / "notifier.yaml",
        alerts={"webhook_egress": ["127.0.0.1"]},
        suppression_window_seconds={"*": 0},
        templates_topic=templates_topic,
        webhook_max_attempts=1000,
        webhook_max_pending=5,
        dead_letters_max=4,
    )
    notifier = start_notifier(mesh, outbox, config)
    try:
        notifier.wait_serving(90)
        with notifier_stub(notifier.grpc_addr) as stub:
            put_webhook_template(stub, f"hookfull-{run}", "down", down.url)
            for i in range(12):
                event = fault(common_pb2.FAULT_TYPE_COMMIT_FAILED, f"hookfull-{run}-{i:02d}")
                stub.ReportFault(notifier_pb2.ReportFaultRequest(event=event), timeout=30)

        def counted(name: str, **labels: str) -> float:
            return metric_value(metrics(notifier), name, **labels) or 0

        dead_letters = "ds_notifier_outbox_dead_letters_total"
        published = "ds_notifier_faults_published_total"
        faults_open = {"type": "DEAD_LETTER", "state": "OPEN"}
        wait_for(
            lambda: counted(dead_letters, kind="alert") >= 7,
            120,
            "7 alerts dead-lettered for a full outbox, counted",
        )
        wait_for(
            lambda: counted(published, **faults_open) >= 1,
            60,
            "a DEAD_LETTER fault published",
        )
        dead_faults = counted(published, **faults_open)
        dead_metric = counted(dead_letters, kind="alert")
        pending, dead = outbox_view(outbox, down.url)
        print(
            f"\nfull destination: {down.refused} POSTs answered 503, {len(pending)} pending, "
            f"ds_notifier_outbox_dead_letters_total{{kind=alert}}={dead_metric}, "
            f"DEAD_LETTER faults published: {dead_faults}, dead-letter table: "
            f"{[(e, a) for a, e, _c in dead]}"
        )
        assert len(pending) == 5
        assert dead_metric == 7
        assert 1 <= dead_faults <= 7  # one per render round's bulk, not necessarily one
        assert [e for _a, e, _c in dead] == ["outbox full for this destination (5 pending)"] * 4
    finally:
        down.close()
        delete_topic(mesh.bootstrap, templates_topic)
