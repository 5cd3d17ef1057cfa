"""The pod-local data path (issue 22 item 1): the sidecar also serves its StreamService on
a Unix domain socket (``--uds-dir``), the binding names it (``local_address``), and a
client that can reach the file reads over it; when the socket goes away it reads over TCP,
and it returns to the socket when a sidecar serves one again. Every record is counted.

Real Kafka, real assigner and sidecar processes, a real DsClient. That a call came over the
socket is the sidecar's own count (``ds_client_transport_requests_total{transport}``).
"""

from __future__ import annotations

import stat
import subprocess
import time
from pathlib import Path

import pytest

from dsclient import DsClient
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.ops import metric_samples
from tests.support.producing import produce
from tests.support.readers import READERS
from tests.support.records import value_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITIONS = 3
PER_PHASE = 600
CLIENT = "pod-app"


def read_until(client: DsClient, seen: dict[int, int], total: int, timeout: float) -> None:
    """Fetch and ack until ``total`` distinct records were seen (``seen``: seq → times)."""
    deadline = time.monotonic() + timeout
    while len(seen) < total and time.monotonic() < deadline:
        batch = client.fetch(max_records=200, max_wait=0.5)
        if batch:
            client.ack(batch)
            for record in batch:
                seq = int(record.key)
                seen[seq] = seen.get(seq, 0) + 1
    missing = sorted(set(range(total)) - set(seen))
    assert not missing, f"{len(missing)} of {total} never delivered, e.g. {missing[:10]}"


def calls_by_transport(sidecar: ServiceProcess) -> dict[str, float]:
    return {
        s.labels["transport"]: s.value
        for s in metric_samples(sidecar, "ds_client_transport_requests_total")
        if s.labels["client_id"] == CLIENT
    }


def socket_sidecar(
    mesh: Mesh, topic: str, socket_dir: Path, sidecar_id: str
) -> tuple[str, ServiceProcess, ServiceProcess]:
    """PER_PHASE records in ``topic``, an assigner for its group and one sidecar serving on
    a socket in ``socket_dir`` too, holding every partition: (group, assigner, sidecar)."""
    group = f"g-{topic}"
    produce(mesh.bootstrap, topic, range(PER_PHASE), partitions=PARTITIONS, value=value_of)
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving()
    sidecar = mesh.sidecar(group, assigner, sidecar_id, "--uds-dir", str(socket_dir))
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, [sidecar_id], PARTITIONS)
    return group, assigner, sidecar


def test_a_client_in_the_pod_reads_over_the_socket_and_falls_back_to_tcp(
    mesh: Mesh, topic_factory: object, socket_dir: Path
) -> None:
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group, assigner, sidecar = socket_sidecar(mesh, topic, socket_dir, "sc-uds")
    path = socket_dir / "sidecar-sc-uds.d" / "sidecar-sc-uds.sock"
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o660
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o750
    tcp_args = list(sidecar.args)
    del tcp_args[tcp_args.index("--uds-dir") : tcp_args.index("--uds-dir") + 2]
    uds_args = list(sidecar.args)

    seen: dict[int, int] = {}
    with DsClient(group, client_id=CLIENT, assigner=assigner.grpc_addr) as client:
        # 1. Over the socket: every call of the client came that way.
        read_until(client, seen, PER_PHASE, timeout=60)
        first = calls_by_transport(sidecar)
        print(f"phase 1 (socket): {len(seen)} records, calls by transport {first}")
        assert first.get("unix", 0) > 0
        assert first.get("tcp", 0) == 0

        # 2. The sidecar is killed (its socket file stays behind, nobody listening) and
        # comes back on TCP only: the client reads on over TCP.
        produce(
            mesh.bootstrap,
            topic,
            range(PER_PHASE, PER_PHASE + PER_PHASE),
            partitions=PARTITIONS,
            value=value_of,
        )
        sidecar.kill()
        assert path.exists()
        sidecar.args = tcp_args
        sidecar.start().wait_serving()
        read_until(client, seen, 2 * PER_PHASE, timeout=90)
        second = calls_by_transport(sidecar)
        print(f"phase 2 (killed, back on TCP only): {len(seen)} records, calls {second}")
        assert second.get("tcp", 0) > 0
        assert second.get("unix", 0) == 0

        # 3. Restarted with its socket again (the stale file replaced): the client's next
        # binding names it, and the client is back on it.
        produce(
            mesh.bootstrap,
            topic,
            range(2 * PER_PHASE, 2 * PER_PHASE + PER_PHASE),
            partitions=PARTITIONS,
            value=value_of,
        )
        sidecar.stop()
        sidecar.args = uds_args
        sidecar.start().wait_serving()
        read_until(client, seen, 3 * PER_PHASE, timeout=90)
        third = calls_by_transport(sidecar)
        print(f"phase 3 (restarted with the socket): {len(seen)} records, calls {third}")
        assert third.get("unix", 0) > 0
    again = sum(n - 1 for n in seen.values())
    print(f"records {3 * PER_PHASE}: delivered {len(seen)}, delivered more than once {again}")
    assert len(seen) == 3 * PER_PHASE
    sidecar.stop()
    assert not path.exists(), "the socket file outlived its sidecar"


