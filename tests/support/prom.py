"""Real Prometheus and Alertmanager (the Debian packages) for tests, and the promtool /
amtool checks of ``deploy/``.

* :class:`Prometheus` and :class:`Alertmanager` run the binaries on free loopback ports
  with their data in a test directory, wait until ``/-/ready`` answers, query their HTTP
  APIs and stop with SIGTERM.
* :func:`test_prometheus_config` writes a scrape configuration for fixed targets (the
  mesh's HTTP ports) with the repo's rule files; :func:`fast_rule_files` copies those rule
  files with every ``for:`` shortened (the thresholds and expressions stay the repo's).
* :func:`check_config` runs ``promtool check config``; Debian's Prometheus is built
  without Consul service discovery, so a configuration using ``consul_sd_configs`` is then
  checked as a copy where each Consul SD block is a static placeholder (everything else,
  relabelling included, is still checked) and the result says so. A configuration whose
  ``tls_config`` names files of a container's mount (the compose stack's PKI) is checked
  as a copy naming the files of a fresh development PKI instead (promtool opens them).
* :class:`WebhookSink` is an HTTP server that records what Alertmanager's webhooks post.

``python -m tests.support.prom check-config FILE...`` is what ``make rules`` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from services.devstack.ports import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULES_DIR = PROMETHEUS_DIR / "rules"
RULE_TESTS_DIR = PROMETHEUS_DIR / "tests"
ALERTMANAGER_CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
DASHBOARDS_DIR = REPO / "deploy" / "grafana" / "dashboards"

PROMETHEUS_BIN = os.environ.get("DS_PROMETHEUS_BIN", "prometheus")
PROMTOOL_BIN = os.environ.get("DS_PROMTOOL_BIN", "promtool")
ALERTMANAGER_BIN = os.environ.get("DS_ALERTMANAGER_BIN", "prometheus-alertmanager")
AMTOOL_BIN = os.environ.get("DS_AMTOOL_BIN", "amtool")


# ---- configuration (pure) -------------------------------------------------------------


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def shorten_for(rules_doc: Mapping[str, Any], duration: str) -> dict[str, Any]:
    """A copy of a rule file's document with every alert's ``for:`` set to ``duration``."""
    groups = []
    for group in rules_doc.get("groups", []):
        rules = [
            {**rule, "for": duration} if "alert" in rule and "for" in rule else dict(rule)
            for rule in group.get("rules", [])
        ]
        groups.append({**group, "rules": rules})
    return {**rules_doc, "groups": groups}


def fast_rule_files(dest: Path, duration: str = "2s") -> list[Path]:
    """The repo's rule files, copied to ``dest`` with every ``for:`` set to ``duration``."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for path in rule_files():
        doc = yaml.safe_load(path.read_text())
        target = dest / path.name
        target.write_text(yaml.safe_dump(shorten_for(doc, duration), sort_keys=False))
        out.append(target)
    return out


