"""A sidecar nobody reads from parks its fetch loop, and a reader finds every record (issue 34
item 3, "no work while idle").

With no Stream open and no Fetch for a few seconds, the fetch loop waits on its wake-up event
instead of in ``poll()`` (``poll_timing.park_seconds``): it polls without waiting every half
second for what librdkafka fetched meanwhile, where a quiet loop polled on a 0.2 s timeout.
A reader (a Fetch, a Stream opened) wakes it at once. Real Kafka, an assigner and one sidecar:

* the loop's cadence, from the sidecar's own metrics (``ds_sidecar_poll_interval_seconds``):
  parked, its polls are at least PARK_SECONDS apart on average (the quiet loop's were 0.2 s;
  a loaded machine only spaces them further), and waiting on the event counts as the poll's
  wait (``ds_sidecar_poll_wait_seconds_total`` keeps its meaning: the loop waited);
* records written while it is parked are all read by a Fetch that comes later, and records
  written while a reader reads come as they are written (no record lost, none twice).
"""

from __future__ import annotations

import time

import pytest

from dsclient import DsClient
from services.consumer_sidecar.poll_timing import PARK_SECONDS, QUIET_SECONDS
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.notifier import metric_value
from tests.support.ops import metrics
from tests.support.records import SeqProducer, seq_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PARTITIONS = 2
WINDOW_SECONDS = 4.0


def poll_figures(sidecar: ServiceProcess, group: str) -> tuple[float, float, float]:
    """The fetch loop's polls so far: how many, the seconds between them, the seconds waited."""
    text = metrics(sidecar)
    count = metric_value(text, "ds_sidecar_poll_interval_seconds_count", group=group)
    between = metric_value(text, "ds_sidecar_poll_interval_seconds_sum", group=group)
    waited = metric_value(text, "ds_sidecar_poll_wait_seconds_total", group=group)
    assert count is not None and between is not None and waited is not None, text[:2000]
    return count, between, waited


def test_a_sidecar_nobody_reads_from_parks_and_a_later_fetch_reads_every_record(
    mesh: Mesh, topic_factory: object
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, "park-1")
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["park-1"], PARTITIONS)
    # Nobody has read yet: once the grants' commands are a second old, the loop parks.
    time.sleep(QUIET_SECONDS / 2)
    before = poll_figures(sidecar, group)
    time.sleep(WINDOW_SECONDS)
    after = poll_figures(sidecar, group)
    polls = after[0] - before[0]
    assert polls > 0, "the parked loop still looks at Kafka"
    mean_gap = (after[1] - before[1]) / polls
    waited_share = (after[2] - before[2]) / (after[1] - before[1])
    print(
        f"parked: {polls:.0f} polls in {WINDOW_SECONDS:.0f} s, {mean_gap:.2f} s apart on "
        f"average; {waited_share:.0%} of the time between them waiting"
    )
    assert mean_gap >= PARK_SECONDS * 0.9, f"{polls:.0f} polls, {mean_gap:.3f} s apart: not parked"
    assert waited_share > 0.5  # the park is the loop's wait, as a poll()'s was

    producer = SeqProducer(mesh.bootstrap, topic, PARTITIONS, rate=200.0).start()
    time.sleep(2.0)  # written while parked: librdkafka fetches them, nobody reads
    seqs: list[int] = []
    confirmed: set[int] = set()
    try:
        with DsClient(group, client_id="park-app", assigner=assigner.grpc_addr) as client:

            def read_some() -> None:
                batch = client.fetch(500, max_wait=1.0)
                if batch:
                    client.ack(batch)
                    seqs.extend(seq_of(record) for record in batch)

            deadline = time.monotonic() + 60
            while producer.sent < 1_000 and time.monotonic() < deadline:
                read_some()  # and written while a reader reads
            confirmed = producer.stop()
            deadline = time.monotonic() + 60
            while not confirmed <= set(seqs) and time.monotonic() < deadline:
                read_some()
    finally:
        producer.stop()
    print(f"{len(confirmed)} written, {len(seqs)} read, {len(set(seqs))} distinct")
    assert confirmed, "nothing was written"
    assert not confirmed - set(seqs), f"lost: {sorted(confirmed - set(seqs))[:10]}"
    assert len(seqs) == len(set(seqs)), "a record came twice without a failure to explain it"
