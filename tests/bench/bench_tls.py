"""Benchmark: sidecar throughput with TLS, mTLS, tokens and authorization on, beside
plaintext, in the same run.

    .venv/bin/python tests/bench/bench_tls.py [--short] [--bootstrap HOST:PORT]

Starts a local 1-broker KafkaCluster (unless --bootstrap), produces N records of 100 B and
reads them all through one sidecar, ROUNDS times interleaved per mode, each round with a
fresh group and a fresh sidecar:

(p) plaintext: the embedded default (``make run``);
(s) secure: what ``dsctl dev up --secure`` runs: every service and the application with
    TLS and mTLS (a development CA, ``services.devstack.pki``), a bearer token (a JWT
    verified with PyJWT on every call) and the authorization interceptor on.

both with ``DsClient.fetch`` + ``ack(batch)`` (Fetch) and with ``DsClient.stream`` over the
``Stream`` RPC + ``ack(batch)`` (Stream), as in tests/bench/bench_sidecar.py (b) and (c).
Prints the best rate of each (as ``timeit`` keeps the best), the median beside it, the
ratio secure/plaintext, and the CPU seconds per million records of the application and the
sidecar over the best run's window. Never asserts a time. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dsclient import DsClient
from dsclient.connection import DEFAULT_SETTINGS, ConnectionSettings, TlsConfig
from services.devstack.kafka import create_topic, delete_topic
from services.devstack.pki import DevPki, make_dev_pki
from services.devstack.secure import service_env
from tests.bench.bench_sidecar import (
    FETCH_MAX,
    FETCH_MAX_BYTES,
    STREAM_CREDIT,
    CpuWindow,
    Rate,
    best,
    ratio,
    read_records,
)
from tests.support.bench_kafka import bench_kafka
from tests.support.mesh import Mesh, ServiceProcess, running_mesh
from tests.support.sidecar_probe import produce_bulk, start_sidecar

PARTITIONS = 8
SHORT = (300_000, 3)  # records, rounds
FULL = (1_000_000, 3)
APP = "bench-app"


def read_all(
    mesh: Mesh,
    assigner: ServiceProcess,
    group: str,
    n: int,
    *,
    stream: bool,
    sidecar_env: Callable[[str], dict[str, str]],
    connection: ConnectionSettings,
) -> Rate:
    """Every record of the group's topic through a fresh sidecar, acked batch by batch;
    the rate from the first batch to the last (the first batch uncounted)."""
    sidecar_id = f"bench-{group[-16:]}"
    sidecar = start_sidecar(mesh, group, assigner, sidecar_id, env=sidecar_env(sidecar_id))
    sidecar.wait_serving()
    started = time.monotonic()
    cpu = CpuWindow({"app": os.getpid(), "sidecar": sidecar.pid})
    got, first = 0, None
    try:
        with DsClient(
            group, client_id=APP, assigner=assigner.grpc_addr, connection=connection
        ) as c:
            batches = (
                c.stream(STREAM_CREDIT, use_stream_rpc=True)
                if stream
                else iter(lambda: c.fetch(FETCH_MAX, max_wait=1.0, max_bytes=FETCH_MAX_BYTES), None)
            )
            for batch in batches:
                if not batch:
                    if time.monotonic() > started + 300:
                        break
                    continue
                read = read_records(batch)
                if c.ack(batch) != read:
                    raise RuntimeError("a batch was not acked whole")
                if first is None:
                    first = time.monotonic()
                    cpu.start()
                    n -= read
                else:
                    got += read
                if got >= n or time.monotonic() > started + 300:
                    break
            took = time.monotonic() - (first or started)
            used = cpu.used() if first else {}
        return Rate(got, took, used)
    finally:
        sidecar.stop()


def plain_env(_name: str) -> dict[str, str]:
    return {}


def secure_env(pki: DevPki) -> Callable[[str], dict[str, str]]:
    """A service's secure environment by its name: each sidecar has its own certificate
    and token, and the policy gives its id to it alone."""
    return lambda name: dict(service_env(pki, name))


def run(bootstrap: str, records: int, rounds: int, log_dir: Path) -> None:
    run_id = uuid.uuid4().hex[:6]
    topic = f"bench-tls-{run_id}"
    modes = ("fetch-p", "fetch-s", "stream-p", "stream-s")
    groups = {f"{m}{i}": f"g-{m}{i}-{run_id}" for m in modes for i in range(rounds)}
    sidecar_ids = [f"bench-{g[-16:]}" for g in groups.values()]
    roles = {"assigner": ["reporter"], APP: ["reader:*"]}
    roles.update(
        {
            s: ["sidecar", f"serves:{g}", "reporter"]
            for s, g in zip(sidecar_ids, groups.values(), strict=True)
        }
    )
    pki = make_dev_pki(log_dir / "pki", roles, certificates=["assigner", APP, *sidecar_ids])
    plain_connection = DEFAULT_SETTINGS
    secure_connection = DEFAULT_SETTINGS.with_tls(
        TlsConfig(
            ca_file=pki.ca,
            cert_file=pki.cert(APP),
            key_file=pki.key(APP),
            token_file=pki.token(APP),
            sidecar_token_file=pki.sidecar_token(APP),
        )
    )
    create_topic(bootstrap, topic, PARTITIONS)
    try:
        took = produce_bulk(bootstrap, topic, records, 100, PARTITIONS)
        print(
            f"== {records} records x 100 B (produced in {took:.1f}s); best and median of "
            f"{rounds} interleaved rounds; fresh group and sidecar per round",
            flush=True,
        )
        config = [(g, [topic]) for g in groups.values()]
        for side in ("plain", "secure"):
            (log_dir / side).mkdir()
        with (
            running_mesh(bootstrap, log_dir / "plain") as plain,
            running_mesh(bootstrap, log_dir / "secure") as secure,
        ):
            plain_assigner = plain.assigner(config)
            # Two assigner clusters on one Kafka: each its own state topic and transactional
            # id, or the second one's term would fence the first (as it must for replicas).
            secure_assigner = secure.assigner(
                config,
                env={
                    **secure_env(pki)("assigner"),
                    "DS_STATE_TOPIC": "__ds_assigner_state_bench_tls",
                    "DS_STATE_TRANSACTIONAL_ID": "ds-assigner-state-bench-tls",
                },
            )
            plain_assigner.wait_serving()
            secure_assigner.wait_serving()
            rates: dict[str, list[Rate]] = {m: [] for m in modes}
            runs: dict[str, Callable[[int], Rate]] = {
                "fetch-p": lambda i: read_all(
                    plain, plain_assigner, groups[f"fetch-p{i}"], records,
                    stream=False, sidecar_env=plain_env, connection=plain_connection,
                ),
                "fetch-s": lambda i: read_all(
                    secure, secure_assigner, groups[f"fetch-s{i}"], records,
                    stream=False, sidecar_env=secure_env(pki),
                    connection=secure_connection,
                ),
                "stream-p": lambda i: read_all(
                    plain, plain_assigner, groups[f"stream-p{i}"], records,
                    stream=True, sidecar_env=plain_env, connection=plain_connection,
                ),
                "stream-s": lambda i: read_all(
                    secure, secure_assigner, groups[f"stream-s{i}"], records,
                    stream=True, sidecar_env=secure_env(pki),
                    connection=secure_connection,
                ),
            }  # fmt: skip
            for i in range(rounds):
                for mode in modes:
                    rates[mode].append(runs[mode](i))
                print(
                    f"   round {i + 1}: "
                    + "  ".join(f"({m}) {v[-1].per_second:,.0f}" for m, v in rates.items())
                    + " rec/s",
                    flush=True,
                )
        for rpc in ("fetch", "stream"):
            p, s = best(rates[f"{rpc}-p"]), best(rates[f"{rpc}-s"])
            p_med = statistics.median(r.per_second for r in rates[f"{rpc}-p"])
            s_med = statistics.median(r.per_second for r in rates[f"{rpc}-s"])
            name = "Fetch + ack " if rpc == "fetch" else "Stream + ack"
            print(f"{name} plaintext  best {p}  median {p_med:,.0f} rec/s")
            print(f"{name} TLS+mTLS+token+authz  best {s}  median {s_med:,.0f} rec/s")
            print(
                f"{name} ratio secure/plaintext: best {ratio(s, p)}, median "
                f"{s_med / p_med if p_med else float('nan'):.2f}"
            )
            print(f"     (p) {p.cpu_line()}")
            print(f"     (s) {s.cpu_line()}", flush=True)
    finally:
        try:
            delete_topic(bootstrap, topic)
        except Exception as exc:  # a bench must still print what it measured
            print(f"could not delete {topic}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI profile")
    parser.add_argument("--bootstrap", help="use this Kafka instead of starting one")
    args = parser.parse_args()
    records, rounds = SHORT if args.short else FULL
    started = time.monotonic()
    with (
        bench_kafka(args.bootstrap) as kafka,
        tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp,
    ):
        run(kafka.bootstrap, records, rounds, Path(tmp))
    print(f"\ntotal {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
