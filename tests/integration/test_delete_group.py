"""``AdminService.DeleteGroup`` (``dsctl delete group``) and ``dsctl apply --prune`` against a
real assigner on the real Kafka: a group with a bound client is refused (the client named)
unless forced; ``--prune --dry-run`` shows the group it would delete as a diff to /dev/null
and writes nothing; ``--prune`` deletes what the file does not declare, never forced; a
second run changes nothing; a restarted assigner (same state topic) does not bring a
deleted group back."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
import yaml

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc
from services.devstack.kafka import TopicFactory
from tests.support.dsgroups import dsgroup
from tests.support.mesh import Mesh
from tests.support.ops import dsctl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def serving(mesh: Mesh, env: dict[str, str]) -> str:
    assigner = mesh.assigner([], env=env)
    assigner.wait_serving()
    return assigner.grpc_addr


def wait_listing(addr: str) -> str:
    """``dsctl groups -o json`` once the assigner leads (polled, bounded by the timeout)."""
    while True:
        listed = dsctl(addr, "groups", "-o", "json")
        if listed.returncode == 0:
            return listed.stdout


def test_delete_refuses_bound_clients_unless_forced_and_prune_deletes_the_undeclared(
    mesh: Mesh, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    tag = uuid.uuid4().hex[:8]
    env = {"DS_STATE_TOPIC": f"__ds_state_delete_{tag}", "DS_STATE_TRANSACTIONAL_ID": tag}
    addr = serving(mesh, env)
    wait_listing(addr)
    keep, drop, bound = f"keep-{tag}", f"drop-{tag}", f"bound-{tag}"
    everything = tmp_path / "all.yaml"
    everything.write_text(yaml.safe_dump_all([dsgroup(g, [topic]) for g in (keep, drop, bound)]))
    created = dsctl(addr, "apply", "-f", str(everything))
    assert "3 created" in created.stdout, created.stdout + created.stderr

    with grpc.insecure_channel(addr) as channel:
        binding_pb2_grpc.BindingServiceStub(channel).Bind(
            binding_pb2.BindRequest(client_id="app-1", group=bound), timeout=10
        )

    refused = dsctl(addr, "delete", "group", bound)
    print(f"\n$ dsctl delete group {bound}  (exit {refused.returncode})\n{refused.stderr}")
    assert refused.returncode == 1
    assert "FAILED_PRECONDITION [GROUP_HAS_CLIENTS]" in refused.stderr
    assert "app-1" in refused.stderr

    only_keep = tmp_path / "keep.yaml"
    only_keep.write_text(yaml.safe_dump_all([dsgroup(keep, [topic])]))
    plan = dsctl(addr, "apply", "-f", str(only_keep), "--prune", "--dry-run")
    print(f"$ dsctl apply -f keep.yaml --prune --dry-run\n{plan.stdout}")
    assert plan.returncode == 0, plan.stderr
    assert f"--- live/{drop}" in plan.stdout and f"--- live/{bound}" in plan.stdout
    assert "0 to create, 0 to configure, 2 to prune; nothing written" in plan.stdout
    assert drop in wait_listing(addr)
    assert dsctl(addr, "diff", "-f", str(only_keep), "--prune").returncode == 1

    pruned = dsctl(addr, "apply", "-f", str(only_keep), "--prune")
    print(f"$ dsctl apply -f keep.yaml --prune  (exit {pruned.returncode})\n{pruned.stdout}")
    assert pruned.returncode == 1  # the bound group is refused, never forced
    assert f"dsgroup/{drop} pruned" in pruned.stdout
    assert f"dsgroup/{bound} not pruned" in pruned.stdout and "GROUP_HAS_CLIENTS" in pruned.stdout

    forced = dsctl(addr, "delete", "group", bound, "--force")
    print(f"$ dsctl delete group {bound} --force\n{forced.stdout}")
    assert forced.returncode == 0, forced.stderr
    assert f"dsgroup/{bound} deleted (config v1); bindings dropped: app-1" in forced.stdout

    again = dsctl(addr, "apply", "-f", str(only_keep), "--prune")
    print(f"$ dsctl apply -f keep.yaml --prune\n{again.stdout}")
    assert again.returncode == 0, again.stderr
    assert "0 created, 0 configured, 1 unchanged, 0 pruned: nothing changed" in again.stdout
    assert dsctl(addr, "diff", "-f", str(only_keep), "--prune").returncode == 0
    missing = dsctl(addr, "delete", "group", drop)
    assert missing.returncode != 0 and "GROUP_NOT_FOUND" in missing.stderr

    # Durable: an assigner reading the same state topic serves the kept group alone.
    mesh.services[-1].stop()
    addr = serving(mesh, env)
    listed = wait_listing(addr)
    assert keep in listed and drop not in listed and bound not in listed
