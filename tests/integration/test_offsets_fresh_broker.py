"""The assigner's offsets reader on a fresh broker, where group coordinators are still moving.

Until ``__consumer_offsets`` is loaded, Kafka answers OffsetFetch with NOT_COORDINATOR, and
librdkafka 2.16 dereferences a NULL consumer group when an AdminClient gets that answer
(confluentinc/librdkafka#5040): the assigner died with SIGSEGV at its first DescribeGroup.
The read runs in a child process so that such a crash fails this test instead of pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.devstack.kafka import KafkaCluster, KafkaOptions, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
GROUPS = 60  # spread over __consumer_offsets' 50 partitions: some are not loaded yet

READ_MANY = """
import json, sys
from services.assigner.kafka_offsets import KafkaOffsets
from services.runtime.topic_partition import TopicPartition
from dsclient.reasons import DsError
from services.runtime.settings import ServiceSettings

bootstrap, topic, groups = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = ServiceSettings(bootstrap=bootstrap, grpc_port=0, http_port=0)
reader = KafkaOffsets(settings, timeout=60.0)
try:
    read = reader.read_many({f"g{i}": [TopicPartition(topic, 0)] for i in range(groups)})
finally:
    reader.close()
print(json.dumps({
    g: r.message if isinstance(r, DsError) else [[o.committed, o.end] for o in r.values()]
    for g, r in read.items()
}))
"""


def test_first_group_offsets_read_on_a_fresh_broker(tmp_path: Path) -> None:
    cluster = KafkaCluster(KafkaOptions(brokers=1, base_dir=tmp_path / "kafka")).start()
    try:
        create_topic(cluster.bootstrap, "t-fresh", 1)
        child = subprocess.run(
            [sys.executable, "-c", READ_MANY, cluster.bootstrap, "t-fresh", str(GROUPS)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=REPO,
            env=dict(os.environ),
        )
    finally:
        cluster.stop()
    assert child.returncode == 0, f"reader exited {child.returncode}:\n{child.stderr[-2000:]}"
    read = json.loads(child.stdout)
    # Every group answered: no committed offset yet (-1), an empty partition (end 0).
    assert read == {f"g{i}": [[-1, 0]] for i in range(GROUPS)}
