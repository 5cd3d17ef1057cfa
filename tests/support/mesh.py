"""Run the mesh's services as real processes for tests, and talk to them.

Every service is started with ``python -m services.<name>`` on free loopback ports, its
output in a log file, and stopped with SIGTERM (the graceful path) unless a test kills it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.devstack.ports import free_ports

REPO = Path(__file__).resolve().parents[2]
# In the order Mesh.stop_all stops them: each kind's callers before it.
MODULES = {
    "sidecar": "services.consumer_sidecar",
    "assigner": "services.assigner",
    "notifier": "services.notifier",
}


@dataclass
class ServiceProcess:
    kind: str
    args: list[str]
    log: Path
    grpc_port: int
    http_port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> ServiceProcess:
        argv = [
            sys.executable, "-m", MODULES[self.kind],
            "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
            "--log-format", "console", *self.args,
        ]  # fmt: skip
        env = {**os.environ, **self.env}
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                start_new_session=True,
            )  # fmt: skip
        return self

    def http_tls(self) -> ssl.SSLContext | None:
        """How to reach this service's HTTP port: with its own CA and certificate when its
        environment gives it TLS (``DS_TLS__*``); None: plaintext."""
        if "DS_TLS__CERT_FILE" not in self.env:
            return None
        context = ssl.create_default_context(cafile=self.env.get("DS_TLS__CA_FILE"))
        context.load_cert_chain(self.env["DS_TLS__CERT_FILE"], self.env["DS_TLS__KEY_FILE"])
        return context

    def healthz(self) -> int | None:
        tls = self.http_tls()
        scheme = "https" if tls else "http"
        try:
            with urllib.request.urlopen(
                f"{scheme}://127.0.0.1:{self.http_port}/healthz", timeout=1, context=tls
            ) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except OSError:
            return None

    def grpc_health(self, service: str = "") -> str | None:
        try:
            with grpc.insecure_channel(self.grpc_addr) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
        except grpc.RpcError:
            return None

    def wait_serving(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited {self.proc.returncode}:\n{self.tail()}")
            if self.healthz() == 200:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.kind} not SERVING within {timeout}s:\n{self.tail()}")

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait_stopped(time.monotonic() + timeout)

    def wait_stopped(self, deadline: float) -> int | None:
        """Wait for the exit a SIGTERM asked for, SIGKILL at ``deadline`` (monotonic);
        returns the exit code."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)
        return self.proc.returncode

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


class Mesh:
    """Starts services for one test and stops them all at the end."""

    def __init__(self, bootstrap: str, log_dir: Path, consul: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.log_dir = log_dir
        self.consul = consul
        self.services: list[ServiceProcess] = []

    def _common(self) -> list[str]:
        common = ["--bootstrap", self.bootstrap]
        if self.consul:
            common += ["--consul", self.consul]
        return common

    def service(
        self,
        kind: str,
        *args: str,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        grpc_port, http_port = free_ports(2)
        if kind == "notifier" and "--outbox-path" not in args:
            # The test's own outbox, not the default under ~/.local/state.
            args = (*args, "--outbox-path", str(self.log_dir / f"{name or kind}-outbox.sqlite"))
        svc = ServiceProcess(
            kind,
            [*self._common(), *args],
            self.log_dir / f"{name or kind}.log",
            grpc_port,
            http_port,
            dict(env or {}),
        )
        self.services.append(svc)
        return svc.start()

    def assigner(
        self,
        groups: Sequence[tuple[str, Sequence[str]]] = (),
        *args: str,
        env: dict[str, str] | None = None,
        name: str | None = None,
        settings: dict[str, str] | None = None,
        group_settings: dict[str, dict[str, str]] | None = None,
    ) -> ServiceProcess:
        """An assigner serving ``groups`` (name, topics); ``settings``: further YAML keys
        of every group (e.g. ``visibility_timeout_seconds``); ``group_settings``: of one
        group (by name; over ``settings``)."""
        config = self.log_dir / f"assigner-{len(self.services)}.yaml"

        def more(group: str) -> str:
            keys = {**(settings or {}), **(group_settings or {}).get(group, {})}
            return "".join(f"\n    {key}: {value}" for key, value in keys.items())

        lines = ["groups:"] + [
            f"  - name: {group}\n    topics: [{', '.join(topics)}]{more(group)}"
            for group, topics in groups
        ]
        config.write_text("\n".join(lines) + "\n" if groups else "groups: []\n")
        return self.service("assigner", "--config", str(config), *args, env=env, name=name)

    def sidecar(
        self,
        group: str,
        assigner: ServiceProcess,
        sidecar_id: str,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        return self.service(
            "sidecar", "--group", group, "--id", sidecar_id, "--assigner", assigner.grpc_addr,
            *args, name=sidecar_id, env=env,
        )  # fmt: skip

    def stop_all(self, timeout: float = 30) -> None:
        """SIGTERM every service, in waves by kind: the sidecars (they hand their leases
        back to the assigner and report to the notifier), then the assigners (they report
        to the notifier), then the notifiers. A wave's services stop side by side: one
        after the other, a mesh of a few sidecars took seconds longer to tear down in every
        test (each one's exit waits on its own shutdown)."""
        for kind in MODULES:
            wave = [svc for svc in reversed(self.services) if svc.kind == kind]
            for svc in wave:
                svc.signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for svc in wave:
                svc.wait_stopped(deadline)


@contextlib.contextmanager
def running_mesh(bootstrap: str, log_dir: Path, consul: str | None = None) -> Iterator[Mesh]:
    mesh = Mesh(bootstrap, log_dir, consul)
    try:
        yield mesh
    finally:
        mesh.stop_all()
