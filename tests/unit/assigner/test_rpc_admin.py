"""AdminService on an in-process server: request validation, error mapping (status code +
ErrorInfo reason) and the happy path of every RPC, without a Kafka broker."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import duration_pb2, field_mask_pb2

from dataservice.assigner.v1 import admin_pb2, assigner_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from services.assigner.admin.paging import MAX_PAGE_SIZE
from services.assigner.coordinator import LeaseState
from services.assigner.state import GroupRecord, StateSnapshot
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.rpc_harness import (
    TOPIC,
    Assigner,
    Sidecar,
    field_error,
    leased_config,
    reason_of,
    refused,
    run,
)

OTHER = "payments.v1"
TOPICS = {TOPIC: 4, OTHER: 2}


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


# ---- ListGroups ---------------------------------------------------------------------------


def test_list_groups_pages_through_every_group_with_its_lag() -> None:
    async def body(a: Assigner) -> None:
        for name in ("c", "a", "b"):
            await a.create(name)
        tp = TopicPartition(TOPIC, 0)
        a.offsets.bounds[tp] = (0, 100)
        a.offsets.committed[("a", tp)] = 40
        first = await a.admin.ListGroups(admin_pb2.ListGroupsRequest(page_size=2))
        assert [g.config.name for g in first.groups] == ["a", "b"]
        assert first.groups[0].total_lag == 60
        assert first.groups[0].partition_count == 4
        assert first.groups[0].member_count == 0
        assert first.next_page_token
        second = await a.admin.ListGroups(
            admin_pb2.ListGroupsRequest(page_size=2, page_token=first.next_page_token)
        )
        assert [g.config.name for g in second.groups] == ["c"]
        assert second.next_page_token == ""

    run(body)


def test_list_groups_reports_unknown_lag_when_kafka_does_not_answer() -> None:
    async def body(a: Assigner) -> None:
        await a.create("a")
        a.offsets.down = True
        response = await a.admin.ListGroups(admin_pb2.ListGroupsRequest())
        assert [(g.config.name, g.total_lag) for g in response.groups] == [("a", -1)]

    run(body)


def test_list_groups_while_not_serving_is_not_ready_not_an_empty_list() -> None:
    """A replica that is not serving its groups has none to list: an empty answer would
    read as "no groups" (dsctl groups printed "groups (0)" from a just-elected leader)."""

    async def body(a: Assigner) -> None:
        err = await refused(a.admin.ListGroups(admin_pb2.ListGroupsRequest()))
        code, reason, _ = reason_of(err)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


def test_list_groups_on_a_leader_still_loading_its_state_waits_for_its_groups() -> None:
    async def body(a: Assigner) -> None:
        a.leader[0] = True  # elected; become_leader has not restored the groups yet

        async def list_groups() -> admin_pb2.ListGroupsResponse:
            return await a.admin.ListGroups(admin_pb2.ListGroupsRequest())

        listing = asyncio.create_task(list_groups())
        await asyncio.sleep(0.05)
        assert not listing.done()
        snapshot = StateSnapshot(groups={"demo": GroupRecord(name="demo", topics=[TOPIC])})
        await a.groups.restore(snapshot, 100.0)
        a.groups.start_serving()
        response = await listing
        assert [g.config.name for g in response.groups] == ["demo"]

    run(body, serving=False)


def test_list_groups_caps_an_absurd_page_size_and_refuses_a_negative_one() -> None:
    async def body(a: Assigner) -> None:
        for i in range(MAX_PAGE_SIZE + 1):
            await a.create(f"g{i:04d}")
        response = await a.admin.ListGroups(admin_pb2.ListGroupsRequest(page_size=2**31 - 1))
        assert len(response.groups) == MAX_PAGE_SIZE
        rest = await a.admin.ListGroups(
            admin_pb2.ListGroupsRequest(page_token=response.next_page_token)
        )
        assert [g.config.name for g in rest.groups] == [f"g{MAX_PAGE_SIZE:04d}"]
        err = await refused(a.admin.ListGroups(admin_pb2.ListGroupsRequest(page_size=-1)))
        assert field_error(err) == "page_size"

    run(body, topics={TOPIC: 1})


@pytest.mark.parametrize("token", ["not-a-token", "!!!", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"])
def test_list_groups_refuses_a_token_it_did_not_issue(token: str) -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.ListGroups(admin_pb2.ListGroupsRequest(page_token=token)))
        assert field_error(err) == "page_token"

    run(body)


# ---- DescribeGroup ------------------------------------------------------------------------


def test_describe_group_shows_members_leases_lag_and_bindings() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        grants = await sidecar.grants(4)
        await sidecar.heartbeat(grants)
        tp = TopicPartition(TOPIC, 1)
        a.offsets.bounds[tp] = (0, 50)
        a.offsets.committed[("g", tp)] = 30
        a.groups.group("g").bindings.bind("app-1")
        response = await a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g"))
        assert response.config.name == "g"
        assert [m.sidecar_id for m in response.members] == ["sc-1"]
        assert response.members[0].HasField("last_heartbeat")
        assert [(le.partition, le.holder, le.state) for le in response.leases] == [
            (p, "sc-1", types_pb2.LEASE_STATE_GRANTED) for p in range(4)
        ]
        lag = {
            p.partition: (p.committed_offset, p.end_offset, p.lag_records)
            for p in response.partitions
        }
        assert lag[1] == (30, 50, 20)
        assert lag[0] == (-1, 0, 0)
        assert [b.client_id for b in response.bindings] == ["app-1"]
        await sidecar.close()

    run(body)


@pytest.mark.parametrize("group", ["", "has space", "a" * 250])
def test_describe_group_refuses_a_bad_name(group: str) -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group=group)))
        assert field_error(err) == "group"

    run(body)


def test_describe_group_maps_unknown_groups_and_kafka_outages() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="nope")))
        assert reason_of(err) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", {"group": "nope"})
        await a.create("g")
        a.offsets.down = True
        err = await refused(a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g")))
        code, reason, metadata = reason_of(err)
        assert (code, reason, metadata["group"]) == (
            grpc.StatusCode.UNAVAILABLE,
            "KAFKA_UNAVAILABLE",
            "g",
        )

    run(body)


def test_describe_group_while_not_serving_is_not_ready() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g")))
        code, reason, _ = reason_of(err)
        assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


# ---- CreateGroup --------------------------------------------------------------------------


def test_create_group_stores_then_serves_and_is_idempotent() -> None:
    async def body(a: Assigner) -> None:
        request = admin_pb2.CreateGroupRequest(
            group=leased_config("g", TOPIC, OTHER, consumer_config={"fetch.max.bytes": "1048576"}),
            request_id="req-1",
        )
        created = await a.admin.CreateGroup(request)
        assert created.group.name == "g"
        assert list(created.group.topics) == [TOPIC, OTHER]
        assert created.group.config_version == 1
        assert a.store.records["g"].consumer_config == {"fetch.max.bytes": "1048576"}
        assert len(a.groups.group("g").coordinator.leases) == 6
        # The same request again (a retry) and the same settings without a request_id
        # both answer the existing group; nothing is written again.
        writes = len(a.store.writes)
        assert await a.admin.CreateGroup(request) == created
        request.request_id = ""
        assert await a.admin.CreateGroup(request) == created
        assert len(a.store.writes) == writes

    run(body, topics=TOPICS)


def test_create_group_with_other_settings_for_an_existing_name_already_exists() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        err = await refused(
            a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=leased_config("g", OTHER)))
        )
        assert reason_of(err) == (
            grpc.StatusCode.ALREADY_EXISTS,
            "GROUP_ALREADY_EXISTS",
            {"group": "g"},
        )

    run(body, topics=TOPICS)


def test_create_group_refuses_a_request_id_reused_for_another_request() -> None:
    async def body(a: Assigner) -> None:
        await a.admin.CreateGroup(
            admin_pb2.CreateGroupRequest(group=leased_config("g"), request_id="req-1")
        )
        err = await refused(
            a.admin.CreateGroup(
                admin_pb2.CreateGroupRequest(group=leased_config("h"), request_id="req-1")
            )
        )
        assert field_error(err) == "request_id"

    run(body)


@pytest.mark.parametrize(
    ("config", "request_id", "field"),
    [
        (leased_config(""), "", "group.name"),
        (leased_config("has space"), "", "group.name"),
        (types_pb2.GroupConfig(name="g", mode=common_pb2.GROUP_MODE_LEASED), "", "group.topics"),
        (leased_config("g", "bad topic"), "", "group.topics[0]"),
        (leased_config("g", TOPIC, TOPIC), "", "group.topics[1]"),
        (types_pb2.GroupConfig(name="g", topics=[TOPIC]), "", "group.mode"),
        (leased_config("g", consumer_config={"group.id": "x"}), "", "group.consumer_config"),
        (
            leased_config("g", consumer_config={"no.such.property": "1"}),
            "",
            "group.consumer_config",
        ),
        (
            leased_config("g", consumer_config={"fetch.max.bytes": "lots"}),
            "",
            "group.consumer_config",
        ),
        (leased_config("g", alert_template="not a name"), "", "group.alert_template"),
        (leased_config("g", balance_strategy=99), "", "group.balance_strategy"),
        (leased_config("g", lease_ttl=seconds(0.1)), "", "group.lease_ttl"),
        (leased_config("g", heartbeat_interval=seconds(2.0)), "", "group.heartbeat_interval"),
        # Valid for a kafka-fenced group only (an unset commit_fencing may be lease).
        (leased_config("g", lease_ttl=seconds(10.0)), "", "group.lease_ttl"),
        # Not a per-group value this assigner can apply yet: refused, not dropped.
        (leased_config("g", alert_template="oncall"), "", "group.alert_template"),
        (leased_config("g"), "has space", "request_id"),
    ],
)
def test_create_group_refuses_bad_fields(
    config: types_pb2.GroupConfig, request_id: str, field: str
) -> None:
    async def body(a: Assigner) -> None:
        err = await refused(
            a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=config, request_id=request_id))
        )
        assert field_error(err) == field
        assert len(a.groups) == 0 and a.store.writes == []

    run(body)


def test_create_group_maps_unknown_topics_and_kafka_outages() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(
            a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=leased_config("g", "nope")))
        )
        assert reason_of(err) == (grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", {"topic": "nope"})
        a.kafka.down = True
        err = await refused(
            a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=leased_config("g")))
        )
        assert reason_of(err)[:2] == (grpc.StatusCode.UNAVAILABLE, "KAFKA_UNAVAILABLE")
        a.kafka.down = False
        a.store.failing = True  # the state topic refuses the write: nothing is served
        err = await refused(
            a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=leased_config("g")))
        )
        assert reason_of(err)[:2] == (grpc.StatusCode.UNAVAILABLE, "KAFKA_UNAVAILABLE")
        assert len(a.groups) == 0
        # Failures are not remembered: the retry succeeds once the state topic is back.
        a.store.failing = False
        created = await a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=leased_config("g")))
        assert created.group.name == "g"

    run(body)


def test_a_kafka_fenced_group_has_its_own_timing_changed_live() -> None:
    """Issue 36 item 2: the group's TTL / heartbeat go into the record, the coordinator,
    GetGroup and SessionAccepted; a live change goes out in a ConfigUpdate, and members
    expire by the longer of the old and new TTL until every member reports the new
    config version."""

    async def body(a: Assigner) -> None:
        config = leased_config(
            "g",
            lease_ttl=seconds(6.0),
            heartbeat_interval=seconds(1.0),
            commit_fencing=types_pb2.COMMIT_FENCING_KAFKA,
        )
        created = await a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=config))
        assert created.group.lease_ttl == seconds(6.0)
        group = a.groups.group("g")
        assert (group.record.lease_ttl_seconds, group.record.heartbeat_interval_seconds) == (
            6.0,
            None,
        )
        assert group.coordinator.timing.ttl == 6.0
        first, second = Sidecar(a.sessions, "sc-1"), Sidecar(a.sessions, "sc-2")
        accepted = await first.join("g")
        assert (accepted.lease_ttl, accepted.heartbeat_interval) == (seconds(6.0), seconds(1.0))
        await second.join("g")
        # Out of bounds: refused as at creation.
        err = await refused(
            a.admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(
                    group=leased_config(
                        "g", lease_ttl=seconds(1.0), heartbeat_interval=seconds(0.5)
                    ),
                    update_mask=mask("lease_ttl", "heartbeat_interval"),
                )
            )
        )
        assert field_error(err) == "group.lease_ttl"
        assert a.groups.group("g").record.config_version == 1
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", lease_ttl=seconds(1.5), heartbeat_interval=seconds(0.5)),
                update_mask=mask("lease_ttl", "heartbeat_interval"),
            )
        )
        assert (response.group.lease_ttl, response.group.config_version) == (seconds(1.5), 2)
        while (message := await first.next()).WhichOneof("kind") != "config_update":
            pass
        update = message.config_update
        assert (update.lease_ttl, update.heartbeat_interval) == (seconds(1.5), seconds(0.5))
        # Nobody reported version 2 yet: members expire by the old, longer TTL.
        assert group.coordinator.timing.ttl == 6.0
        await first.heartbeat([], applied_config_version=2)
        await second.heartbeat([], applied_config_version=1)
        assert group.coordinator.timing.ttl == 6.0  # sc-2 still runs the old timing
        await second.heartbeat([], applied_config_version=2)
        assert group.coordinator.timing.ttl == 1.5
        # A new member learns the new timing when it joins.
        third = Sidecar(a.sessions, "sc-3")
        accepted = await third.join("g")
        assert (accepted.lease_ttl, accepted.heartbeat_interval) == (seconds(1.5), seconds(0.5))
        for sidecar in (first, second, third):
            await sidecar.close()

    run(body)


def test_a_lease_fenced_groups_timing_cannot_change_live() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        err = await refused(
            a.admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(
                    group=leased_config("g", lease_ttl=seconds(6.0)), update_mask=mask("lease_ttl")
                )
            )
        )
        assert field_error(err) == "group.lease_ttl"
        assert a.groups.group("g").record.config_version == 1

    run(body)


# ---- UpdateGroup --------------------------------------------------------------------------


def test_update_group_applies_the_mask_durably_and_pushes_consumer_config() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        await sidecar.grants(4)
        patch = leased_config("g", OTHER, consumer_config={"fetch.max.bytes": "1048576"})
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=patch, update_mask=mask("consumer_config"), expected_config_version=1
            )
        )
        assert response.group.config_version == 2
        assert list(response.group.topics) == [TOPIC]  # not in the mask: unchanged
        assert dict(response.group.consumer_config) == {"fetch.max.bytes": "1048576"}
        assert a.store.records["g"].config_version == 2
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        assert message.config_update.config_version == 2
        # Adding a topic adds its partitions; the same change again changes nothing.
        request = admin_pb2.UpdateGroupRequest(
            group=leased_config("g", TOPIC, OTHER), update_mask=mask("topics")
        )
        assert (await a.admin.UpdateGroup(request)).group.config_version == 3
        assert len(a.groups.group("g").coordinator.leases) == 6
        assert (await a.admin.UpdateGroup(request)).group.config_version == 3
        await sidecar.close()

    run(body, topics=TOPICS)


def test_update_group_pushes_the_redelivery_settings_live_and_keeps_them() -> None:
    """visibility_timeout and max_deliveries (ARCHITECTURE §3 "Delivery") are part of the
    group's config: stored, described, sent at join and pushed to joined sidecars."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert not accepted.HasField("visibility_timeout") and accepted.max_deliveries == 0
        await sidecar.grants(4)
        patch = leased_config("g")
        patch.visibility_timeout.CopyFrom(seconds(5))
        patch.max_deliveries = 3
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=patch, update_mask=mask("visibility_timeout", "max_deliveries")
            )
        )
        assert response.group.visibility_timeout.ToTimedelta().total_seconds() == 5
        assert (response.group.max_deliveries, response.group.config_version) == (3, 2)
        record = a.store.records["g"]
        assert (record.visibility_timeout_seconds, record.max_deliveries) == (5.0, 3)
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        update = message.config_update
        assert update.visibility_timeout.ToTimedelta().total_seconds() == 5
        assert (update.max_deliveries, update.config_version) == (3, 2)
        await sidecar.close()
        again = Sidecar(a.sessions, "sc-2")
        accepted = await again.join("g")
        assert accepted.visibility_timeout.ToTimedelta().total_seconds() == 5
        assert accepted.max_deliveries == 3
        await again.close()

    run(body, topics=TOPICS)


