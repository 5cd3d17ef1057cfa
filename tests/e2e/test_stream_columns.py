"""The zero-copy delivery mode end to end (issue 22 item 1): ``DsClient.stream_columns``
over a sidecar's local socket reads every record through shared memory
(``DELIVERY_FORMAT_ARROW_SHM``), more than one segment holds (its regions are reused once
released), exactly once; over TCP the same records come as ``BATCHES`` turned into equal
Arrow tables; a Stream that asks for ARROW_SHM over TCP is refused; the segment file is
gone once the stream ended. Every record is counted and its value compared.

Real Kafka, real assigner and sidecar processes, a real DsClient.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from dsclient import ColumnBatch, DsClient
from dsclient.reasons import error_info
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.ops import metric_samples
from tests.support.producing import produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 3
RECORDS = 3_000
VALUE_BYTES = 1_000
# The segment holds about 500 of these records: RECORDS pass only if regions are reused.
SEGMENT_BYTES = 512 * 1024
CREDIT = 400


def value(seq: int) -> bytes:
    return f"seq-{seq}-".encode().ljust(VALUE_BYTES, b"v")


def serving(
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    sidecar_id: str,
    *args: str,
    segment_bytes: int = SEGMENT_BYTES,
) -> ServiceProcess:
    sidecar = mesh.sidecar(
        group, assigner, sidecar_id, *args, env={"DS_SHM_SEGMENT_BYTES": str(segment_bytes)}
    )
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, [sidecar_id], PARTITIONS)
    return sidecar


def read_all(client: DsClient, timeout: float = 120) -> tuple[pa.Table, list[int], int]:
    """Every record through stream_columns, each batch copied out then acked: the table
    of what arrived (sorted by partition and offset), the stream formats seen and how many
    shared-memory regions the batches were in."""
    copies: list[pa.Table] = []
    formats: list[int] = []
    regions = 0
    got = 0
    deadline = time.monotonic() + timeout
    batches = client.stream_columns(CREDIT)
    try:
        for batch in batches:
            assert isinstance(batch, ColumnBatch) and len(batch) == batch.table.num_rows
            formats += [s.format for s in client._streams.values()]
            regions += sum(len(r.regions) for r in batch.releases)
            for i, run in enumerate(batch.record_batches):  # well-formed Arrow, each run
                try:
                    run.validate(full=True)
                except pa.ArrowInvalid as exc:
                    raise AssertionError(
                        f"run {i} of {len(batch.record_batches)} ({batch.spans[i]}, "
                        f"{len(batch.releases)} releases) is not valid Arrow: {exc}"
                    ) from exc
            # The application's checks run on the columns in place, before the ack ...
            sizes = pc.binary_length(batch.table.column("value"))
            assert pc.all(pc.equal(sizes, VALUE_BYTES)).as_py()
            # ... and what must outlive the ack is copied out first.
            copies.append(batch.copy())
            assert client.ack(batch) == len(batch)
            got += len(batch)
            if got >= RECORDS or time.monotonic() > deadline:
                break
    finally:
        batches.close()
    table = pa.concat_tables(copies).sort_by([("partition", "ascending"), ("offset", "ascending")])
    return table, formats, regions


def check_every_record_once(table: pa.Table) -> None:
    keys = [int(k) for k in table.column("key").to_pylist()]
    assert sorted(keys) == list(range(RECORDS)), (
        f"{len(keys)} rows, {len(set(keys))} distinct of {RECORDS}"
    )
    for key, got in zip(keys, table.column("value").to_pylist(), strict=True):
        assert got == value(key)


def segments_in(directory: Path) -> list[str]:
    """The segment files of the sidecars serving in ``directory`` (each in its own
    ``sidecar-ID.d``, beside its gRPC and frame sockets)."""
    return sorted(p.name for p in directory.glob("*/*") if ".shm-" in p.name)


def test_columns_over_the_socket_come_through_shared_memory_and_equal_those_over_tcp(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value)
    local, remote = f"g-shm-{topic}", f"g-tcp-{topic}"
    assigner = mesh.assigner([(local, [topic]), (remote, [topic])])
    assigner.wait_serving()

    # 1. Over the sidecar's socket: ARROW_SHM, every record once, through a segment that
    # holds a sixth of them (its regions are reused once released).
    sidecar = serving(mesh, assigner, local, "sc-shm", "--uds-dir", str(socket_dir))
    with DsClient(local, client_id="cols-local", assigner=assigner.grpc_addr) as client:
        shm_table, formats, regions = read_all(client)
    print(
        f"over the socket: {shm_table.num_rows} rows in {regions} shared regions, stream "
        f"formats seen {set(formats)}"
    )
    assert set(formats) == {stream_pb2.DELIVERY_FORMAT_ARROW_SHM}
    # A run is at most CREDIT records (400 KB), so each fits the segment and came through
    # it (none as an oversize RecordBatch); RECORDS of them are 6 segments' worth.
    assert regions >= RECORDS * VALUE_BYTES // SEGMENT_BYTES
    check_every_record_once(shm_table)
    # 2. The stream ended with the client: its segment file is gone.
    deadline = time.monotonic() + 10
    while segments_in(socket_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert segments_in(socket_dir) == [], "a segment file outlived its stream"
    sidecar.stop()

    # 3. Over TCP (a sidecar without a socket): BATCHES, turned into equal tables.
    sidecar = serving(mesh, assigner, remote, "sc-tcp")
    with DsClient(remote, client_id="cols-remote", assigner=assigner.grpc_addr) as client:
        tcp_table, formats, regions = read_all(client)
    print(f"over TCP: {tcp_table.num_rows} rows, stream formats seen {set(formats)}")
    assert set(formats) == {stream_pb2.DELIVERY_FORMAT_BATCHES} and regions == 0
    check_every_record_once(tcp_table)
    assert tcp_table.equals(shm_table)

    # 4. A Stream that asks for ARROW_SHM over TCP, by hand: INVALID_ARGUMENT.
    with grpc.insecure_channel(sidecar.grpc_addr) as channel:
        opening = stream_pb2.StreamOpen(
            client_id="by-hand",
            group=remote,
            initial_credit=stream_pb2.StreamCredit(records=10),
            format=stream_pb2.DELIVERY_FORMAT_ARROW_SHM,
        )
        call = stream_pb2_grpc.StreamServiceStub(channel).Stream(
            iter([stream_pb2.StreamRequest(open=opening)]), timeout=10
        )
        with pytest.raises(grpc.RpcError) as refused:
            next(iter(call))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(refused.value)
    assert info is not None and info.metadata["field"] == "open.format"
    sidecar.stop()


def test_a_socket_stream_that_falls_back_to_tcp_reads_on_with_batches(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    """The sidecar is killed while the client reads through shared memory, and comes back
    on TCP only: the stream re-opens over TCP with BATCHES and every record arrives (those
    delivered and not acked before the kill again: at least once)."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value)
    group = f"g-fb-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = serving(mesh, assigner, group, "sc-fb", "--uds-dir", str(socket_dir))
    tcp_args = list(sidecar.args)
    del tcp_args[tcp_args.index("--uds-dir") : tcp_args.index("--uds-dir") + 2]
    seen: dict[int, int] = {}
    formats: list[int] = []
    with DsClient(group, client_id="cols-fb", assigner=assigner.grpc_addr) as client:
        batches = client.stream_columns(CREDIT)
        deadline = time.monotonic() + 120
        killed = False
        try:
            for batch in batches:
                formats += [s.format for s in client._streams.values()]
                table = batch.table
                for key, got in zip(
                    table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
                ):
                    assert got == value(int(key))
                    seen[int(key)] = seen.get(int(key), 0) + 1
                client.ack(batch)
                if not killed and len(seen) >= RECORDS // 3:
                    sidecar.kill()
                    sidecar.args = tcp_args
                    sidecar.start().wait_serving()
                    killed = True
                if len(seen) >= RECORDS or time.monotonic() > deadline:
                    break
        finally:
            batches.close()
    again = sum(n - 1 for n in seen.values())
    order = list(dict.fromkeys(formats))
    print(f"{len(seen)} of {RECORDS} records, {again} again; formats in order {order}")
    assert len(seen) == RECORDS
    assert formats[0] == stream_pb2.DELIVERY_FORMAT_ARROW_SHM
    assert formats[-1] == stream_pb2.DELIVERY_FORMAT_BATCHES
    sidecar.stop()


