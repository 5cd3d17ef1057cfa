"""``dsctl apply -f`` / ``dsctl diff -f`` / ``dsctl get group X -o yaml`` against a real
assigner on the real Kafka: the DsGroup YAML a cluster would reconcile, applied outside
Kubernetes. The first apply creates, the second changes nothing and says so; a diff shows a
change before it is applied and is empty after; an edit updates only the changed fields
(the config version moves once); ``get -o yaml`` writes a document that applies as
unchanged; a change made with ``dsctl config set`` shows as drift in the next diff."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml

from services.devstack.kafka import TopicFactory
from tests.support.dsgroups import dsgroup
from tests.support.mesh import Mesh
from tests.support.ops import dsctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def leading(mesh: Mesh) -> str:
    """An assigner of the test's own (its own state topic and transactional id: another
    test's assigner on the shared Kafka would fence its state writes), once it leads."""
    tag = uuid.uuid4().hex[:8]
    env = {"DS_STATE_TOPIC": f"__ds_state_apply_{tag}", "DS_STATE_TRANSACTIONAL_ID": tag}
    assigner = mesh.assigner([], env=env)
    assigner.wait_serving()
    deadline = time.monotonic() + 60
    while dsctl(assigner.grpc_addr, "groups", "-o", "json").returncode != 0:
        assert time.monotonic() < deadline, assigner.tail()
        time.sleep(0.5)
    return assigner.grpc_addr


def test_apply_is_idempotent_and_diff_shows_changes_first(
    mesh: Mesh, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    orders, refunds = topic_factory(partitions=3), topic_factory(partitions=2)
    addr = leading(mesh)
    groups = tmp_path / "groups.yaml"
    declared = [
        dsgroup("apply-orders", [orders], consumerConfig={"fetch.max.bytes": "1048576"},
                visibilityTimeout="45s"),
        dsgroup("apply-refunds", [refunds], mode="kafka_group"),
    ]  # fmt: skip
    groups.write_text(yaml.safe_dump_all(declared))

    before = dsctl(addr, "diff", "-f", str(groups))
    print(f"\n$ dsctl diff -f groups.yaml  (exit {before.returncode})\n{before.stdout}")
    assert before.returncode == 1
    assert "+++ declared/apply-orders" in before.stdout
    assert "+  fetch.max.bytes: '1048576'" in before.stdout

    first = dsctl(addr, "apply", "-f", str(groups))
    print(f"$ dsctl apply -f groups.yaml\n{first.stdout}{first.stderr}")
    assert first.returncode == 0, first.stderr
    assert "dsgroup/apply-orders created (config v1)" in first.stdout
    assert "2 created, 0 configured, 0 unchanged" in first.stdout

    second = dsctl(addr, "apply", "-f", str(groups))
    print(f"$ dsctl apply -f groups.yaml\n{second.stdout}")
    assert second.returncode == 0, second.stderr
    assert "0 created, 0 configured, 2 unchanged: nothing changed" in second.stdout
    assert dsctl(addr, "diff", "-f", str(groups)).returncode == 0

    live = yaml.safe_load(dsctl(addr, "get", "group", "apply-orders", "-o", "yaml").stdout)
    # What the file set, plus what the assigner filled in (its defaults: lease TTL, ...).
    assert {key: live["spec"].get(key) for key in declared[0]["spec"]} == {  # type: ignore[attr-defined]
        "topics": [orders],
        "consumerConfig": {"fetch.max.bytes": "1048576"},
        "visibilityTimeout": "45s",
    }
    assert live["spec"]["mode"] == "leased" and "leaseTtl" in live["spec"]
    assert live["status"]["configVersion"] == 1
    assert live["status"]["partitions"] == 3

    # An edit in the file: the diff names it, apply writes that field only, once.
    declared[0]["spec"]["consumerConfig"] = {"fetch.max.bytes": "2097152"}  # type: ignore[index]
    groups.write_text(yaml.safe_dump_all(declared))
    edit = dsctl(addr, "diff", "-f", str(groups))
    print(f"$ dsctl diff -f groups.yaml  (exit {edit.returncode})\n{edit.stdout}")
    assert edit.returncode == 1
    assert "-  fetch.max.bytes: '1048576'" in edit.stdout
    assert "+  fetch.max.bytes: '2097152'" in edit.stdout
    assert "apply-refunds" not in edit.stdout
    third = dsctl(addr, "apply", "-f", str(groups))
    assert "dsgroup/apply-orders configured: consumer_config (config v2)" in third.stdout
    assert "dsgroup/apply-refunds unchanged" in third.stdout

    # A change made with dsctl config set is drift the next diff shows; apply puts the
    # file's value back (the file is the truth where it is applied).
    drift = dsctl(addr, "config", "set", "apply-orders", "fetch.max.bytes=4194304", "--yes",
                  "--wait", "0")  # fmt: skip
    assert drift.returncode == 0, drift.stderr
    shown = dsctl(addr, "diff", "-f", str(groups))
    assert "-  fetch.max.bytes: '4194304'" in shown.stdout
    back = dsctl(addr, "apply", "-f", str(groups))
    assert "configured: consumer_config (config v4)" in back.stdout

    # What get writes applies as unchanged.
    saved = tmp_path / "saved.yaml"
    saved.write_text(dsctl(addr, "get", "group", "apply-orders", "-o", "yaml").stdout)
    again = dsctl(addr, "apply", "-f", str(saved))
    assert "1 unchanged: nothing changed" in again.stdout, again.stdout + again.stderr


def test_apply_refuses_an_invalid_document_and_writes_nothing(
    mesh: Mesh, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    addr = leading(mesh)
    groups = tmp_path / "groups.yaml"
    groups.write_text(
        yaml.safe_dump_all(
            [
                dsgroup("invalid-ok", [topic]),
                dsgroup("invalid-bad", [topic], visibilityTimeout="soon"),
            ]
        )
    )
    result = dsctl(addr, "apply", "-f", str(groups))
    assert result.returncode == 1
    assert "DsGroup invalid-bad: spec.visibilityTimeout: 'soon' is not a duration" in (
        result.stderr
    )
    listed = dsctl(addr, "get", "group", "invalid-ok", "-o", "yaml")
    assert listed.returncode != 0  # nothing was created: the file is checked first