def test_the_dead_letter_topic_is_stored_described_and_pushed_live() -> None:
    """dead_letter_topic (issue 39) is part of the group's config like max_deliveries:
    stored, described, sent at join and pushed to joined sidecars."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert accepted.dead_letter_topic == ""
        await sidecar.grants(4)
        patch = leased_config("g", dead_letter_topic="g.dlq")
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(group=patch, update_mask=mask("dead_letter_topic"))
        )
        assert (response.group.dead_letter_topic, response.group.config_version) == ("g.dlq", 2)
        assert a.store.records["g"].dead_letter_topic == "g.dlq"
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        assert message.config_update.dead_letter_topic == "g.dlq"
        await sidecar.close()
        again = Sidecar(a.sessions, "sc-2")
        assert (await again.join("g")).dead_letter_topic == "g.dlq"
        await again.close()

    run(body, topics=TOPICS)


def test_the_ordering_is_stored_described_and_pushed_live() -> None:
    """ordering (issue 39): unordered by default (not written to the record), settable with
    UpdateGroup, stored, sent at join and pushed to joined sidecars."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert accepted.ordering == types_pb2.ORDERING_UNORDERED
        assert "ordering" not in a.store.records["g"].to_json()
        await sidecar.grants(4)
        patch = leased_config("g", ordering=types_pb2.ORDERING_KEY)
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(group=patch, update_mask=mask("ordering"))
        )
        assert (response.group.ordering, response.group.config_version) == (
            types_pb2.ORDERING_KEY,
            2,
        )
        assert a.store.records["g"].ordering == "key"
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        assert message.config_update.ordering == types_pb2.ORDERING_KEY
        await sidecar.close()
        again = Sidecar(a.sessions, "sc-2")
        assert (await again.join("g")).ordering == types_pb2.ORDERING_KEY
        await again.close()

    run(body, topics=TOPICS)


