"""What the compose tests do to the running stack and how they count its records.

* :class:`Stack`: the containers of deploy/docker-compose.yml by service (kill, stop,
  start, restart, pause), the assigner leader from Consul's KV, the group's leases from
  ``dsctl describe``, and waits on health checks (podman 4.3 runs them only when asked).
* :class:`Received`: every delivery the two demo applications logged (``GET /received``
  over HTTPS with the stack's client certificate: the stack is secure by default), read
  incrementally.
* :func:`account`: produced (Kafka-confirmed placements of a :class:`SeqProducer`) against
  received — lost, duplicates, and why each duplicate came: its first delivery's ack was
  refused or failed (its sidecar died, its lease moved, or it expired unacked), the one way
  at-least-once delivery may repeat a record. An accepted ack is never followed by another
  delivery of the same offset.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsclient.leader_watch import DEFAULT_LEADER_KEY, leader_of
from services.devstack import compose, compose_security, podman
from services.devstack.pki import DevPki
from tests.support.records import SeqProducer

BOOTSTRAP = "127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292"
CONSUL = "127.0.0.1:8500"
GROUP = "orders-demo"
TOPIC = "orders.events"
PARTITIONS = 6
DEMO_APPS = ("https://127.0.0.1:7082", "https://127.0.0.1:7182")
ASSIGNERS = {"127.0.0.1:7070": "assigner-1", "127.0.0.1:7170": "assigner-2"}


def http_json(url: str, timeout: float = 5.0, context: ssl.SSLContext | None = None) -> Any:
    with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
        return json.loads(response.read())


def pki() -> DevPki:
    """The running stack's PKI (``compose up`` made it)."""
    return DevPki(compose_security.pki_dir())


def client_tls(certificate: str = compose_security.CLIENT) -> ssl.SSLContext:
    """HTTPS to the mesh's ports: the stack's CA, and ``certificate`` (mTLS)."""
    files = pki()
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(files.cert(certificate), files.key(certificate))
    return context


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a service restarting refuses connections meanwhile
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Stack:
    """The running compose project; ``volumes_before``: every volume before it came up."""

    def __init__(self, volumes_before: set[str]) -> None:
        self.volumes_before = volumes_before

    def container(self, service: str) -> str:
        return compose.container_of(service)

    def podman(self, *args: str) -> str:
        return podman.podman(*args, timeout=120)

    def state(self, service: str) -> str:
        return next(c.state for c in compose.containers() if c.service == service)

    def wait_healthy(self, *services: str, timeout: float = 120) -> None:
        compose.wait_healthy(timeout=timeout, services=services or None)

    def leader(self) -> str | None:
        """The leading assigner's gRPC address, from Consul's KV (None while there is none)."""
        url = f"http://{CONSUL}/v1/kv/{DEFAULT_LEADER_KEY}"
        try:
            entries = http_json(url)
        except OSError:
            return None
        entry = dict(entries[0]) if entries else {}
        if entry.get("Value"):
            entry["Value"] = base64.b64decode(entry["Value"])
        return leader_of(entry)

    def describe(self) -> dict[str, Any]:
        """``dsctl describe GROUP --output json`` against the leader."""
        leader = self.leader() or "127.0.0.1:7070"
        env = {**os.environ, **compose_security.client_env(pki(), "admin")}
        out = subprocess.run(
            [sys.executable, "-m", "services.dsctl", "describe", GROUP, "--output", "json",
             "--assigner", leader],
            capture_output=True, text=True, timeout=30, check=True, env=env,
        ).stdout  # fmt: skip
        result: dict[str, Any] = json.loads(out)
        return result

    def holders(self) -> dict[str, int]:
        """Granted partitions per sidecar id."""
        counts: dict[str, int] = defaultdict(int)
        for lease in self.describe()["leases"]:
            if lease["state"] == "granted":
                counts[lease["holder"]] += 1
        return dict(counts)

    def wait_balanced(self, timeout: float = 60) -> dict[str, int]:
        """Both sidecars hold three partitions each."""
        return wait_until(  # type: ignore[no-any-return]
            lambda: (h := self.holders()) == {"sidecar-a": 3, "sidecar-b": 3} and h,
            timeout,
            "the group balanced over both sidecars",
        )


@dataclass(frozen=True)
class Delivery:
    key: str
    partition: int
    offset: int
    epoch: int
    received_ms: int
    acked: bool
    app: str