def test_with_auto_ack_asking_for_the_next_batch_releases_the_last(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    """auto_ack: the application acks nothing; the client releases each batch's regions
    when the next one is asked for, so six segments' worth of records pass through one."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value)
    group = f"g-auto-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = serving(mesh, assigner, group, "sc-auto", "--uds-dir", str(socket_dir))
    seen: dict[int, int] = {}
    regions = 0
    with DsClient(
        group, client_id="cols-auto", assigner=assigner.grpc_addr, auto_ack=True
    ) as client:
        batches = client.stream_columns(CREDIT)
        deadline = time.monotonic() + 120
        try:
            for batch in batches:
                assert {s.format for s in client._streams.values()} == {
                    stream_pb2.DELIVERY_FORMAT_ARROW_SHM
                }
                regions += sum(len(r.regions) for r in batch.releases)
                table = batch.table
                for key, got in zip(
                    table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
                ):
                    assert got == value(int(key))
                    seen[int(key)] = seen.get(int(key), 0) + 1
                if len(seen) >= RECORDS or time.monotonic() > deadline:
                    break
        finally:
            batches.close()
    again = sum(n - 1 for n in seen.values())
    print(f"auto_ack: {len(seen)} of {RECORDS} records in {regions} regions, {again} again")
    assert len(seen) == RECORDS and again == 0
    assert regions >= RECORDS * VALUE_BYTES // SEGMENT_BYTES
    sidecar.stop()


def test_runs_too_large_for_the_segment_come_as_record_batches_beside_the_shared_ones(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    """A segment of 64 KiB holds at most about 60 of these records: the sidecar sends the
    runs that do not fit as RecordBatches in the same responses, and the client hands both
    out as the same columns; every record arrives once."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value)
    group = f"g-small-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = serving(
        mesh, assigner, group, "sc-small", "--uds-dir", str(socket_dir), segment_bytes=64 * 1024
    )
    with DsClient(group, client_id="cols-small", assigner=assigner.grpc_addr) as client:
        table, formats, regions = read_all(client)
    print(f"64 KiB segment: {table.num_rows} rows, {regions} of their runs in shared memory")
    assert set(formats) == {stream_pb2.DELIVERY_FORMAT_ARROW_SHM}
    check_every_record_once(table)
    sidecar.stop()


