"""Acks carried by the next Fetch (``FetchRequest.ack_ranges``, issue 34) on a real sidecar
and a real Kafka broker, at the low rates services run (about 100 records/s).

* A raw fetch loop that carries each batch's range acks in its next Fetch: every record
  exactly once, every carried ack applied (``acks.applied_seq``) and answered exactly once,
  in that response or a later one (``acks.answers``), all accepted, and the group's
  committed offsets reach the end offsets (the last acks carried by a Fetch with no wait).
* A carried ack of a stale lease epoch is refused in its answer (the call succeeds and
  still delivers); a malformed one fails the call with INVALID_ARGUMENT and takes nothing
  (the records come to the next Fetch).
* ``DsClient.fetch`` + ``ack_nowait``: every record exactly once, every future says its batch
  was accepted, the committed offsets reach the end offsets, and most acks rode in fetches
  (counted: Ack calls against batches).
* The same over two sidecars, one killed (kill -9) mid-run while fetches carry acks to it:
  every record arrives; those that come twice are all of partitions the killed sidecar
  held (delivered or acked and not committed before it died: at least once), and the
  committed offsets reach the end offsets.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import DsClient
from tests.support.mesh import Mesh
from tests.support.sidecar_rpcs import PARTITIONS, assigner_of, failing, held_epochs, start
from tests.support.trickle import RECORDS, settled, trickle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def wait_of(seconds: float) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def range_acks(records: Any) -> list[stream_pb2.RangeAck]:
    """One range ack per partition run of ``records`` (offsets consecutive per partition)."""
    runs: dict[tuple[str, int, int], list[int]] = {}
    for r in records:
        runs.setdefault((r.topic, r.partition, r.lease_epoch), []).append(r.offset)
    return [
        stream_pb2.RangeAck(
            topic=t, partition=p, lease_epoch=e, from_offset=min(o), to_offset=max(o) + 1
        )
        for (t, p, e), o in runs.items()
    ]


def test_a_fetch_loop_carrying_its_acks_reads_every_record_once_and_commits_them(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group, sidecar = start(mesh, topic)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        held_epochs(stub)
        producer = trickle(mesh.bootstrap, topic)
        seen: set[tuple[int, int]] = set()
        carried: list[stream_pb2.RangeAck] = []
        answers: dict[int, stream_pb2.StreamAckResult] = {}
        seq = 0
        deadline = time.monotonic() + 120

        def fetch(wait: float, acks: list[stream_pb2.RangeAck]) -> stream_pb2.FetchResponse:
            nonlocal seq
            seq += 1 if acks else 0
            request = stream_pb2.FetchRequest(
                client_id="carry-app", group=group, max_records=1000, max_wait=wait_of(wait),
                ack_ranges=acks, ack_seq=seq if acks else 0,
            )  # fmt: skip
            response = stub.Fetch(request, timeout=10)
            assert response.acks.applied_seq == (seq if acks else 0)
            for answer in response.acks.answers:
                assert answer.seq not in answers, "an answer came twice"
                answers[answer.seq] = answer.result
            return response

        while len(seen) < RECORDS and time.monotonic() < deadline:
            response = fetch(1.0, carried)
            fresh = {(r.partition, r.offset) for r in response.records}
            assert len(fresh) == len(response.records) and not fresh & seen, "a record twice"
            seen |= fresh
            carried = range_acks(response.records)
        # The last batch's acks, carried by a fetch that does not wait; their answer comes
        # with that response or a later one.
        assert not fetch(0, carried).records
        while len(answers) < seq and time.monotonic() < deadline:
            assert not fetch(0.1, []).records
        producer.join()

    assert len(seen) == RECORDS
    assert sorted(answers) == list(range(1, seq + 1)), "every carried ack answered once"
    results = list(answers.values())
    assert not any(a.rejected_ranges or a.rejected_acks for a in results), results
    print(f"fetches with acks carried: {seq}, ranges accepted "
          f"{sum(a.acked_count for a in results)}")  # fmt: skip
    committed, ends = settled(mesh.bootstrap, group, topic)
    assert committed == ends, f"committed {committed} != end offsets {ends}"


def test_a_stale_carried_ack_is_refused_in_the_answer_and_a_malformed_one_takes_nothing(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group, sidecar = start(mesh, topic)
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        epochs = held_epochs(stub)
        producer = trickle(mesh.bootstrap, topic)
        producer.join()

        def fetch(acks: list[stream_pb2.RangeAck], seq: int = 0) -> stream_pb2.FetchResponse:
            request = stream_pb2.FetchRequest(
                client_id="carry-bad", group=group, max_records=5, max_wait=wait_of(5),
                ack_ranges=acks, ack_seq=seq,
            )  # fmt: skip
            return stub.Fetch(request, timeout=10)

        first = fetch([])
        assert first.records
        r = first.records[0]
        stale = stream_pb2.RangeAck(
            topic=topic, partition=r.partition, lease_epoch=epochs[r.partition] - 1,
            from_offset=r.offset, to_offset=r.offset + 1,
        )  # fmt: skip
        second = fetch([stale], seq=1)
        assert second.records, "a refused carried ack does not stop the fetch"
        assert second.acks.applied_seq == 1
        answers = list(second.acks.answers)
        delivered = {(x.partition, x.offset) for x in (*first.records, *second.records)}
        while not answers:
            later = fetch([])
            delivered |= {(x.partition, x.offset) for x in later.records}
            answers = list(later.acks.answers)
        assert [a.seq for a in answers] == [1]
        assert answers[0].result.acked_count == 0
        assert [x.reason for x in answers[0].result.rejected_ranges] == [
            stream_pb2.REJECT_REASON_STALE_EPOCH
        ]
        malformed = stream_pb2.RangeAck(
            topic=topic, partition=r.partition, lease_epoch=epochs[r.partition],
            from_offset=r.offset + 1, to_offset=r.offset,
        )  # fmt: skip
        code, reason, metadata = failing(lambda: fetch([malformed], seq=2))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
        assert metadata["field"].startswith("ack_ranges"), metadata
        # Nothing was taken by the refused call: the records come to the next one.
        third = fetch([])
        assert third.records
        assert not {(x.partition, x.offset) for x in third.records} & delivered


def test_dsclient_fetch_with_ack_nowait_carries_its_acks_and_commits_every_record(
    mesh: Mesh, topic_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group, _sidecar = start(mesh, topic)
    ack_calls = 0
    real_ack_rpc = DsClient._ack_rpc

    def counting_ack_rpc(self: DsClient, *args: Any) -> list[bool]:
        nonlocal ack_calls
        ack_calls += 1
        return real_ack_rpc(self, *args)

    monkeypatch.setattr(DsClient, "_ack_rpc", counting_ack_rpc)
    producer = trickle(mesh.bootstrap, topic)
    received: dict[int, list[int]] = defaultdict(list)
    futures: list[tuple[Future[int], int]] = []
    client = DsClient(group, client_id="carry-nowait", assigner=assigner_of(mesh))
    watchdog = threading.Timer(120, client.close)
    watchdog.start()
    try:
        while sum(map(len, received.values())) < RECORDS:
            batch = client.fetch(max_records=1000, max_wait=1.0)
            for record in batch:
                assert record.key is not None
                received[record.partition].append(int(record.key.decode()))
            if batch:
                futures.append((client.ack_nowait(batch), len(batch)))
    finally:
        watchdog.cancel()
        client.close()  # waits for the acks still on their way
    producer.join()
    expected = {p: list(range(p, RECORDS, PARTITIONS)) for p in range(PARTITIONS)}
    assert dict(received) == expected, "records missing, duplicated or out of order"
    assert [f.result(timeout=0) for f, _ in futures] == [n for _, n in futures]
    print(f"batches {len(futures)}: acked by Ack calls {ack_calls}, the rest carried by fetches")
    assert ack_calls < len(futures) / 2, (ack_calls, len(futures))
    committed, ends = settled(mesh.bootstrap, group, topic)
    assert committed == ends, f"committed {committed} != end offsets {ends}"


def test_a_sidecar_killed_while_fetches_carry_its_acks_loses_nothing(
    mesh: Mesh, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"g-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecars = [mesh.sidecar(group, assigner, f"carry-kill-{i}") for i in range(2)]
    for sidecar in sidecars:
        sidecar.wait_serving()

    def held_by_first() -> set[int]:
        with grpc.insecure_channel(sidecars[0].grpc_addr) as channel:
            stub = stream_pb2_grpc.StreamServiceStub(channel)
            status = stub.Status(stream_pb2.StatusRequest(), timeout=5)
            return {p.partition for p in status.partitions}

    deadline = time.monotonic() + 60
    while len(held_by_first()) != PARTITIONS // 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # both sidecars hold their share: nothing moves but by the kill
    held: set[int] = set()
    producer = trickle(mesh.bootstrap, topic)
    seen: dict[tuple[int, int], int] = defaultdict(int)
    futures: list[Future[int]] = []
    client = DsClient(group, client_id="carry-kill", assigner=assigner.grpc_addr)
    watchdog = threading.Timer(150, client.close)
    watchdog.start()
    killed = False
    try:
        deadline = time.monotonic() + 140
        while len(seen) < RECORDS and time.monotonic() < deadline:
            batch = client.fetch(max_records=1000, max_wait=1.0)
            for record in batch:
                seen[(record.partition, record.offset)] += 1
            if batch:
                futures.append(client.ack_nowait(batch))
            if not killed and len(seen) >= RECORDS // 3:
                held = held_by_first()
                assert held, "the first sidecar holds no partition"
                sidecars[0].kill()  # SIGKILL: acks carried or queued to it get no answer
                killed = True
    finally:
        watchdog.cancel()
        client.close()
    producer.join()
    assert killed
    again = {key: n for key, n in seen.items() if n > 1}
    twice = sorted({p for p, _ in again})
    extra = sum(again.values()) - len(again)
    print(f"{len(seen)} of {RECORDS} records, {extra} again, of partitions {twice}; "
          f"the killed sidecar held {sorted(held)}")  # fmt: skip
    assert len(seen) == RECORDS, "records lost"
    assert {p for p, _ in again} <= held, "a record of a partition nobody moved came twice"
    assert all(f.done() for f in futures)
    committed, ends = settled(mesh.bootstrap, group, topic)
    assert committed == ends, f"committed {committed} != end offsets {ends}"
