"""``dsctl config set`` of the group settings ``ordering`` (issue 39) and ``commit_fencing``
(issue 36) on the real stack: an assigner with its own state topic, one sidecar, two
``DsClient`` readers of a one-partition topic whose records all have one key.

* unordered (the group's default): the two readers hold records of the key at once (the
  measure can fail);
* ``dsctl config set G ordering=key``: stored (DescribeGroup), run by the sidecar (its
  member reports the new version) and applied: the second reader gets nothing while the
  first holds a record of the key, and the next record once it is acked;
* ``ordering=unordered commit_fencing=kafka``: one version; unordered again, live, and the
  sidecar takes kafka fencing for its next grants (its log);
* the way back, ``commit_fencing=lease``, is refused by the assigner (exit 1, its reason);
  nothing is stored. (A bad value is refused by dsctl itself, before any call:
  tests/unit/dsctl/test_group_settings.py.)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from dataservice.assigner.v1 import admin_pb2, admin_pb2_grpc, types_pb2
from dsclient import DsClient
from dsclient.batch import Batch
from services.devstack.kafka import TopicFactory
from services.dsctl.app import app
from tests.support.assignment import wait_stable
from tests.support.mesh import Mesh
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RECORDS = 8
SWITCHED = "commit fencing: applies to the next grant"


def describe(assigner: str, group: str) -> admin_pb2.DescribeGroupResponse:
    with grpc.insecure_channel(assigner) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return stub.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group), timeout=10)


def take(client: DsClient, wait: float) -> Batch:
    """At most one record, within ``wait`` s."""
    return client.fetch(max_records=1, max_wait=wait)


def test_config_set_changes_ordering_and_commit_fencing_live(
    mesh: Mesh, topic_factory: TopicFactory, own_state: dict[str, str]
) -> None:
    topic = topic_factory(partitions=1)
    group = f"cfg-set-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": mesh.bootstrap})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k", value=b"%d" % i)
    assert producer.flush(30) == 0
    # A long visibility timeout: a record held is not due again during the test.
    assigner = mesh.assigner(
        [(group, [topic])], settings={"visibility_timeout_seconds": "120"}, env=own_state
    )
    sidecar = mesh.sidecar(group, assigner, "sc-1")  # it retries until the assigner serves
    assigner.wait_serving()
    sidecar.wait_serving()
    wait_stable(assigner.grpc_addr, group, ["sc-1"], 1)
    addr = assigner.grpc_addr
    a = DsClient(group, client_id="reader-a", assigner=addr)
    b = DsClient(group, client_id="reader-b", assigner=addr)

    def config_set(*args: str) -> tuple[int, Any, str]:
        """``dsctl config set`` in this process (a dsctl process takes seconds to start on a
        loaded machine; the command's code and its calls are the same)."""
        argv = ["config", "set", group, *args, "--yes", "--output", "json", "--assigner", addr]
        done = CliRunner().invoke(app, argv)
        print(f"dsctl config set {' '.join(args)}: exit {done.exit_code}: "
              f"{done.stderr.strip().splitlines()[-1:]}")  # fmt: skip
        return done.exit_code, json.loads(done.stdout or "null"), done.stderr

    def version() -> int:
        return describe(addr, group).config.config_version

    try:
        before = version()
        # Unordered (the default): both readers hold a record of the key at once.
        first, second = take(a, 10), take(b, 10)
        assert ([r.offset for r in first], [r.offset for r in second]) == ([0], [1])
        assert a.ack(first) == 1 and b.ack(second) == 1

        code, doc, err = config_set("ordering=key")
        assert code == 0, err
        assert doc["applied"] and doc["settings"]["ordering"] == "key"
        assert doc["changes"]["settings"] == {"ordering": {"from": "unordered", "to": "key"}}
        view = describe(addr, group)
        assert view.config.ordering == types_pb2.ORDERING_KEY
        assert [m.applied_config_version for m in view.members] == [doc["config_version"]]
        # The sidecar applies it: while reader a holds offset 2, reader b gets nothing of
        # the key; once a acks it, b gets offset 3.
        held = take(a, 10)
        assert [r.offset for r in held] == [2]
        assert list(take(b, 1.0)) == [], "key mode let the key be in flight to two readers"
        assert a.ack(held) == 1
        nxt = take(b, 10)
        assert [r.offset for r in nxt] == [3]
        assert b.ack(nxt) == 1

        # Back to unordered and commit_fencing kafka, in one version: the readers hold
        # records of the key at once again; the sidecar takes kafka for its next grants.
        code, doc, err = config_set("ordering=unordered", "commit_fencing=kafka")
        assert code == 0 and doc["applied"], err
        assert doc["settings"] == {"ordering": "unordered", "commit_fencing": "kafka"}
        assert doc["config_version"] == version() == before + 2
        config = describe(addr, group).config
        assert config.ordering == types_pb2.ORDERING_UNORDERED
        assert config.commit_fencing == types_pb2.COMMIT_FENCING_KAFKA
        first, second = take(a, 10), take(b, 10)
        assert ([r.offset for r in first], [r.offset for r in second]) == ([4], [5])
        assert a.ack(first) == 1 and b.ack(second) == 1
        wait_for(lambda: SWITCHED in sidecar.log.read_text(), 10, "the sidecar to apply it")
        assert "commit_fencing=kafka" in sidecar.log.read_text()

        # The way back is refused by the assigner; nothing is stored.
        code, _, err = config_set("commit_fencing=lease")
        assert code == 1 and "INVALID_ARGUMENT" in err, err
        assert "group.commit_fencing: cannot change from kafka to lease live" in err
        assert version() == before + 2
    finally:
        a.close()
        b.close()