HOLDER = """
import sys, time
from dsclient import DsClient
group, assigner = sys.argv[1], sys.argv[2]
client = DsClient(group, client_id="cols-killed", assigner=assigner)
held = []
for batch in client.stream_columns(400):
    held.append(batch)  # never acked, never released: the regions stay the client's
    if sum(map(len, held)) >= 300:  # of ~500 the segment holds: it waits for releases
        print("holding", sum(map(len, held)), flush=True)
        time.sleep(600)
"""


def test_an_application_killed_while_it_holds_shared_memory_loses_nothing(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    """kill -9 of an application holding shared-memory regions it never acked: its stream
    ends with its process, the sidecar removes the segment and gives back what it held,
    and the next reader gets every record, each once (the killed one acked none)."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    produce(mesh.bootstrap, topic, range(RECORDS), partitions=PARTITIONS, value=value)
    group = f"g-kill-{topic}"
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = serving(mesh, assigner, group, "sc-kill", "--uds-dir", str(socket_dir))
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}:{repo / 'protos' / 'gen' / 'python'}"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, group, assigner.grpc_addr],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None
        said = []  # its log lines go to stdout too
        # Killed if it never says it holds (the read below would block for good).
        watchdog = threading.Timer(60, holder.kill)
        watchdog.start()
        for line in holder.stdout:
            said.append(line)
            if line.startswith("holding") or len(said) > 200:
                break
        watchdog.cancel()
        assert line.startswith("holding"), f"the holding application said {said!r}"
        assert segments_in(socket_dir), "no segment while the application holds regions"
        shared = shared_memory_bytes(sidecar, "cols-killed")
        assert shared == [SEGMENT_BYTES], shared
        holder.kill()  # SIGKILL: no close, no nack, no release
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
    deadline = time.monotonic() + 20
    while segments_in(socket_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert segments_in(socket_dir) == [], "the killed application's segment outlived it"
    assert shared_memory_bytes(sidecar, "cols-killed") == [0]
    with DsClient(group, client_id="cols-next", assigner=assigner.grpc_addr) as client:
        table, _, _ = read_all(client)
    print(f"after the kill: {line.strip()} were held; the next reader got {table.num_rows}")
    check_every_record_once(table)
    sidecar.stop()


def shared_memory_bytes(sidecar: ServiceProcess, client_id: str) -> list[float]:
    return [
        s.value
        for s in metric_samples(sidecar, "ds_client_shared_memory_bytes")
        if s.labels["client_id"] == client_id
    ]
