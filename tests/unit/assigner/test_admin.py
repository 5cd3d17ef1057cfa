"""The admin API's pure parts: validation, update masks, idempotency, paging, lag."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import duration_pb2, field_mask_pb2
from google.rpc import error_details_pb2
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dataservice.assigner.v1 import admin_pb2, types_pb2
from dataservice.common.v1 import common_pb2
from dsclient.reasons import DsError, Reason
from services.assigner.admin.idempotency import IdempotencyCache, fingerprint
from services.assigner.admin.librdkafka import check_librdkafka_properties
from services.assigner.admin.messages import wall_timestamp
from services.assigner.admin.paging import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    PageTokens,
    page,
    page_size,
)
from services.assigner.admin.records import make_record, record_fields
from services.assigner.admin.update_mask import (
    MUTABLE_PATHS,
    apply_update_mask,
    changed_paths,
    mask_paths,
)
from services.assigner.admin.validation import (
    validate_group_config,
    validate_request_id,
    validate_timing,
    version_conflict,
)
from services.assigner.group_timing import GroupTiming
from services.assigner.offsets import Offsets, PartitionOffsets, lag_records, lag_seconds, total_lag
from services.assigner.offsets_view import OffsetsView, budget
from services.assigner.settings import GroupSeed
from services.runtime.topic_partition import TopicPartition


def config(**kwargs: object) -> types_pb2.GroupConfig:
    base: dict[str, object] = {
        "name": "orders",
        "topics": ["orders.v1"],
        "mode": common_pb2.GROUP_MODE_LEASED,
    }
    base.update(kwargs)
    return types_pb2.GroupConfig(**base)  # type: ignore[arg-type]


def dur(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def check(cfg: types_pb2.GroupConfig) -> None:
    validate_group_config(cfg, 3.0, 1.0)


def field_of(excinfo: pytest.ExceptionInfo[DsError]) -> str:
    assert excinfo.value.reason is Reason.INVALID_FIELD
    return excinfo.value.metadata["field"]


# ---- validation ----------------------------------------------------------------------


def test_a_valid_config_passes() -> None:
    check(config(consumer_config={"fetch.max.bytes": "52428800"}, alert_template="oncall"))
    check(
        config(
            name="a" * 249,
            lease_ttl=dur(10),
            heartbeat_interval=dur(2),
            commit_fencing=types_pb2.COMMIT_FENCING_KAFKA,
        )
    )


@pytest.mark.parametrize("name", ["", "a" * 250, "has space", "slash/no", "ümlaut", "a:b"])
def test_group_names_follow_kafka_group_id_rules(name: str) -> None:
    with pytest.raises(DsError) as excinfo:
        check(config(name=name))
    assert field_of(excinfo) == "group.name"


def test_topics_must_be_named_valid_and_unique() -> None:
    with pytest.raises(DsError) as excinfo:
        check(config(topics=[]))
    assert field_of(excinfo) == "group.topics"
    with pytest.raises(DsError) as excinfo:
        check(config(topics=["ok", "bad topic"]))
    assert field_of(excinfo) == "group.topics[1]"
    with pytest.raises(DsError) as excinfo:
        check(config(topics=["t", "t"]))
    assert field_of(excinfo) == "group.topics[1]"


def test_mode_must_be_set() -> None:
    with pytest.raises(DsError) as excinfo:
        check(config(mode=common_pb2.GROUP_MODE_UNSPECIFIED))
    assert field_of(excinfo) == "group.mode"


@pytest.mark.parametrize("key", ["group.id", "enable.auto.commit"])
def test_consumer_config_may_not_set_what_the_mesh_owns(key: str) -> None:
    with pytest.raises(DsError) as excinfo:
        check(config(consumer_config={"fetch.max.bytes": "1048576", key: "x"}))
    assert field_of(excinfo) == "group.consumer_config"
    assert excinfo.value.metadata["key"] == key


def test_librdkafka_judges_property_names_and_values() -> None:
    check_librdkafka_properties("c", {"fetch.max.bytes": "52428800"})
    with pytest.raises(DsError) as excinfo:
        check_librdkafka_properties("c", {"no.such.property": "1"})
    assert field_of(excinfo) == "c"
    assert excinfo.value.metadata["key"] == "no.such.property"
    with pytest.raises(DsError) as excinfo:
        check_librdkafka_properties("c", {"fetch.max.bytes": "lots"})
    assert excinfo.value.metadata["key"] == "fetch.max.bytes"


def test_heartbeat_must_fit_twice_in_the_lease_ttl() -> None:
    with pytest.raises(DsError) as excinfo:
        check(config(lease_ttl=dur(3), heartbeat_interval=dur(2)))
    assert field_of(excinfo) == "group.heartbeat_interval"
    with pytest.raises(DsError) as excinfo:
        check(config(lease_ttl=dur(0.1)))
    assert field_of(excinfo) == "group.lease_ttl"
    # Unset values mean the assigner's defaults (3 s, 1 s), which fit.
    assert validate_timing(config(), 3.0, 1.0) == (3.0, 1.0)


@pytest.mark.parametrize("request_id", ["has space", "x" * 129, "a/b"])
def test_request_ids_are_uuid_like(request_id: str) -> None:
    with pytest.raises(DsError) as excinfo:
        validate_request_id(request_id)
    assert field_of(excinfo) == "request_id"


# ---- update masks --------------------------------------------------------------------


def mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


def test_an_empty_mask_means_every_mutable_field() -> None:
    assert mask_paths(None) == MUTABLE_PATHS
    assert mask_paths(mask()) == MUTABLE_PATHS


@pytest.mark.parametrize("path", ["name", "config_version", "bogus", "consumer_config.x"])
def test_immutable_or_unknown_mask_paths_are_refused(path: str) -> None:
    with pytest.raises(DsError) as excinfo:
        mask_paths(mask("topics", path))
    assert field_of(excinfo) == "update_mask"
    assert excinfo.value.metadata["path"] == path


def test_mask_replaces_named_fields_only_maps_as_a_whole() -> None:
    current = config(consumer_config={"a": "1", "b": "2"}, alert_template="old", lease_ttl=dur(6))
    patch = config(name="orders", topics=["x"], consumer_config={"c": "3"}, alert_template="new")
    result = apply_update_mask(current, patch, ["consumer_config", "lease_ttl"])
    assert dict(result.consumer_config) == {"c": "3"}
    assert not result.HasField("lease_ttl")  # unset in the patch: back to the default
    assert list(result.topics) == ["orders.v1"]
    assert result.alert_template == "old"
    assert changed_paths(current, result) == ["consumer_config", "lease_ttl"]


configs = st.builds(
    types_pb2.GroupConfig,
    name=st.just("g"),
    topics=st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3),
    mode=st.sampled_from([1, 2]),
    consumer_config=st.dictionaries(st.sampled_from(["k1", "k2"]), st.sampled_from(["1", "2"])),
    alert_template=st.sampled_from(["", "t"]),
    balance_strategy=st.sampled_from([0, 1, 2]),
    config_version=st.integers(0, 5),
)


@given(configs, configs, st.lists(st.sampled_from(MUTABLE_PATHS), unique=True))
def test_mask_application_properties(
    current: types_pb2.GroupConfig, patch: types_pb2.GroupConfig, paths: list[str]
) -> None:
    result = apply_update_mask(current, patch, paths)
    assert result.name == current.name
    assert result.config_version == current.config_version
    changed = changed_paths(current, result)
    assert set(changed) <= set(paths)
    # Applying the same patch again changes nothing more.
    assert apply_update_mask(result, patch, paths) == result
    # With every path, the mutable fields are the patch's.
    full = apply_update_mask(current, patch, MUTABLE_PATHS)
    assert changed_paths(patch, full) == []


def test_record_refuses_settings_it_cannot_carry() -> None:
    defaults = {"balance_strategy": "count"}
    timing = GroupTiming(3.0, 1.0)
    record = make_record(
        record_fields(config(lease_ttl=dur(3), consumer_config={"a": "1"}), timing), defaults
    )
    assert (record.name, record.topics, record.mode) == ("orders", ["orders.v1"], "leased")
    assert record.consumer_config == {"a": "1"}
    assert (record.lease_ttl_seconds, record.heartbeat_interval_seconds) == (None, None)
    with pytest.raises(DsError) as excinfo:
        make_record(record_fields(config(alert_template="x"), timing), defaults)
    assert field_of(excinfo) == "group.alert_template"


# ---- idempotency ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def move(partition: int, request_id: str = "r-1") -> admin_pb2.MoveLeaseRequest:
    return admin_pb2.MoveLeaseRequest(
        group="g", topic="t", partition=partition, target_sidecar_id="b", request_id=request_id
    )


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> admin_pb2.MoveLeaseResponse:
        self.calls += 1
        await asyncio.sleep(0)
        return admin_pb2.MoveLeaseResponse(lease=types_pb2.Lease(epoch=self.calls))


def test_a_retry_returns_the_first_response_without_applying_again() -> None:
    async def scenario() -> None:
        clock, apply = Clock(), Counter()
        cache = IdempotencyCache(ttl=600, clock=clock)
        first = await cache.run("MoveLease", move(1), "r-1", apply)
        clock.now += 599
        again = await cache.run("MoveLease", move(1), "r-1", apply)
        assert apply.calls == 1 and again == first
        # After the TTL the request_id is forgotten: it runs again.
        clock.now += 2
        later = await cache.run("MoveLease", move(1), "r-1", apply)
        assert apply.calls == 2 and later.lease.epoch == 2
        # Without a request_id nothing is remembered.
        await cache.run("MoveLease", move(1, ""), "", apply)
        await cache.run("MoveLease", move(1, ""), "", apply)
        assert apply.calls == 4

    asyncio.run(scenario())


def test_a_used_request_id_with_another_body_is_refused() -> None:
    async def scenario() -> None:
        cache = IdempotencyCache(clock=Clock())
        await cache.run("MoveLease", move(1), "r-1", Counter())
        with pytest.raises(DsError) as excinfo:
            await cache.run("MoveLease", move(2), "r-1", Counter())
        assert field_of(excinfo) == "request_id"
        # ... or for another RPC.
        other = admin_pb2.UpdateGroupRequest(request_id="r-1")
        with pytest.raises(DsError):
            await cache.run("UpdateGroup", other, "r-1", Counter())

    asyncio.run(scenario())


def test_failures_are_not_remembered_and_concurrent_retries_run_once() -> None:
    async def scenario() -> None:
        cache = IdempotencyCache(clock=Clock())

        async def failing() -> admin_pb2.MoveLeaseResponse:
            raise DsError(Reason.SIDECAR_NOT_FOUND, "no")

        with pytest.raises(DsError):
            await cache.run("MoveLease", move(1), "r-1", failing)
        apply = Counter()
        results = await asyncio.gather(
            *(cache.run("MoveLease", move(1), "r-1", apply) for _ in range(5))
        )
        assert apply.calls == 1
        assert all(r == results[0] for r in results)
        assert len(cache) == 1

    asyncio.run(scenario())


def test_the_cache_is_bounded() -> None:
    async def scenario() -> None:
        cache = IdempotencyCache(clock=Clock(), max_entries=3)
        for i in range(5):
            await cache.run("MoveLease", move(1, f"r-{i}"), f"r-{i}", Counter())
        assert len(cache) == 3

    asyncio.run(scenario())


def test_the_fingerprint_ignores_only_the_request_id() -> None:
    assert fingerprint("M", move(1, "a")) == fingerprint("M", move(1, "b"))
    assert fingerprint("M", move(1)) != fingerprint("M", move(2))
    assert fingerprint("M", move(1)) != fingerprint("N", move(1))


# ---- paging --------------------------------------------------------------------------


def test_page_tokens_are_only_accepted_from_their_issuer() -> None:
    tokens = PageTokens()
    assert tokens.parse("") == ""
    assert tokens.parse(tokens.issue("orders")) == "orders"
    for bad in ["garbage", "!!!", PageTokens().issue("orders"), tokens.issue("x")[:-2]]:
        with pytest.raises(DsError) as excinfo:
            tokens.parse(bad)
        assert field_of(excinfo) == "page_token"


def test_page_size_defaults_and_caps() -> None:
    assert page_size(0) == DEFAULT_PAGE_SIZE
    assert page_size(7) == 7
    assert page_size(5000) == MAX_PAGE_SIZE
    with pytest.raises(DsError) as excinfo:
        page_size(-1)
    assert field_of(excinfo) == "page_size"


@given(st.lists(st.text("abc", min_size=1, max_size=3), unique=True), st.integers(1, 4))
def test_paging_visits_every_name_once_in_order(names: list[str], size: int) -> None:
    names.sort()
    seen: list[str] = []
    after = ""
    for _ in range(len(names) + 2):
        chosen, last = page(names, after, size)
        assert len(chosen) <= size
        seen.extend(chosen)
        if not last:
            break
        after = last
    assert seen == names


# ---- offsets and lag -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "earliest", "end", "lag"),
    [
        (40, 0, 100, 60),
        (100, 0, 100, 0),
        (-1, 0, 100, 100),  # nothing committed: everything left in the log
        (-1, 30, 100, 70),
        (10, 30, 100, 70),  # the commit points below the log start (retention)
        (120, 0, 100, 0),
    ],
)
def test_lag_in_records(committed: int, earliest: int, end: int, lag: int) -> None:
    assert lag_records(committed, earliest, end) == lag
    assert PartitionOffsets(committed, earliest, end).lag == lag


def test_lag_in_seconds() -> None:
    assert lag_seconds(0, None, 1000.0) == 0.0
    assert lag_seconds(5, None, 1000.0) == -1.0
    assert lag_seconds(5, 990_000, 1000.0) == pytest.approx(10.0)
    assert lag_seconds(5, 1_010_000, 1000.0) == 0.0  # clock skew: never negative
    total = {TopicPartition("t", 0): PartitionOffsets(1, 0, 5)}
    assert total_lag(total) == 4


def test_monotonic_instants_become_wall_clock_time() -> None:
    ts = wall_timestamp(mono=95.0, now_mono=100.0, now_wall=1_700_000_000.0)
    assert ts.ToNanoseconds() == 1_699_999_995 * 10**9


def test_a_precondition_not_yet_catalogued_still_travels_as_failed_precondition() -> None:
    err = version_conflict("g", 3, 4)
    assert err.code is grpc.StatusCode.FAILED_PRECONDITION
    status = err.to_status()
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    info = error_details_pb2.ErrorInfo()
    assert len(status.details) == 1 and status.details[0].Unpack(info)
    assert info.reason == "CONFIG_VERSION_CONFLICT"
    assert dict(info.metadata) == {"group": "g", "expected": "3", "current": "4"}


# ---- OffsetsView: single-flight, cached, bounded waits --------------------------------


class FakeReader:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.reads = 0
        self.probes = 0

    def read(self, group: str, partitions: object) -> Offsets:
        import time

        self.reads += 1
        time.sleep(self.delay)
        return {TopicPartition("t", 0): PartitionOffsets(self.reads, 0, 10)}

    def read_many(self, groups: dict[str, object]) -> dict[str, Offsets]:
        return {g: self.read(g, None) for g in groups}

    def oldest_timestamps(self, starts: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        self.probes += 1
        return {tp: 1000 * offset for tp, offset in starts.items()}


def view(reader: FakeReader, clock: Clock) -> OffsetsView:
    return OffsetsView(reader, max_age=1.0, probe_interval=2.0, clock=clock)  # type: ignore[arg-type]


def test_polling_reads_kafka_once_per_max_age() -> None:
    async def scenario() -> None:
        clock, reader = Clock(), FakeReader(delay=0.05)
        offsets = view(reader, clock)
        tps = [TopicPartition("t", 0)]
        results = await asyncio.gather(*(offsets.group("g", tps, 5.0) for _ in range(10)))
        assert reader.reads == 1 and all(r == results[0] for r in results)
        clock.now += 0.5
        await offsets.group("g", tps, 5.0)
        assert reader.reads == 1
        clock.now += 1.0
        fresh = await offsets.group("g", tps, 5.0)
        assert reader.reads == 2 and fresh[tps[0]].committed == 2

    asyncio.run(scenario())


def test_a_slow_kafka_is_unavailable_within_the_callers_budget() -> None:
    async def scenario() -> None:
        offsets = view(FakeReader(delay=0.5), Clock())
        with pytest.raises(DsError) as excinfo:
            await offsets.group("g", [TopicPartition("t", 0)], 0.05)
        assert excinfo.value.reason is Reason.KAFKA_UNAVAILABLE
        many = await offsets.many({"g": [TopicPartition("t", 0)]}, 0.05)
        assert isinstance(many["g"], DsError)

    asyncio.run(scenario())


def test_record_timestamps_are_probed_rarely_and_remembered() -> None:
    async def scenario() -> None:
        clock, reader = Clock(), FakeReader()
        offsets = view(reader, clock)
        a, b = TopicPartition("t", 0), TopicPartition("t", 1)
        assert await offsets.oldest_timestamps({a: 5}, 1.0) == {a: 5000}
        # Remembered per (partition, offset): no new probe for what is known.
        assert await offsets.oldest_timestamps({a: 5}, 1.0) == {a: 5000}
        assert reader.probes == 1
        # A new offset within the probe interval stays unknown for now ...
        assert await offsets.oldest_timestamps({a: 5, b: 7}, 1.0) == {a: 5000}
        clock.now += 2.0
        # ... and is read by the next probe.
        assert await offsets.oldest_timestamps({a: 5, b: 7}, 1.0) == {a: 5000, b: 7000}
        assert reader.probes == 2

    asyncio.run(scenario())


def test_budget_takes_a_share_of_the_deadline() -> None:
    assert budget(None, 5.0) == 5.0
    assert budget(1.0, 5.0) == 0.5
    assert budget(100.0, 5.0) == 5.0
    assert budget(-1.0, 5.0) == 0.0


def test_groups_declared_in_the_config_file_follow_the_same_allow_list() -> None:
    GroupSeed(name="g", topics=["t"], consumer_config={"fetch.max.bytes": "1048576"})
    with pytest.raises(ValidationError, match=r"'bootstrap\.servers' changes where or as whom"):
        GroupSeed(name="g", topics=["t"], consumer_config={"bootstrap.servers": "evil:9092"})
    with pytest.raises(ValidationError, match=r"fetch\.max\.bytes"):
        GroupSeed(name="g", topics=["t"], consumer_config={"fetch.max.bytes": "lots"})