def dsread(reader: str, assigner: ServiceProcess, group: str, expect: int) -> list[str]:
    """The command line of ``reader``'s dsread reading ``expect`` distinct records."""
    return READERS[reader].command(
        "--assigner", assigner.grpc_addr, "--group", group, "--client-id", CLIENT,
        "--expect", str(expect), "--idle-exit-s", "60", "--quiet",
    )  # fmt: skip


@pytest.mark.parametrize("reader", ["go", "java"])
def test_the_go_and_java_clients_read_over_the_socket(
    mesh: Mesh, topic_factory: object, socket_dir: Path, reader: str
) -> None:
    """The Go and Java clients' dsread (clients/go, clients/java: the same rule as
    DsClient's) read every record over the socket of a sidecar started with --uds-dir: the
    sidecar counts no TCP call."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group, assigner, sidecar = socket_sidecar(mesh, topic, socket_dir, f"sc-{reader}-uds")
    command = dsread(reader, assigner, group, PER_PHASE)
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    calls = calls_by_transport(sidecar)
    print(f"{reader} dsread over the socket: {done.stdout.strip()}, calls by transport {calls}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"done distinct={PER_PHASE} " in done.stdout
    assert calls.get("unix", 0) > 0
    assert calls.get("tcp", 0) == 0
    sidecar.stop()


@pytest.mark.parametrize("reader", ["go", "java"])
def test_the_go_and_java_clients_read_on_over_tcp_when_the_socket_dies(
    mesh: Mesh, topic_factory: object, socket_dir: Path, reader: str
) -> None:
    """The sidecar is killed while dsread reads over its socket (the file stays, nobody
    listens) and comes back on TCP only: dsread reads every record, the rest over TCP."""
    topic = topic_factory(partitions=PARTITIONS)  # type: ignore[operator]
    group, assigner, sidecar = socket_sidecar(mesh, topic, socket_dir, f"sc-{reader}-fb")
    tcp_args = list(sidecar.args)
    del tcp_args[tcp_args.index("--uds-dir") : tcp_args.index("--uds-dir") + 2]
    command = dsread(reader, assigner, group, 2 * PER_PHASE)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            deadline = time.monotonic() + 120
            while calls_by_transport(sidecar).get("unix", 0) == 0:
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "no call came over the socket"
                time.sleep(0.2)
            before = calls_by_transport(sidecar)
            sidecar.kill()
            sidecar.args = tcp_args
            sidecar.start().wait_serving()
            produce(
                mesh.bootstrap,
                topic,
                range(PER_PHASE, PER_PHASE + PER_PHASE),
                partitions=PARTITIONS,
                value=value_of,
            )
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    after = calls_by_transport(sidecar)
    print(
        f"{reader} dsread, socket then killed and back on TCP only: {out.strip()}, "
        f"calls over the socket before the kill {before}, after the restart {after}"
    )
    assert proc.returncode == 0, err[-2000:]
    assert f"done distinct={2 * PER_PHASE} " in out
    assert after.get("tcp", 0) > 0
    assert after.get("unix", 0) == 0
    sidecar.stop()
