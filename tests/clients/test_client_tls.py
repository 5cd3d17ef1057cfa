"""Client conformance over a secured mesh (issue 20; docs/client-protocol.md §15 C45, §16).

One mesh for the module, secured as ``dsctl dev up --secure`` secures it: every gRPC and
HTTP port speaks TLS and requires a client certificate from the test's development CA
(mTLS), every caller is named by its bearer token, and the authorization policy gives each
client's identity ``reader:<its group>`` and nothing else. Each client's ``dsread``
(tests/support/readers.py), given ``--ca``, ``--cert``/``--key`` and ``--token-file``:

* reads its own group, served by two sidecars, to the end: every record produced is
  read, none lost (exit 0);
* without ``--token-file`` is ``UNAUTHENTICATED`` (exit 3, ``error UNAUTHENTICATED
  UNAUTHENTICATED``);
* with its token on a group the policy does not give it is ``PERMISSION_DENIED`` (exit 3,
  ``error PERMISSION_DENIED PERMISSION_DENIED``);
* without ``--ca`` (plaintext) fails the handshake: exit 3.

A client whose ``dsread`` is not built fails with the ``make`` target to run, as in
tests/clients/test_client_conformance.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.devstack.kafka import KafkaHandle, create_topic, delete_topic
from services.devstack.pki import DevPki, make_dev_pki
from services.devstack.secure import service_env
from tests.support.accounting import report
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.reader_run import ReaderRun
from tests.support.readers import READERS, Reader
from tests.support.sidecar_probe import produce_bulk

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 4
RECORDS = 400  # per group: offsets 0..99 of each partition of a fresh topic
SIDECARS = ("sc-1", "sc-2")  # per client's group; its id is <client>-<sc-N>
CLIENT_CERT = "client"  # the applications' certificate; the token says who calls
OTHER_GROUP = "g-nobody"  # served by the assigner, read by no identity


def identity(reader: str) -> str:
    return f"reader-{reader}"


@dataclass
class SecureMesh:
    """The module's secured mesh: its PKI, its assigner, the groups' sidecars (started
    for a client the first time it is tested) and the topic every group reads."""

    pki: DevPki
    mesh: Mesh
    assigner: ServiceProcess
    topic: str
    groups: dict[str, str]
    sidecars: dict[str, list[ServiceProcess]] = field(default_factory=dict)

    def serve(self, reader: str) -> str:
        """Start (once) the two sidecars of ``reader``'s group; its group."""
        group = self.groups[reader]
        if reader not in self.sidecars:
            started = [
                self.mesh.sidecar(
                    group,
                    self.assigner,
                    f"{reader}-{sc}",
                    env=dict(service_env(self.pki, f"{reader}-{sc}")),
                )
                for sc in SIDECARS
            ]
            for sidecar in started:
                sidecar.wait_serving()
            self.sidecars[reader] = started
        return group

    def flags(self, *, ca: bool = True, token: str | None = None) -> list[str]:
        """dsread's TLS flags: the CA and the client certificate, and ``token``'s file."""
        if not ca:
            return []
        flags = ["--ca", str(self.pki.ca)]
        flags += ["--cert", str(self.pki.cert(CLIENT_CERT))]
        flags += ["--key", str(self.pki.key(CLIENT_CERT))]
        if token is not None:
            # The assigner's token and the sidecars' (each service accepts its audience only).
            flags += ["--token-file", str(self.pki.token(token))]
            flags += ["--sidecar-token-file", str(self.pki.sidecar_token(token))]
        return flags