def test_prometheus_config(
    jobs: Mapping[str, Sequence[str]],
    rules: Sequence[Path],
    alertmanager: str,
    *,
    interval: str = "1s",
) -> dict[str, Any]:
    """Scrape ``jobs`` (job name → host:port targets) every ``interval``, evaluate
    ``rules`` as often, and send alerts to ``alertmanager`` (host:port)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            for job, targets in jobs.items()
        ],
    }


def without_consul_sd(config: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """``config`` with each ``consul_sd_configs`` replaced by a static placeholder target
    (the Consul server) and rule files made absolute against ``base_dir``."""
    scrapes = []
    for scrape in config.get("scrape_configs", []):
        scrape = dict(scrape)
        if consul := scrape.pop("consul_sd_configs", None):
            servers = [c.get("server", "127.0.0.1:8500") for c in consul]
            scrape.setdefault("static_configs", []).append({"targets": servers})
        scrapes.append(scrape)
    rules = [str(base_dir / p) for p in config.get("rule_files", [])]
    return {**config, "scrape_configs": scrapes, "rule_files": rules}


# ---- promtool / amtool -----------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    command: list[str]
    returncode: int
    output: str
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_tool(*argv: str, cwd: Path = REPO, timeout: float = 120) -> CheckResult:
    result = subprocess.run(
        list(argv), capture_output=True, text=True, cwd=cwd, timeout=timeout, check=False
    )
    return CheckResult(list(argv), result.returncode, result.stdout + result.stderr)


def promtool_has_consul_sd() -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "consul.yml"
        probe.write_text(
            "scrape_configs:\n  - job_name: probe\n"
            "    consul_sd_configs:\n      - server: 127.0.0.1:8500\n"
        )
        return run_tool(PROMTOOL_BIN, "check", "config", str(probe)).ok


TLS_FILES = ("ca_file", "cert_file", "key_file")


def missing_tls_files(config: Mapping[str, Any]) -> bool:
    """Whether a job's ``tls_config`` names a file not on this machine (a mount's)."""
    return any(
        not Path(tls[key]).exists()
        for scrape in config.get("scrape_configs", [])
        if (tls := scrape.get("tls_config"))
        for key in TLS_FILES
        if key in tls
    )


def with_tls_files(config: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """``config`` with every ``tls_config`` naming a fresh development PKI's files made in
    ``directory`` (a CA, a client certificate and its key)."""
    from services.devstack.pki import make_dev_pki

    pki = make_dev_pki(directory, {}, certificates=["prometheus"])
    files = {
        "ca_file": pki.ca,
        "cert_file": pki.cert("prometheus"),
        "key_file": pki.key("prometheus"),
    }
    scrapes = []
    for scrape in config.get("scrape_configs", []):
        scrape = dict(scrape)
        if tls := scrape.get("tls_config"):
            scrape["tls_config"] = {**tls, **{k: str(files[k]) for k in TLS_FILES if k in tls}}
        scrapes.append(scrape)
    return {**config, "scrape_configs": scrapes}


def check_config(path: Path) -> CheckResult:
    """``promtool check config path`` (see the module docstring for Consul SD and TLS)."""
    config = yaml.safe_load(path.read_text())
    uses_consul = any("consul_sd_configs" in s for s in config.get("scrape_configs", []))
    consul_copy = uses_consul and not promtool_has_consul_sd()
    tls_copy = missing_tls_files(config)
    if not consul_copy and not tls_copy:
        return run_tool(PROMTOOL_BIN, "check", "config", str(path))
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        base = path.parent.resolve()
        copied = dict(config, rule_files=[str(base / p) for p in config.get("rule_files", [])])
        if consul_copy:
            copied = without_consul_sd(copied, Path("/"))
            notes.append(
                f"{PROMTOOL_BIN} is built without Consul SD (Debian); {path} was checked with "
                "its consul_sd_configs replaced by static targets"
            )
        if tls_copy:
            copied = with_tls_files(copied, Path(tmp) / "pki")
            notes.append(f"{path}'s tls_config files were a development PKI's")
        copy = Path(tmp) / path.name
        copy.write_text(yaml.safe_dump(copied, sort_keys=False))
        result = run_tool(PROMTOOL_BIN, "check", "config", str(copy))
    return CheckResult(result.command, result.returncode, result.output, "; ".join(notes))


# ---- processes --------------------------------------------------------------------------


def _get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    """:func:`tests.support.waiting.wait_for` where a server not answering yet (OSError)
    or answering something unparsable (ValueError) counts as "not yet"."""
    return wait_for(check, timeout, what, every, tolerate=(OSError, ValueError))


@dataclass
class _Server:
    """A Prometheus-family server process on 127.0.0.1:``port``."""

    name: str
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, ready_timeout: float = 60) -> None:
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready within {ready_timeout}s:\n{self.tail()}")

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return _get_json(f"{self.url}{path}{query}")


class Prometheus(_Server):
    def __init__(self, config: Mapping[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        port = free_port()
        super().__init__(
            "prometheus",
            [
                PROMETHEUS_BIN,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            port,
            workdir / "prometheus.log",
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets")["data"]["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        """Every rule of every group, as /api/v1/rules gives them."""
        groups = self.get("/api/v1/rules")["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def alert_rule(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.rules() if r.get("name") == name), None)


class Alertmanager(_Server):
    def __init__(self, config: Mapping[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        port = free_port()
        super().__init__(
            "alertmanager",
            [
                ALERTMANAGER_BIN,
                f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",  # no gossip: a single test instance
            ],
            port,
            workdir / "alertmanager.log",
        )

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``; ``filters`` are label matchers (``group="x"``)."""
        params = [("filter", f'{k}="{v}"') for k, v in filters.items()]
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return list(_get_json(f"{self.url}/api/v2/alerts{query}"))


# ---- webhook receiver ------------------------------------------------------------------


class WebhookSink:
    """Records every JSON body POSTed to it, by path (an Alertmanager webhook receiver)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with lock:
                    sink.received.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> WebhookSink:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def tools_missing() -> list[str]:
    tools = (PROMETHEUS_BIN, PROMTOOL_BIN, ALERTMANAGER_BIN, AMTOOL_BIN)
    return [tool for tool in tools if shutil.which(tool) is None]


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0] != "check-config":
        print("usage: python -m tests.support.prom check-config FILE...", file=sys.stderr)
        return 2
    failed = False
    for name in argv[1:]:
        result = check_config(Path(name))
        print(result.output.rstrip())
        if result.note:
            print(f"NOTE: {result.note}")
        failed |= not result.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
