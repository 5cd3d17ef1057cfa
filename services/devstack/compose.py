"""Running deploy/docker-compose.yml with podman-compose, and waiting until it is healthy.

Debian's podman (4.3) runs health checks only through systemd timers, podman-compose
honours ``depends_on: condition: service_healthy`` only on podman >= 4.6, and podman 4.3's
``--requires`` (which podman-compose passes for ``depends_on``) cannot start a chain of
dependencies. So :func:`up` does what ``docker compose up --wait`` does, itself: it starts
the services in waves of the file's ``depends_on`` graph (``up -d --no-deps`` per wave) and
before the next wave runs each container's health check (``podman healthcheck run``) until
it passes, or, for a dependency with ``condition: service_completed_successfully``, waits
until it exited with 0. Starting everything at once is not enough: an assigner that starts
while one broker is up creates its state topic with replication 1.

Secure by default: ``up`` first makes the stack's PKI, tokens and policy on the host
(:mod:`services.devstack.compose_security`), which the compose file mounts read-only; every
mesh service then serves TLS with mTLS and wants a token. ``up --plaintext`` is the
developer's opt-in to plaintext (no TLS, no tokens, no authorization).

    python -m services.devstack.compose up      # PKI, up -d, then wait until healthy
    python -m services.devstack.compose up --plaintext
    python -m services.devstack.compose pki     # only the PKI (before `docker compose up`)
    python -m services.devstack.compose status  # each container, its state and health
    python -m services.devstack.compose down    # down -v, then check nothing is left
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.devstack import compose_security, podman

COMPOSE_FILE = podman.REPO / "deploy" / "docker-compose.yml"
PROJECT = "dataservice"  # the file's top-level `name`
UP_TIMEOUT = 300.0


class ComposeError(RuntimeError):
    """The stack did not come up, or did not go away."""


@dataclass(frozen=True)
class Container:
    name: str
    service: str
    state: str  # running, exited, ...
    health: str  # healthy, unhealthy, starting, or "" without a health check
    exit_code: int

    @property
    def one_shot(self) -> bool:
        """A container that ran to completion (kafka-init) is done, not down."""
        return self.state == "exited" and self.exit_code == 0 and self.service.endswith("-init")


def compose_argv(*args: str) -> list[str]:
    """``podman-compose -f deploy/docker-compose.yml ARGS``, from PATH or this venv."""
    exe = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not Path(exe).exists():
        podman.require("podman-compose")
    return [exe, "-f", str(COMPOSE_FILE), *args]


def compose(*args: str, env: Mapping[str, str] | None = None, timeout: float = 600) -> str:
    return podman.run(compose_argv(*args), env=env, timeout=timeout).stdout


def containers(project: str = PROJECT) -> list[Container]:
    out = podman.podman(
        "ps", "--all", "--format", "json", "--filter", f"label=io.podman.compose.project={project}"
    )
    found = []
    for item in json.loads(out or "[]"):
        labels = item.get("Labels") or {}
        names = item.get("Names") or [item.get("Id", "?")[:12]]
        found.append(
            Container(
                name=names[0],
                service=labels.get("com.docker.compose.service", names[0]),
                state=str(item.get("State", "")),
                health=_health(item),
                exit_code=int(item.get("ExitCode") or 0),
            )
        )
    return sorted(found, key=lambda c: c.service)


def _health(item: Mapping[str, object]) -> str:
    # podman ps prints "Up 5 seconds ago (healthy)" as Status; no separate field in 4.3.
    status = str(item.get("Status", ""))
    for health in ("unhealthy", "healthy", "starting"):
        if f"({health})" in status:
            return health
    return ""


def container_of(service: str, project: str = PROJECT) -> str:
    """The container name of ``service`` (one replica per service here)."""
    for c in containers(project):
        if c.service == service:
            return c.name
    raise ComposeError(f"no container for service {service!r} in project {project!r}")


def check_health(name: str) -> bool:
    """Run ``name``'s health check once (this records its status); True if it passed."""
    result = podman.run(
        [podman.require("podman"), "healthcheck", "run", name], check=False, timeout=60
    )
    return result.returncode == 0