@dataclass
class Received:
    """Every delivery both demo applications logged, read page by page."""

    deliveries: list[Delivery] = field(default_factory=list)
    _next: dict[str, int] = field(default_factory=dict)

    def poll(self) -> list[Delivery]:
        tls = client_tls()
        for app in DEMO_APPS:
            while True:
                url = f"{app}/received?since={self._next.get(app, 0)}"
                page = http_json(url, context=tls)
                if page["first"] > self._next.get(app, 0):
                    raise AssertionError(f"{app} dropped log entries before {page['first']}")
                self.deliveries += [
                    Delivery(key, p, o, epoch, ms, acked, app)
                    for key, topic, p, o, epoch, ms, acked in page["records"]
                    if topic == TOPIC
                ]
                self._next[app] = page["next"]
                if page["next"] >= page["total"]:
                    break
        return self.deliveries

    def placements(self) -> set[tuple[int, int]]:
        return {(d.partition, d.offset) for d in self.poll()}

    def wait_all(self, producer: SeqProducer, confirmed: set[int], timeout: float) -> None:
        wanted = {producer.placed[s] for s in confirmed}
        deadline = time.monotonic() + timeout
        while not wanted <= self.placements() and time.monotonic() < deadline:
            time.sleep(1)


@dataclass(frozen=True)
class Account:
    produced: int
    received: int  # deliveries, copies included
    lost: int
    duplicates: int  # deliveries beyond the first of a record
    refused_then_redelivered: int  # duplicates whose earlier delivery's ack was not accepted
    unexplained: list[str]

    def line(self, fault: str, seconds: float) -> str:
        return (
            f"compose fault {fault}: produced {self.produced}, received {self.received}, "
            f"lost {self.lost}, duplicates {self.duplicates} ({self.refused_then_redelivered} "
            "redelivered after their first delivery's ack was refused or failed: the sidecar "
            f"died, the lease moved or the delivery expired), unexplained "
            f"{len(self.unexplained)}; {seconds:.0f}s"
        )


def account(producer: SeqProducer, confirmed: set[int], received: Received) -> Account:
    """Produced vs received for the records ``producer`` placed (by partition and offset)."""
    return count({producer.placed[s]: str(s) for s in confirmed}, received.poll())


def count(placed: dict[tuple[int, int], str], deliveries: list[Delivery]) -> Account:
    """Count ``deliveries`` against the records ``placed`` (partition and offset -> key).

    Copies of one record are put in delivery order by lease epoch first: an application
    logs a batch only once its ack returned, which may be long after the batch was fetched
    (its sidecar was killed mid-ack), so the log time alone can put a copy delivered under
    an older lease after one delivered under the newer lease."""
    copies: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
    unexplained: list[str] = []
    for d in deliveries:
        where = (d.partition, d.offset)
        if where in placed:
            if d.key != placed[where]:
                unexplained.append(
                    f"p{d.partition}@{d.offset} has key {d.key}, not {placed[where]}"
                )
            copies[where].append(d)
    lost = len(placed) - len(copies)
    duplicates = refused = 0
    for where, ds in copies.items():
        ds.sort(key=lambda d: (d.epoch, d.received_ms))
        for earlier, later in itertools.pairwise(ds):
            duplicates += 1
            if not earlier.acked:
                refused += 1
            else:
                unexplained.append(
                    f"p{where[0]}@{where[1]} delivered again (epoch {earlier.epoch} -> "
                    f"{later.epoch}, to {later.app}) after its ack was accepted"
                )
    return Account(
        produced=len(placed),
        received=sum(len(ds) for ds in copies.values()),
        lost=lost,
        duplicates=duplicates,
        refused_then_redelivered=refused,
        unexplained=unexplained,
    )


def run_fault(
    stack: Stack,
    received: Received,
    fault: Callable[[], None],
    *,
    rate: float = 200.0,
    before: float = 4.0,
    after: float = 5.0,
) -> tuple[Account, float]:
    """Produce at ``rate`` records/s, let the stack settle ``before`` seconds, run ``fault``
    (which returns once the stack recovered), produce ``after`` seconds more, then wait
    until every record was received and count."""
    started = time.monotonic()
    received.poll()  # skip what earlier tests logged
    producer = SeqProducer(BOOTSTRAP, TOPIC, PARTITIONS, rate=rate).start()
    try:
        time.sleep(before)
        fault()
        time.sleep(after)
    finally:
        confirmed = producer.stop()
    received.wait_all(producer, confirmed, timeout=120)
    return account(producer, confirmed, received), time.monotonic() - started


def assert_clean(result: Account) -> None:
    assert result.produced > 0
    assert result.lost == 0, f"{result.lost} records lost"
    assert not result.unexplained, "; ".join(result.unexplained[:5])
