"""A real Consul agent in dev mode (single in-memory server) for development and tests.

The binary comes from ``$DS_CONSUL_BIN``, else ``$DS_CACHE_DIR/bin/consul``, else it is
built once by ``deploy/consul/build.sh`` (which prints the binary's path on its last line).
Every port the agent would open is given explicitly on 127.0.0.1, so several agents (and
a developer's own Consul on 8500) can run side by side.

Services register gRPC health checks (services/runtime/discovery.py), over TLS when their
port serves TLS; a port that requires a client certificate (mTLS) wants one from Consul
too. :func:`check_tls_args` gives the agent a development PKI's ``consul`` certificate for
those checks: ``dsctl dev up --secure --with-consul`` (``ConsulOptions.check_tls``) and
deploy/docker-compose.yml's Consul run with the same arguments.

CLI, for debugging: ``python -m services.devstack.consul --port 8500``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from services.devstack import procs
from services.devstack.cache import cache_dir
from services.devstack.ports import LOOPBACK, free_ports, port_is_open

if TYPE_CHECKING:
    from services.devstack.pki import DevPki

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "consul" / "build.sh"
# The identity whose certificate the agent presents in its checks of mTLS ports.
CHECK_CERTIFICATE = "consul"


def check_tls_args(pki: DevPki) -> list[str]:
    """The agent's arguments to present ``pki``'s ``consul`` certificate in its gRPC
    health checks of TLS ports (``enable_agent_tls_for_checks``; the checks themselves ask
    for TLS and skip verifying the server). Its HTTP API stays plaintext; a TLS
    configuration would open the gRPC TLS port (8503) in dev mode, so that is closed."""
    files = (
        f'ca_file = "{pki.ca}", cert_file = "{pki.cert(CHECK_CERTIFICATE)}", '
        f'key_file = "{pki.key(CHECK_CERTIFICATE)}"'
    )
    return [
        "-hcl=enable_agent_tls_for_checks = true",
        "-hcl=ports { grpc_tls = -1 }",
        f"-hcl=tls {{ defaults {{ {files} }} }}",
    ]


def consul_binary() -> Path:
    """Path of the consul binary, building it with ``deploy/consul/build.sh`` if absent."""
    if env := os.environ.get("DS_CONSUL_BIN"):
        return Path(env)
    binary = cache_dir() / "bin" / "consul"
    if binary.is_file():
        return binary
    return _build_consul()


def _build_consul() -> Path:
    # build.sh serialises concurrent builds itself (flock) and is a no-op when the binary
    # is current, so no lock here. Its progress (minutes on a cold Go cache) goes to our
    # stderr as it happens; stdout carries only the path, on the last line.
    if not BUILD_SCRIPT.is_file():
        raise FileNotFoundError(
            f"no consul binary and no {BUILD_SCRIPT}; set DS_CONSUL_BIN to a consul 1.14.x binary"
        )
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    built = Path(lines[-1].strip()) if lines else None
    if result.returncode != 0 or built is None or not built.is_file():
        raise RuntimeError(
            f"{BUILD_SCRIPT} failed (exit {result.returncode}); stdout:\n{result.stdout[-3000:]}"
        )
    return built


@dataclass(frozen=True)
class ConsulOptions:
    """How to run the dev agent."""

    # Agent dir (log, config); None means a fresh temp dir that stop() deletes.
    base_dir: Path | None = None
    # Fixed HTTP port (e.g. 8500 for `dsctl dev up`); None picks a free one.
    http_port: int | None = None
    start_timeout: float = 60.0
    stop_timeout: float = 15.0
    # SIGKILL the agent if the Python process that started it dies (Linux; see procs).
    die_with_parent: bool = True
    # None means consul_binary().
    binary: Path | None = None
    # A development PKI with a `consul` certificate: the agent presents it in its gRPC
    # checks of TLS ports (check_tls_args), so mTLS ports pass. None: no client certificate.
    check_tls: DevPki | None = None


@dataclass(frozen=True)
class _Ports:
    http: int
    grpc: int
    serf_lan: int
    serf_wan: int
    server: int


class ConsulAgent:
    """``consul agent -dev`` on loopback ports; ready once it has elected itself leader."""

    def __init__(self, options: ConsulOptions | None = None) -> None:
        self.options = options or ConsulOptions()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports: _Ports | None = None
        self._dir: Path | None = None
        self._owned_dir = False

    @property
    def http_addr(self) -> str:
        """``"127.0.0.1:P"``, the form ``CONSUL_HTTP_ADDR`` and py-consul expect."""
        return f"{LOOPBACK}:{self._require_ports().http}"

    @property
    def http_port(self) -> int:
        return self._require_ports().http

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_file(self) -> Path:
        if self._dir is None:
            raise RuntimeError("agent not started")
        return self._dir / "consul.log"

    def start(self) -> ConsulAgent:
        """Start the agent and wait until it reports a raft leader."""
        if self._proc is not None:
            raise RuntimeError("agent already started")
        binary = self.options.binary or consul_binary()
        self._dir = self._make_dir()
        self._ports = self._pick_ports()
        argv = [str(binary), "agent", *self._agent_args()]
        self._proc = procs.spawn(
            argv, self.log_file, cwd=self._dir, die_with_parent=self.options.die_with_parent
        )
        try:
            procs.wait_until(
                self._has_leader,
                timeout=self.options.start_timeout,
                what=f"consul agent on {self.http_addr}",
                alive=self.failed,
            )
        except procs.StartupError as exc:
            tail = procs.log_tail(self.log_file)
            self.stop()
            raise procs.StartupError(f"{exc}\n--- {self.log_file} ---\n{tail}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL. Idempotent."""
        if self._proc is not None:
            procs.terminate(self._proc, timeout=self.options.stop_timeout)
        if self._owned_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._owned_dir = False

    def failed(self) -> str | None:
        """Describe the agent's unexpected exit (with its log tail), else None."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return f"consul exited with {self._proc.returncode}:\n{procs.log_tail(self.log_file)}"

    def __enter__(self) -> ConsulAgent:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------

    def _make_dir(self) -> Path:
        if self.options.base_dir is None:
            self._owned_dir = True
            return Path(tempfile.mkdtemp(prefix="ds-consul-"))
        self.options.base_dir.mkdir(parents=True, exist_ok=True)
        return self.options.base_dir

    def _pick_ports(self) -> _Ports:
        fixed = self.options.http_port
        if fixed is not None and port_is_open(fixed):
            raise procs.StartupError(f"port {fixed} is already in use on {LOOPBACK}")
        http, grpc, lan, wan, server = free_ports(5)
        return _Ports(fixed or http, grpc, lan, wan, server)

    def _agent_args(self) -> list[str]:
        ports = self._require_ports()
        return [
            "-dev",
            "-bind", LOOPBACK,
            "-client", LOOPBACK,
            # Node names must be unique per agent; two dev agents named after the host
            # would be indistinguishable in logs.
            "-node", f"ds-dev-{uuid.uuid4().hex[:8]}",
            "-http-port", str(ports.http),
            "-grpc-port", str(ports.grpc),
            # 1.14 dev mode also opens a gRPC TLS port (8503) by default; two agents would
            # collide on it, and nothing here uses it.
            "-grpc-tls-port", "-1",
            "-dns-port", "-1",
            "-serf-lan-port", str(ports.serf_lan),
            "-serf-wan-port", str(ports.serf_wan),
            "-server-port", str(ports.server),
            "-log-level", "info",
            *(check_tls_args(self.options.check_tls) if self.options.check_tls else []),
        ]  # fmt: skip

    def _has_leader(self) -> bool:
        url = f"http://{self.http_addr}/v1/status/leader"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                leader = json.loads(response.read() or b'""')
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return bool(leader)

    def _require_ports(self) -> _Ports:
        if self._ports is None:
            raise RuntimeError("agent not started")
        return self._ports


class ConsulHandle(Protocol):
    """What tests and tools need from an agent, whether we started it or not."""

    @property
    def http_addr(self) -> str: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ExternalConsul:
    """An agent someone else runs (``CONSUL_HTTP_ADDR``); ``stop()`` leaves it alone."""

    http_addr: str

    def stop(self) -> None:
        """Nothing to do: we did not start it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Start an agent, print its HTTP address, run until SIGINT/SIGTERM, stop it."""
    parser = argparse.ArgumentParser(prog="python -m services.devstack.consul")
    parser.add_argument("--dir", type=Path, default=None, help="agent dir (default: temp)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default: free)")
    args = parser.parse_args(argv)
    agent = ConsulAgent(ConsulOptions(base_dir=args.dir, http_port=args.port))
    started = time.monotonic()
    agent.start()
    print(f"consul ready in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    print(agent.http_addr, flush=True)
    return procs.serve_until_signal(agent.stop, agent.failed)


if __name__ == "__main__":
    sys.exit(main())