def wait_healthy(
    project: str = PROJECT,
    timeout: float = UP_TIMEOUT,
    services: Sequence[str] | None = None,
    report: Callable[[str], None] | None = None,
) -> list[Container]:
    """Run the health checks of the project's containers (or of ``services``) until each
    passes; raise ComposeError naming the laggards (and their log tails) after ``timeout``.
    A container that exited fails at once, except a one-shot that ended with 0."""
    deadline = time.monotonic() + timeout
    healthy: set[str] = set()
    while True:
        current = [c for c in containers(project) if services is None or c.service in services]
        for c in current:
            if c.name in healthy or c.one_shot:
                continue
            if c.state == "exited":
                raise ComposeError(f"{c.service} exited with {c.exit_code}:\n{logs(c.name)}")
            if c.state == "running" and check_health(c.name):
                healthy.add(c.name)
                if report is not None:
                    report(f"compose: {c.service} healthy")
        waiting = [c for c in current if c.name not in healthy and not c.one_shot]
        if current and not waiting:
            return containers(project)
        if time.monotonic() > deadline:
            names = [c.service for c in waiting] or ["(no containers)"]
            tails = "\n".join(f"--- {c.service} ---\n{logs(c.name)}" for c in waiting)
            raise ComposeError(f"not healthy after {timeout:.0f}s: {', '.join(names)}\n{tails}")
        time.sleep(2)


def logs(name: str, lines: int = 30) -> str:
    result = podman.run(
        [podman.require("podman"), "logs", "--tail", str(lines), name], check=False, timeout=30
    )
    return (result.stdout + result.stderr).strip()


def waves(services: Mapping[str, Any]) -> list[list[str]]:
    """The services of a compose file's ``services`` mapping in start order: each wave holds
    the services whose ``depends_on`` are all in earlier waves."""
    needs = {name: set(_depends_on(spec)) for name, spec in services.items()}
    order: list[list[str]] = []
    done: set[str] = set()
    while len(done) < len(needs):
        wave = sorted(name for name, deps in needs.items() if name not in done and deps <= done)
        if not wave:
            raise ComposeError(f"depends_on has a cycle among {sorted(set(needs) - done)}")
        order.append(wave)
        done.update(wave)
    return order


def completed_conditions(services: Mapping[str, Any]) -> set[str]:
    """Services others wait for with ``condition: service_completed_successfully``."""
    return {
        dep
        for spec in services.values()
        for dep, how in _depends_on(spec).items()
        if how.get("condition") == "service_completed_successfully"
    }


