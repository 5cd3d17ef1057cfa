"""Issue 21 acceptance: kill -9 the broker leading a partition a sidecar reads, on the
3-broker cluster (the chaos suite's fixture; not a chaos scenario: nothing here accounts
for every record), with a producer writing and a client fetching and acking. The sidecar's
``ds_partition_not_fetching_current_seconds`` of that partition rises above 0 while the
leader is gone, ``ds_partition_not_fetching_seconds`` counts the gap once a new leader
serves it, partitions led by the other brokers show no gap, and DsPartitionNotFetching
fires in a real Prometheus scraping the sidecar.

The shipped rule fires at a 30 s gap held for 30 s, longer than a failover (which is the
point of its threshold): the test's Prometheus evaluates the repo's rule with the threshold
at 3 s and ``for:`` at 1 s (its expression otherwise unchanged), so the alert fires within
the ~10 s the partition has no leader (KRaft fences the dead broker after
``broker.session.timeout.ms``, 9 s).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from dsclient import DsClient
from services.devstack.kafka import KafkaCluster, TopicFactory
from tests.support import prom
from tests.support.mesh import running_mesh

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 3
ALERT = "DsPartitionNotFetching"
SHIPPED_THRESHOLD = "> 30"
TEST_THRESHOLD = "> 3"


def gap_rule_file(dest: Path) -> Path:
    """The repo's DsPartitionNotFetching with a 3 s threshold and ``for: 1s``."""
    doc = yaml.safe_load(prom.RULES_DIR.joinpath("alerts.yml").read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    assert rule["expr"].endswith(SHIPPED_THRESHOLD), rule["expr"]
    rule = {**rule, "expr": rule["expr"].removesuffix(SHIPPED_THRESHOLD) + TEST_THRESHOLD}
    rule["for"] = "1s"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "gap.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gap", "rules": [rule]}]}))
    return path


class Load:
    """A producer writing to every partition and a client fetching and acking, on two
    threads, counting what was acked per partition."""

    def __init__(self, bootstrap: str, topic: str, group: str, assigner: str) -> None:
        self.acked: Counter[int] = Counter()
        self.produced = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, args=(bootstrap, topic), daemon=True),
            threading.Thread(target=self._consume, args=(group, assigner), daemon=True),
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _produce(self, bootstrap: str, topic: str) -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
        seq = 0
        while not self._stop.is_set():
            for partition in range(PARTITIONS):
                producer.produce(topic, value=b"v%d" % seq, partition=partition)
                seq += 1
            producer.poll(0)
            time.sleep(0.02)  # ~150 records/s
        producer.flush(10)
        self.produced = seq

    def _consume(self, group: str, assigner: str) -> None:
        with DsClient(group, client_id="gap-app", assigner=assigner) as client:
            while not self._stop.is_set():
                try:
                    batch = client.fetch(max_records=500, max_wait=0.5)
                    if batch:
                        client.ack(batch)
                        self.acked.update(r.partition for r in batch)
                except Exception as exc:  # a commit refused while the coordinator moves
                    print(f"client: {exc!r}")
                    time.sleep(0.2)


def test_killing_a_partitions_leader_shows_its_not_fetching_gap_and_fires_the_alert(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    cluster = kafka_cluster3
    topics = TopicFactory(cluster.bootstrap, "not-fetching")
    topic = topics(PARTITIONS, replication=3, config={"min.insync.replicas": "2"})
    group = f"gap-{uuid.uuid4().hex[:8]}"
    killed: list[int] = []  # the broker _run killed, restarted whatever _run ends with
    try:
        with running_mesh(cluster.bootstrap, tmp_path) as mesh:
            assigner = mesh.assigner([(group, [topic])])
            sidecar = mesh.sidecar(
                group, assigner, "sidecar-gap", env={"DS_STATISTICS_INTERVAL_MS": "1000"}
            )
            assigner.wait_serving(90)
            sidecar.wait_serving(90)
            prometheus = prom.Prometheus(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(gap_rule_file(tmp_path / "rules"))],
                    "scrape_configs": [
                        {
                            "job_name": "ds-sidecar",
                            "static_configs": [{"targets": [f"127.0.0.1:{sidecar.http_port}"]}],
                        }
                    ],
                },
                tmp_path / "prometheus",
            )
            prometheus.start()
            try:
                with Load(cluster.bootstrap, topic, group, assigner.grpc_addr) as load:
                    _run(cluster, topic, group, prometheus, load, killed)
            finally:
                prometheus.stop()
    finally:
        for victim in killed:  # a failed run too: the cluster is shared by later tests
            cluster.start_broker(victim)
            prom.wait_until(lambda: cluster.fully_replicated(topic), 120, "replicas in sync")
        topics.delete_all()


