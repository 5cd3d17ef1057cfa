"""Per-client views on the real mesh (issue 21, item 4): ``dsctl clients`` and /ui/clients.

An assigner, two sidecars serving a group on a 4-partition topic, and two application
clients (real ``DsClient``s) fetching and acking from both sidecars in threads while the
real ``dsctl`` runs as a subprocess: ``dsctl clients GROUP --output json`` lists both
clients, bound, each read from both sidecars with records/s and acks/s > 0 and no errors;
the table shows them; ``dsctl clients nope`` exits 2 with GROUP_NOT_FOUND's message. Then
headless Chromium loads /ui/clients?group=GROUP and its rows carry the same clients,
sidecars and rates > 0 (DOM and a screenshot in the test's log dir).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dsclient import DsClient
from tests.support import cli
from tests.support.browser import CHROMIUM, dump_dom, screenshot
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.producing import produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 4
RECORDS = 40_000
CLIENTS = ("reader-a", "reader-b")
SIDECARS = ("sidecar-0", "sidecar-1")


class Reader(threading.Thread):
    """One application client reading and acking until stopped, a little at a time (so the
    records last the whole test)."""

    def __init__(self, group: str, client_id: str, assigner: str, stop: threading.Event) -> None:
        super().__init__(name=client_id, daemon=True)
        self.group, self.client_id, self.assigner, self.stop = group, client_id, assigner, stop
        self.acked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with DsClient(self.group, client_id=self.client_id, assigner=self.assigner) as c:
                while not self.stop.is_set():
                    batch = c.fetch(max_records=20, max_wait=0.5)
                    if batch:
                        self.acked += c.ack(batch)
                    self.stop.wait(0.05)
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.fixture
def readers(
    mesh: Mesh, topic_factory: Callable[..., str]
) -> Iterator[tuple[str, ServiceProcess, list[Reader]]]:
    topic = topic_factory(partitions=PARTITIONS)
    group = f"clients-{topic}"[:249]
    produce(
        mesh.bootstrap,
        topic,
        range(RECORDS),
        partitions=PARTITIONS,
        value=lambda _seq: b"x" * 50,
        keyed=False,
        idempotent=False,
        linger_ms=20,
    )
    assigner = mesh.assigner([(group, [topic])])
    assigner.wait_serving(90)
    for sid in SIDECARS:
        mesh.sidecar(group, assigner, sid).wait_serving(90)
    stop = threading.Event()
    started = [Reader(group, cid, assigner.grpc_addr, stop) for cid in CLIENTS]
    for r in started:
        r.start()
    try:
        yield group, assigner, started
    finally:
        stop.set()
        for r in started:
            r.join(30)


def dsctl(assigner: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return cli.dsctl(*args, env=cli.cli_env(DS_ASSIGNER=assigner.grpc_addr), timeout=60)


def both_reading(doc: dict[str, Any]) -> bool:
    """Both clients with both sidecars, each reading there (records/s > 0)."""
    clients = {c["client_id"]: c for c in doc["clients"]}
    return set(CLIENTS) <= set(clients) and all(
        sorted(s["sidecar_id"] for s in clients[cid]["sidecars"]) == list(SIDECARS)
        and all(s["records_per_second"] > 0 for s in clients[cid]["sidecars"])
        for cid in CLIENTS
    )


def test_dsctl_clients_and_the_clients_page_show_both_readers_at_both_sidecars(
    readers: tuple[str, ServiceProcess, list[Reader]], mesh: Mesh
) -> None:
    assert Path(CHROMIUM).exists(), f"chromium is not installed ({CHROMIUM}): run scripts/setup.sh"
    group, assigner, threads = readers
    deadline = time.monotonic() + 90
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        result = dsctl(assigner, "clients", group, "--output", "json")
        assert result.returncode == 0, (result.stdout, result.stderr)
        doc = json.loads(result.stdout)
        if both_reading(doc):
            break
        time.sleep(1.0)
    assert both_reading(doc), json.dumps(doc, indent=2)
    assert [t.error for t in threads] == [None, None]
    (mesh.log_dir / "dsctl-clients.json").write_text(json.dumps(doc, indent=2))
    for c in doc["clients"]:
        assert c["group"] == group and c["bound"] is True
        assert c["bound_since"] is not None and c["last_seen"] is not None
        assert c["records_per_second"] > 0 and c["acks_per_second"] > 0
        assert c["records_per_second"] == pytest.approx(
            sum(s["records_per_second"] for s in c["sidecars"]), abs=0.01
        )
        assert c["errors_per_second"] == 0 and c["error_ratio"] == 0
    assert sorted(c["client_id"] for c in doc["clients"]) == list(CLIENTS)

    table = dsctl(assigner, "clients")  # every group
    assert table.returncode == 0, table.stderr
    (mesh.log_dir / "dsctl-clients.txt").write_text(table.stdout)
    for cid in CLIENTS:
        (line,) = [ln for ln in table.stdout.splitlines() if f" {cid} " in ln]
        assert "sidecar-0, sidecar-1" in line and " ago" in line, line

    unknown = dsctl(assigner, "clients", "nope")
    (mesh.log_dir / "dsctl-clients-nope.txt").write_text(
        f"{unknown.stderr}exit {unknown.returncode}\n"
    )
    assert unknown.returncode == 2, (unknown.stdout, unknown.stderr)
    assert "group 'nope' does not exist" in unknown.stderr and "Traceback" not in unknown.stderr

    # ---- /ui/clients in Chromium: the same clients, sidecars, rates > 0 ---------------------
    url = f"http://127.0.0.1:{assigner.http_port}/ui/clients?group={group}"
    deadline = time.monotonic() + 60
    while True:
        dom = dump_dom(mesh.log_dir, url, "clients")
        rows = {a["data-client"]: a for a in dom.having("data-client")}
        shown = set(rows) == set(CLIENTS) and all(
            rows[cid]["data-sidecars"] == " ".join(SIDECARS)
            and float(rows[cid]["data-records-per-second"]) > 0
            for cid in CLIENTS
        )
        if shown or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert shown, rows
    for cid in CLIENTS:
        assert rows[cid]["data-group"] == group and rows[cid]["data-bound"] == "true"
        assert float(rows[cid]["data-acks-per-second"]) > 0
        assert float(rows[cid]["data-errors-per-second"]) == 0
    screenshot(mesh.log_dir, url, "clients")
    # Every other page links to it.
    index = dump_dom(mesh.log_dir, f"http://127.0.0.1:{assigner.http_port}/ui", "index")
    assert any(a.get("href") == "/ui/clients" for a in index.having("href"))
    assert [t.error for t in threads] == [None, None]
    assert all(t.acked > 0 for t in threads)