def _depends_on(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    deps = spec.get("depends_on") or {}
    if isinstance(deps, list):  # the short form: started, no condition
        return {name: {} for name in deps}
    return {name: dict(how or {}) for name, how in deps.items()}


def wait_completed(service: str, timeout: float) -> None:
    """Wait until ``service``'s container exited with 0 (a one-shot, like kafka-init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = next((c for c in containers() if c.service == service), None)
        if c is not None and c.state == "exited":
            if c.exit_code != 0:
                raise ComposeError(f"{service} exited with {c.exit_code}:\n{logs(c.name)}")
            return
        time.sleep(1)
    raise ComposeError(
        f"{service} did not complete in {timeout:.0f}s:\n{logs(container_of(service))}"
    )


def security_env(plaintext: bool, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A fresh PKI for the stack, and the variables the compose file reads for it: where it
    is (``DS_COMPOSE_PKI``) and, with ``plaintext``, ``DS_PLAINTEXT=1`` and a Prometheus
    configuration scraping over plain HTTP (unless ``env`` names one)."""
    pki = compose_security.make_compose_pki()
    out = {**(env or {}), "DS_COMPOSE_PKI": str(pki.directory)}
    if plaintext:
        out["DS_PLAINTEXT"] = "1"
        if "DS_PROMETHEUS_CONFIG" not in out:
            secure_config = COMPOSE_FILE.parent / "prometheus" / "prometheus-compose.yml"
            plain = compose_security.write_plaintext_prometheus(secure_config, pki.directory.parent)
            out["DS_PROMETHEUS_CONFIG"] = str(plain)
    return out


def up(
    env: Mapping[str, str] | None = None, timeout: float = UP_TIMEOUT, *, plaintext: bool = False
) -> list[Container]:
    """Make the stack's PKI, then start the stack wave by wave, each wave healthy (or
    completed) before the next; ``plaintext``: the developer's opt-in to no TLS, no
    tokens."""
    env = security_env(plaintext, env)
    services: Mapping[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    one_shots = completed_conditions(services)
    deadline = time.monotonic() + timeout
    for wave in waves(services):
        compose("up", "-d", "--no-deps", *wave, env=env, timeout=timeout)
        remaining = max(1.0, deadline - time.monotonic())
        for service in (s for s in wave if s in one_shots):
            wait_completed(service, remaining)
            print(f"compose: {service} completed", flush=True)
        others = [s for s in wave if s not in one_shots]
        if others:
            wait_healthy(timeout=remaining, services=others, report=print)
    return containers()


def volumes() -> set[str]:
    """Every volume podman has (named or anonymous)."""
    return set(podman.podman("volume", "ls", "--quiet").split())


def leftovers(project: str = PROJECT, volumes_before: set[str] | None = None) -> list[str]:
    """Containers, pods and volumes of ``project`` still there (none after ``down -v``); with
    ``volumes_before``, also any volume created since, anonymous ones included."""
    label = f"label=io.podman.compose.project={project}"
    found = [f"container {c.name}" for c in containers(project)]
    pods = podman.podman("pod", "ps", "--format", "{{.Name}}", "--filter", f"name=pod_{project}")
    found += [f"pod {name}" for name in pods.split()]
    named = set(podman.podman("volume", "ls", "--format", "{{.Name}}", "--filter", label).split())
    new = volumes() - volumes_before if volumes_before is not None else set()
    found += [f"volume {name}" for name in sorted(named | new)]
    return found


def down(env: Mapping[str, str] | None = None) -> None:
    """``down -v``; raise ComposeError if a container, pod or volume is left."""
    compose("down", "-v", "-t", "30", env=env)
    if left := leftovers():
        raise ComposeError(f"left after down -v: {', '.join(left)}")


def status() -> str:
    rows = [f"{'service':<14} {'container':<28} {'state':<9} health"]
    rows += [f"{c.service:<14} {c.name:<28} {c.state:<9} {c.health}" for c in containers()]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.devstack.compose")
    parser.add_argument("command", choices=["up", "pki", "wait", "status", "down"])
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="up: no TLS, no tokens, no authorization (a developer's opt-in; the default is "
        "mTLS and tokens everywhere)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "pki":
            print(compose_security.make_compose_pki().directory)
            return
        if args.command == "up":
            up(plaintext=args.plaintext)
        elif args.command == "wait":
            wait_healthy(report=print)
        elif args.command == "down":
            down()
        if args.command != "down":
            print(status())
        if args.command == "up":
            _print_usage(args.plaintext)
    except (ComposeError, podman.PodmanError) as exc:
        print(f"compose: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _print_usage(plaintext: bool) -> None:
    if plaintext:
        print("compose: PLAINTEXT (--plaintext): no TLS, no tokens, no authorization")
        return
    pki = compose_security.pki_dir()
    print(f"compose: secure (mTLS and tokens); the CA, certificates and tokens are in {pki}/")
    print("Use dsctl (or an application) from the host with:")
    print(f"  export DS_TLS__CA_FILE={pki}/ca.pem DS_TLS__CERT_FILE={pki}/client.pem")
    print(f"  export DS_TLS__KEY_FILE={pki}/client.key DS_TLS__TOKEN_FILE={pki}/admin.jwt")
    print(f"  export DS_TLS__SIDECAR_TOKEN_FILE={pki}/admin.sidecar.jwt")
    print("  dsctl describe orders-demo")


if __name__ == "__main__":
    main()