def test_commit_fencing_is_stored_described_and_pushed_live() -> None:
    """commit_fencing (issue 36): unspecified by default (the sidecars' setting; not
    written to the record), settable with UpdateGroup towards kafka, stored, sent at join
    and pushed to joined sidecars."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert accepted.commit_fencing == types_pb2.COMMIT_FENCING_UNSPECIFIED
        assert "commit_fencing" not in a.store.records["g"].to_json()
        await sidecar.grants(4)
        patch = leased_config("g", commit_fencing=types_pb2.COMMIT_FENCING_KAFKA)
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(group=patch, update_mask=mask("commit_fencing"))
        )
        assert (response.group.commit_fencing, response.group.config_version) == (
            types_pb2.COMMIT_FENCING_KAFKA,
            2,
        )
        assert a.store.records["g"].commit_fencing == "kafka"
        assert a.store.records["g"].to_json()["commit_fencing"] == "kafka"
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        assert message.config_update.commit_fencing == types_pb2.COMMIT_FENCING_KAFKA
        await sidecar.close()
        again = Sidecar(a.sessions, "sc-2")
        assert (await again.join("g")).commit_fencing == types_pb2.COMMIT_FENCING_KAFKA
        await again.close()

    run(body, topics=TOPICS)


@pytest.mark.parametrize(
    ("before", "after", "allowed"),
    [
        (types_pb2.COMMIT_FENCING_UNSPECIFIED, types_pb2.COMMIT_FENCING_KAFKA, True),
        (types_pb2.COMMIT_FENCING_LEASE, types_pb2.COMMIT_FENCING_KAFKA, True),
        (types_pb2.COMMIT_FENCING_LEASE, types_pb2.COMMIT_FENCING_UNSPECIFIED, True),
        # Away from (maybe) kafka: a lease-fenced holder would not fence a Kafka-fenced one.
        (types_pb2.COMMIT_FENCING_KAFKA, types_pb2.COMMIT_FENCING_LEASE, False),
        (types_pb2.COMMIT_FENCING_KAFKA, types_pb2.COMMIT_FENCING_UNSPECIFIED, False),
        (types_pb2.COMMIT_FENCING_UNSPECIFIED, types_pb2.COMMIT_FENCING_LEASE, False),
    ],
)
def test_commit_fencing_changes_live_only_towards_kafka(
    before: types_pb2.CommitFencing.ValueType,
    after: types_pb2.CommitFencing.ValueType,
    allowed: bool,
) -> None:
    async def body(a: Assigner) -> None:
        created = await a.admin.CreateGroup(
            admin_pb2.CreateGroupRequest(group=leased_config("g", commit_fencing=before))
        )
        assert created.group.commit_fencing == before
        request = admin_pb2.UpdateGroupRequest(
            group=leased_config("g", commit_fencing=after), update_mask=mask("commit_fencing")
        )
        if allowed:
            response = await a.admin.UpdateGroup(request)
            assert response.group.commit_fencing == after
            return
        writes = list(a.store.writes)
        err = await refused(a.admin.UpdateGroup(request))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field_error(err) == "group.commit_fencing"
        assert "live" in (err.details() or "")
        assert a.store.writes == writes
        described = await a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g"))
        assert described.config.commit_fencing == before

    run(body, topics=TOPICS)


def test_external_offset_changes_is_stored_described_and_pushed_live() -> None:
    """external_offset_changes (issue 23): follow by default, settable with UpdateGroup,
    stored (only when not follow), sent at join and pushed to joined sidecars."""

    async def body(a: Assigner) -> None:
        await a.create("g")
        described = await a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g"))
        assert described.config.external_offset_changes == types_pb2.EXTERNAL_OFFSET_CHANGES_FOLLOW
        assert "external_offset_changes" not in a.store.records["g"].to_json()
        sidecar = Sidecar(a.sessions, "sc-1")
        accepted = await sidecar.join("g")
        assert accepted.external_offset_changes == types_pb2.EXTERNAL_OFFSET_CHANGES_FOLLOW
        response = await a.admin.UpdateGroup(
            admin_pb2.UpdateGroupRequest(
                group=leased_config(
                    "g", external_offset_changes=types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT
                ),
                update_mask=mask("external_offset_changes"),
            )
        )
        assert response.group.external_offset_changes == types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT
        assert a.store.records["g"].to_json()["external_offset_changes"] == "revert"
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        update = message.config_update
        assert update.external_offset_changes == types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT
        await sidecar.close()
        again = Sidecar(a.sessions, "sc-2")
        accepted = await again.join("g")
        assert accepted.external_offset_changes == types_pb2.EXTERNAL_OFFSET_CHANGES_REVERT
        await again.close()

    run(body, topics=TOPICS)


def test_update_group_refuses_a_stale_config_version() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        err = await refused(
            a.admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(group=leased_config("g"), expected_config_version=7)
            )
        )
        assert reason_of(err) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "CONFIG_VERSION_CONFLICT",
            {"group": "g", "expected": "7", "current": "1"},
        )

    run(body)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (admin_pb2.UpdateGroupRequest(group=leased_config("")), "group.name"),
        (admin_pb2.UpdateGroupRequest(group=leased_config("g"), request_id="a b"), "request_id"),
        (
            admin_pb2.UpdateGroupRequest(group=leased_config("g"), expected_config_version=-1),
            "expected_config_version",
        ),
        (
            admin_pb2.UpdateGroupRequest(group=leased_config("g"), update_mask=mask("name")),
            "update_mask",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g"), update_mask=mask("config_version")
            ),
            "update_mask",
        ),
        (
            admin_pb2.UpdateGroupRequest(group=leased_config("g"), update_mask=mask("nope")),
            "update_mask",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", consumer_config={"enable.auto.commit": "true"}),
                update_mask=mask("consumer_config"),
            ),
            "group.consumer_config",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=types_pb2.GroupConfig(name="g"), update_mask=mask("topics")
            ),
            "group.topics",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", visibility_timeout=seconds(0.5)),
                update_mask=mask("visibility_timeout"),
            ),
            "group.visibility_timeout",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", visibility_timeout=seconds(43_201)),
                update_mask=mask("visibility_timeout"),
            ),
            "group.visibility_timeout",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", max_deliveries=-2), update_mask=mask("max_deliveries")
            ),
            "group.max_deliveries",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", ordering=7),  # type: ignore[arg-type]
                update_mask=mask("ordering"),
            ),
            "group.ordering",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", commit_fencing=5),  # type: ignore[arg-type]
                update_mask=mask("commit_fencing"),
            ),
            "group.commit_fencing",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", dead_letter_topic="g dlq"),
                update_mask=mask("dead_letter_topic"),
            ),
            "group.dead_letter_topic",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", dead_letter_topic=TOPIC),
                update_mask=mask("dead_letter_topic"),
            ),
            "group.dead_letter_topic",
        ),
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", external_offset_changes=9),
                update_mask=mask("external_offset_changes"),
            ),
            "group.external_offset_changes",
        ),
        # Removing a topic from a group is not supported.
        (
            admin_pb2.UpdateGroupRequest(
                group=leased_config("g", OTHER), update_mask=mask("topics")
            ),
            "group.topics",
        ),
    ],
)
def test_update_group_refuses_bad_fields(
    request_: admin_pb2.UpdateGroupRequest, field: str
) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        writes = list(a.store.writes)
        assert field_error(await refused(a.admin.UpdateGroup(request_))) == field
        assert a.store.writes == writes

    run(body, topics=TOPICS)


def test_update_group_maps_unknown_groups_and_topics() -> None:
    async def body(a: Assigner) -> None:
        err = await refused(
            a.admin.UpdateGroup(admin_pb2.UpdateGroupRequest(group=leased_config("nope")))
        )
        assert reason_of(err) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", {"group": "nope"})
        await a.create("g")
        err = await refused(
            a.admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(
                    group=leased_config("g", TOPIC, "missing"), update_mask=mask("topics")
                )
            )
        )
        assert reason_of(err) == (
            grpc.StatusCode.NOT_FOUND,
            "TOPIC_NOT_FOUND",
            {"topic": "missing"},
        )

    run(body)


# ---- MoveLease ----------------------------------------------------------------------------


def test_move_lease_starts_the_handoff_to_the_target() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        first = Sidecar(a.sessions, "sc-1")
        await first.join("g")
        await first.heartbeat(await first.grants(4))
        second = Sidecar(a.sessions, "sc-2")
        await second.join("g")
        # sc-2's join moves half the partitions (REBALANCE); move one that sc-1 keeps.
        leases = a.groups.group("g").coordinator.leases
        moving = next(
            tp.partition
            for tp, lease in sorted(leases.items())
            if lease.holder == "sc-1" and lease.state is LeaseState.GRANTED
        )
        response = await a.admin.MoveLease(
            admin_pb2.MoveLeaseRequest(
                group="g", topic=TOPIC, partition=moving, target_sidecar_id="sc-2", request_id="m-1"
            )
        )
        assert (response.lease.partition, response.lease.holder, response.lease.state) == (
            moving,
            "sc-1",
            types_pb2.LEASE_STATE_REVOKING,
        )
        while (message := await first.next()).WhichOneof("kind") != "revoke" or (
            message.revoke.partition != moving
        ):
            pass
        assert message.revoke.reason == assigner_pb2.REVOKE_REASON_MOVE
        await first.close()
        await second.close()

    run(body)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (admin_pb2.MoveLeaseRequest(group="", topic=TOPIC, target_sidecar_id="s"), "group"),
        (admin_pb2.MoveLeaseRequest(group="g", topic="", target_sidecar_id="s"), "topic"),
        (
            admin_pb2.MoveLeaseRequest(group="g", topic=TOPIC, partition=-1, target_sidecar_id="s"),
            "partition",
        ),
        (
            admin_pb2.MoveLeaseRequest(group="g", topic=TOPIC, target_sidecar_id=""),
            "target_sidecar_id",
        ),
        (
            admin_pb2.MoveLeaseRequest(group="g", topic=TOPIC, target_sidecar_id="a b"),
            "target_sidecar_id",
        ),
        (
            admin_pb2.MoveLeaseRequest(
                group="g", topic=TOPIC, target_sidecar_id="s", request_id="a b"
            ),
            "request_id",
        ),
    ],
)
def test_move_lease_refuses_bad_fields(request_: admin_pb2.MoveLeaseRequest, field: str) -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        assert field_error(await refused(a.admin.MoveLease(request_))) == field

    run(body)


def test_move_lease_maps_unknown_groups_partitions_sidecars_and_modes() -> None:
    def move(
        group: str = "g", partition: int = 0, target: str = "sc-1"
    ) -> admin_pb2.MoveLeaseRequest:
        return admin_pb2.MoveLeaseRequest(
            group=group, topic=TOPIC, partition=partition, target_sidecar_id=target
        )

    async def body(a: Assigner) -> None:
        await a.create("g")
        await a.create("classic", mode="kafka_group")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        err = await refused(a.admin.MoveLease(move(group="nope")))
        assert reason_of(err) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND", {"group": "nope"})
        err = await refused(a.admin.MoveLease(move(partition=9)))
        code, reason, metadata = reason_of(err)
        assert (code, reason, metadata["partition"]) == (
            grpc.StatusCode.NOT_FOUND,
            "TOPIC_NOT_FOUND",
            "9",
        )
        err = await refused(a.admin.MoveLease(move(target="sc-9")))
        assert reason_of(err) == (
            grpc.StatusCode.NOT_FOUND,
            "SIDECAR_NOT_FOUND",
            {"group": "g", "sidecar_id": "sc-9"},
        )
        err = await refused(a.admin.MoveLease(move(group="classic")))
        assert reason_of(err) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "GROUP_MODE_MISMATCH",
            {"group": "classic", "mode": "kafka_group"},
        )
        await sidecar.close()

    run(body)


def test_admin_calls_while_not_serving_are_not_ready() -> None:
    async def body(a: Assigner) -> None:
        calls = [
            a.admin.UpdateGroup(admin_pb2.UpdateGroupRequest(group=leased_config("g"))),
            a.admin.MoveLease(
                admin_pb2.MoveLeaseRequest(group="g", topic=TOPIC, target_sidecar_id="sc-1")
            ),
        ]
        for err in await asyncio.gather(*(refused(c) for c in calls)):
            code, reason, _ = reason_of(err)
            assert (code, reason) == (grpc.StatusCode.UNAVAILABLE, "SERVICE_NOT_READY")

    run(body, serving=False)


# ---- the group consumer config: the allow-list, pushes, what each member runs ---------------

REFUSED_KEYS = [
    "bootstrap.servers",
    "security.protocol",
    "sasl.password",
    "ssl.key.location",
    "plugin.library.paths",
    "interceptors",
    "client.id",
    "group.id",
    "group.instance.id",
    "enable.auto.commit",
    "no.such.property",
]


@pytest.mark.parametrize("mode", [common_pb2.GROUP_MODE_LEASED, common_pb2.GROUP_MODE_KAFKA_GROUP])
@pytest.mark.parametrize("key", REFUSED_KEYS)
def test_a_key_off_the_allow_list_is_refused_naming_it_in_either_mode(
    key: str, mode: common_pb2.GroupMode.ValueType
) -> None:
    async def body(a: Assigner) -> None:
        config = {"fetch.max.bytes": "1048576", key: "x"}
        group = leased_config("g", consumer_config=config)
        group.mode = mode
        err = await refused(a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=group)))
        assert reason_of(err) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_FIELD",
            {"field": "group.consumer_config", "key": key},
        )
        assert key in err.details()
        assert a.groups.get("g") is None
        # Nor may an update set it; the refused update changes nothing.
        await a.create(
            "g", mode="leased" if mode == common_pb2.GROUP_MODE_LEASED else "kafka_group"
        )
        err = await refused(
            a.admin.UpdateGroup(
                admin_pb2.UpdateGroupRequest(group=group, update_mask=mask("consumer_config"))
            )
        )
        assert reason_of(err)[2] == {"field": "group.consumer_config", "key": key}
        assert a.groups.group("g").record.config_version == 1
        assert a.groups.group("g").record.consumer_config == {}

    run(body)


def test_librdkafka_judges_values_on_top_of_the_sidecar_defaults() -> None:
    async def body(a: Assigner) -> None:
        # Alone a valid value; on the sidecar's fetch.max.bytes (8 MiB) one it cannot build.
        group = leased_config("g", consumer_config={"receive.message.max.bytes": "1000000"})
        err = await refused(a.admin.CreateGroup(admin_pb2.CreateGroupRequest(group=group)))
        assert reason_of(err)[2] == {
            "field": "group.consumer_config",
            "key": "receive.message.max.bytes",
        }
        assert "must be >= `fetch.max.bytes` + 512" in err.details()

    run(body)


def test_every_new_version_is_pushed_and_describe_shows_what_each_member_runs() -> None:
    async def body(a: Assigner) -> None:
        await a.create("g")
        sidecar = Sidecar(a.sessions, "sc-1")
        await sidecar.join("g")
        grants = await sidecar.grants(4)
        await sidecar.heartbeat(grants)
        # A change of another field than consumer_config is a new version too: pushed, so
        # the sidecars report running the group's current version.
        request = admin_pb2.UpdateGroupRequest(
            group=leased_config("g", balance_strategy=types_pb2.BALANCE_STRATEGY_LOAD),
            update_mask=mask("balance_strategy"),
        )
        assert (await a.admin.UpdateGroup(request)).group.config_version == 2
        while (message := await sidecar.next()).WhichOneof("kind") != "config_update":
            pass
        assert message.config_update.config_version == 2
        assert dict(message.config_update.consumer_config) == {}
        heartbeat = assigner_pb2.SessionHeartbeat(
            seq=2,
            leases=[
                assigner_pb2.LeaseProgress(topic=g.topic, partition=g.partition, epoch=g.epoch)
                for g in grants
            ],
            applied_config_version=1,
            config_rejection=types_pb2.ConfigRejection(config_version=2, reason="no"),
        )
        await sidecar.call.write(assigner_pb2.SessionRequest(heartbeat=heartbeat))
        while (await sidecar.next()).WhichOneof("kind") != "heartbeat_ack":
            pass
        described = await a.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(group="g"))
        (member,) = described.members
        assert member.applied_config_version == 1
        assert (member.config_rejection.config_version, member.config_rejection.reason) == (
            2,
            "no",
        )
        await sidecar.close()

    run(body)


def test_after_a_takeover_each_group_settles_for_its_own_ttl_plus_grace() -> None:
    """registry.restore: a kafka-fenced group with TTL 1.5 s settles 1.5 s + grace after
    the takeover, a default group 3 s + grace; the report waits for the last."""

    async def body(a: Assigner) -> None:
        snapshot = StateSnapshot(
            groups={
                "short": GroupRecord(
                    name="short",
                    topics=[TOPIC],
                    commit_fencing="kafka",
                    lease_ttl_seconds=1.5,
                    heartbeat_interval_seconds=0.5,
                ),
                "plain": GroupRecord(name="plain", topics=[TOPIC]),
            }
        )
        grace = a.settings.lease_grace_seconds
        last = await a.groups.restore(snapshot, 100.0)
        a.groups.start_serving()
        assert last == 100.0 + a.settings.lease_ttl_seconds + grace
        assert a.groups.group("short").coordinator.settle_until == 100.0 + 1.5 + grace
        assert a.groups.group("plain").coordinator.settle_until == last

    run(body, serving=False)