@pytest.fixture(scope="module")
def secure(
    kafka_cluster: KafkaHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureMesh]:
    bootstrap = kafka_cluster.bootstrap
    root = tmp_path_factory.mktemp("client-tls")
    run_id = uuid.uuid4().hex[:6]
    topic = f"client-tls-{run_id}"
    groups = {name: f"g-tls-{name}-{run_id}" for name in READERS}
    sidecar_ids = [f"{name}-{sc}" for name in READERS for sc in SIDECARS]
    roles: dict[str, list[str]] = {"assigner": ["reporter"]}
    roles.update(
        {f"{name}-{sc}": ["sidecar", f"serves:{groups[name]}", "reporter"]
         for name in READERS for sc in SIDECARS}
    )  # fmt: skip
    roles.update({identity(name): [f"reader:{group}"] for name, group in groups.items()})
    pki = make_dev_pki(root / "pki", roles, certificates=["assigner", CLIENT_CERT, *sidecar_ids])
    create_topic(bootstrap, topic, PARTITIONS)
    try:
        produce_bulk(bootstrap, topic, RECORDS, 100, PARTITIONS)
        with running_mesh(bootstrap, root) as mesh:
            config = [(g, [topic]) for g in (*groups.values(), OTHER_GROUP)]
            assigner = mesh.assigner(config, env=dict(service_env(pki, "assigner")))
            assigner.wait_serving()
            yield SecureMesh(pki, mesh, assigner, topic, groups)
    finally:
        delete_topic(bootstrap, topic)


def run(reader: Reader, tmp_path: Path, label: str, *args: str) -> ReaderRun:
    return ReaderRun(
        reader.command(*args, "--idle-exit-s", "30"),
        tmp_path / f"dsread-{reader.name}-{label}.stderr",
    ).start()


def error_line(run: ReaderRun) -> str:
    lines = [line for line in run.stderr(200).splitlines() if line.startswith("error ")]
    return lines[0] if lines else ""


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_client_reads_its_group_over_tls_with_its_token_and_nothing_else(
    name: str, secure: SecureMesh, tmp_path: Path
) -> None:
    reader = READERS[name]
    group = secure.serve(name)
    assigner = secure.assigner.grpc_addr
    common = ("--assigner", assigner, "--client-id", f"tls-{name}")
    reads = run(
        reader, tmp_path, "reads",
        *common, "--group", group, "--expect", str(RECORDS),
        *secure.flags(token=identity(name)),
    )  # fmt: skip
    # The refusals, side by side with the read (they touch other groups or none).
    refusals = {
        "no token": run(
            reader, tmp_path, "no-token",
            *common, "--group", group, "--expect", "1", *secure.flags(),
        ),
        "another group": run(
            reader, tmp_path, "other-group",
            *common, "--group", OTHER_GROUP, "--expect", "1",
            *secure.flags(token=identity(name)),
        ),
        "plaintext": run(
            reader, tmp_path, "plaintext",
            *common, "--group", group, "--expect", "1", *secure.flags(ca=False),
        ),
    }  # fmt: skip
    codes = {what: r.wait(timeout=120) for what, r in refusals.items()}
    code = reads.wait(timeout=180)

    expected = {(seq % PARTITIONS, seq // PARTITIONS) for seq in range(RECORDS)}
    seen = {(r.partition, r.offset) for r in reads.records}
    lost, foreign = expected - seen, seen - expected
    errors = {what: error_line(r) for what, r in refusals.items()}
    report(
        f"client tls {name}: read exit {code}, produced {RECORDS}, read {len(seen)} distinct "
        f"of {len(reads.records)} delivered, lost {len(lost)}, acked {reads.done.get('acked')}; "
        + "; ".join(f"{what} -> exit {codes[what]} {errors[what]!r}" for what in refusals)
    )
    assert code == 0, f"{name} dsread exited {code}:\n{reads.stderr()}"
    assert not lost, f"lost {len(lost)}: {sorted(lost)[:10]}"
    assert not foreign, f"records never produced: {sorted(foreign)[:10]}"
    assert reads.done.get("distinct") == RECORDS, reads.done

    assert codes["no token"] == 3, refusals["no token"].stderr()
    assert errors["no token"] == "error UNAUTHENTICATED UNAUTHENTICATED"
    assert codes["another group"] == 3, refusals["another group"].stderr()
    assert errors["another group"] == "error PERMISSION_DENIED PERMISSION_DENIED"
    assert codes["plaintext"] == 3, refusals["plaintext"].stderr()
    assert errors["plaintext"].startswith("error "), refusals["plaintext"].stderr()
    for refused in refusals.values():
        assert not refused.records