def _run(
    cluster: KafkaCluster,
    topic: str,
    group: str,
    prometheus: prom.Prometheus,
    load: Load,
    killed: list[int],
) -> None:
    sel = f'group="{group}",topic="{topic}"'

    def query(expr: str) -> dict[str, float]:
        return {r["metric"]["partition"]: float(r["value"][1]) for r in prometheus.query(expr)}

    # Every partition flows and Prometheus sees each partition's gauge at 0.
    prom.wait_until(
        lambda: len(load.acked) == PARTITIONS and min(load.acked.values()) >= 20,
        90,
        "records of every partition acked",
    )
    prom.wait_until(
        lambda: (
            query(f"ds_partition_not_fetching_current_seconds{{{sel}}}")
            == {str(p): 0.0 for p in range(PARTITIONS)}
        ),
        30,
        "every partition's gap gauge at 0 in Prometheus",
    )
    leaders = cluster.partition_leaders(topic)
    victim = leaders[0]
    others = [p for p, leader in leaders.items() if leader != victim]
    print(f"leaders {leaders}: killing broker {victim}, leader of partition 0")
    acked_before = load.acked[0]
    killed_at = time.monotonic()
    cluster.kill_broker(victim)
    killed.append(victim)

    # The gauge of partition 0 rises while its leader is gone.
    seen = prom.wait_until(
        lambda: (
            (v := query(f'ds_partition_not_fetching_current_seconds{{{sel},partition="0"}}'))
            and v["0"] > 0
            and v["0"]
        ),
        60,
        "partition 0's not-fetching gauge above 0",
    )
    visible_after = time.monotonic() - killed_at
    # The alert fires in Prometheus for that partition.
    fired = prom.wait_until(
        lambda: (
            (rule := prometheus.alert_rule(ALERT)) is not None
            and [
                a
                for a in rule["alerts"]
                if a["state"] == "firing"
                and a["labels"].get("group") == group
                and a["labels"].get("partition") == "0"
            ]
        ),
        60,
        f"{ALERT} firing for partition 0",
    )
    fired_after = time.monotonic() - killed_at
    assert fired[0]["labels"]["topic"] == topic and fired[0]["labels"]["severity"] == "warning"
    peak = max(seen, float(fired[0]["value"]))

    # A new leader serves partition 0: records flow again and the histogram counts the gap.
    gaps = prom.wait_until(
        lambda: (
            (c := query(f'ds_partition_not_fetching_seconds_count{{{sel},partition="0"}}'))
            and c["0"] >= 1
            and c
        ),
        90,
        "partition 0's gap counted in ds_partition_not_fetching_seconds",
    )
    counted_after = time.monotonic() - killed_at
    new_leader = cluster.partition_leaders(topic)[0]
    assert new_leader not in (victim, -1), new_leader
    prom.wait_until(lambda: load.acked[0] > acked_before, 30, "partition 0 acked again")
    gap_sum = query(f'ds_partition_not_fetching_seconds_sum{{{sel},partition="0"}}')["0"]
    assert gap_sum >= peak - 1.0  # the gap counted is the one the gauge showed (1 s scrapes)
    # The open gap is 0 again once partition 0 fetches; waited for rather than read once:
    # librdkafka's statistics (1 s) may show the partition idle for one more window after
    # the move (CI, 2 Dec: 1.0 s read right after the first ack).
    prom.wait_until(
        lambda: (
            query(f'ds_partition_not_fetching_current_seconds{{{sel},partition="0"}}') == {"0": 0.0}
        ),
        30,
        "partition 0's open gap back to 0",
    )
    # Partitions led by the surviving brokers kept fetching: no gap counted, none open.
    counts = query(f"ds_partition_not_fetching_seconds_count{{{sel}}}")
    current = query(f"ds_partition_not_fetching_current_seconds{{{sel}}}")
    assert all(counts.get(str(p), 0.0) == 0.0 for p in others), (others, counts)
    assert all(current[str(p)] == 0.0 for p in others), (others, current)
    print(
        f"broker {victim} killed: gauge > 0 after {visible_after:.1f} s, {ALERT} firing after "
        f"{fired_after:.1f} s (gauge peak seen {peak:.1f} s), gap counted after "
        f"{counted_after:.1f} s: {gaps['0']:.0f} gap(s), {gap_sum:.1f} s in all; new leader "
        f"broker {new_leader}; other partitions {others}: no gap; acked per partition "
        f"{dict(sorted(load.acked.items()))}"
    )
