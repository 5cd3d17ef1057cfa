"""The group consumer config allow-list, what a change costs, and librdkafka's verdict.

Pure rules as Hypothesis properties; librdkafka itself (a consumer that connects nowhere)
for the examples and the refusals it adds.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.runtime import consumer_config as cc
from services.runtime.consumer_config import (
    ALLOWED,
    LIMITS,
    MEMBERSHIP_ONLY,
    ConsumerConfigError,
    check_allowed,
    check_librdkafka,
    plan,
    refusal,
    validate,
)

allowed_keys = st.sampled_from(sorted(ALLOWED))
allowed_configs = st.dictionaries(allowed_keys, st.sampled_from(["1", "2", "true"]), max_size=6)
# What a caller might type: dotted lower-case names, some of them real librdkafka ones.
names = st.from_regex(r"[a-z][a-z_]{0,8}(\.[a-z_]{1,8}){0,3}", fullmatch=True)
REFUSED_EXAMPLES = {
    "bootstrap.servers": "where or as whom",
    "metadata.broker.list": "where or as whom",
    "client.id": "where or as whom",
    "security.protocol": "where or as whom",
    "sasl.mechanism": "where or as whom",
    "sasl.oauthbearer.token.endpoint.url": "where or as whom",
    "ssl.ca.location": "where or as whom",
    "ssl_engine_callback_data": "where or as whom",
    "enable.ssl.certificate.verification": "where or as whom",
    "https.ca.location": "where or as whom",
    "plugin.library.paths": "loads code",
    "interceptors": "loads code",
    "oauthbearer_token_refresh_cb": "loads code",
    "group.id": "set by the mesh",
    "group.instance.id": "set by the mesh",
    "group.protocol": "set by the mesh",
    "enable.auto.commit": "set by the mesh",
    "enable.auto.offset.store": "set by the mesh",
    "partition.assignment.strategy": "set by the mesh",
    "statistics.interval.ms": "set by the mesh",
    "debug": "set by the mesh",
    "log_level": "set by the mesh",
    "allow.auto.create.topics": "set by the mesh",
}


@given(names)
def test_a_key_is_allowed_exactly_when_it_is_on_the_list(key: str) -> None:
    assert (refusal(key) is None) == (key in ALLOWED)


@pytest.mark.parametrize(("key", "why"), sorted(REFUSED_EXAMPLES.items()))
def test_each_refusal_says_why(key: str, why: str) -> None:
    reason = refusal(key)
    assert reason is not None and why in reason
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_allowed({"fetch.max.bytes": "1048576", key: "x"})
    assert excinfo.value.key == key and key in excinfo.value.message


@given(allowed_configs, names.filter(lambda k: k not in ALLOWED))
def test_one_key_off_the_list_refuses_the_whole_config_naming_it(
    config: dict[str, str], key: str
) -> None:
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_allowed({**config, key: "1"})
    assert excinfo.value.key == key


@given(allowed_configs)
def test_keys_on_the_list_with_short_values_pass(config: dict[str, str]) -> None:
    check_allowed(config)


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_sizes_past_the_mesh_ceiling_are_refused(key: str) -> None:
    check_allowed({key: str(LIMITS[key])})
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_allowed({key: str(LIMITS[key] + 1)})
    assert excinfo.value.key == key


@pytest.mark.parametrize("value", ["\u00b9", " \u00b9", "\u0663"])
def test_a_size_of_unicode_digits_is_refused_not_crashed_on(value: str) -> None:
    # str.isdigit() accepts "¹", int() does not: the allow-list must not raise ValueError
    # (a CreateGroup/UpdateGroup answering UNKNOWN); librdkafka refuses the value.
    with pytest.raises(ConsumerConfigError) as excinfo:
        validate({"fetch.max.bytes": value})
    assert excinfo.value.key == "fetch.max.bytes"


@pytest.mark.parametrize("value", ["x" * 256, "line\nbreak"])
def test_values_are_short_printable_strings(value: str) -> None:
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_allowed({"client.rack": value})
    assert excinfo.value.key == "client.rack"


def test_at_most_so_many_properties() -> None:
    with pytest.raises(ConsumerConfigError):
        check_allowed({f"k{i}": "1" for i in range(cc.MAX_PROPERTIES + 1)})


def test_every_allowed_property_is_one_librdkafka_knows() -> None:
    """Each example alone, and all of them together, build a consumer."""
    for prop in ALLOWED.values():
        check_librdkafka({prop.name: prop.example})
    check_librdkafka({p.name: p.example for p in ALLOWED.values()})


def test_librdkafka_names_a_bad_value_and_a_cross_property_rule() -> None:
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_librdkafka({"fetch.max.bytes": "lots"})
    assert excinfo.value.key == "fetch.max.bytes"
    # On top of the sidecar's defaults (fetch.max.bytes 8 MiB): what a sidecar would build.
    with pytest.raises(ConsumerConfigError) as excinfo:
        check_librdkafka({"receive.message.max.bytes": "1000000"})
    assert excinfo.value.key == "receive.message.max.bytes"
    assert "must be >= `fetch.max.bytes` + 512" in excinfo.value.message


def test_the_allow_list_comes_before_librdkafka() -> None:
    """librdkafka would dlopen() a plugin path while building the throw-away consumer."""
    with pytest.raises(ConsumerConfigError) as excinfo:
        validate({"plugin.library.paths": "/nonexistent/libevil"})
    assert "loads code" in excinfo.value.message and "dlopen" not in excinfo.value.message


@given(allowed_configs, allowed_configs, st.booleans())
def test_a_plan_names_exactly_the_keys_that_differ(
    old: dict[str, str], new: dict[str, str], kafka_group: bool
) -> None:
    change = plan(old, new, kafka_group=kafka_group)
    differ = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
    assert change.keys == differ
    assert set(change.added) == new.keys() - old.keys()
    assert set(change.removed) == old.keys() - new.keys()
    assert all(old[k] == a and new[k] == b for k, (a, b) in change.changed.items())
    assert plan(new, old, kafka_group=kafka_group).keys == differ
    assert plan(old, old, kafka_group=kafka_group).empty


@given(allowed_configs, allowed_configs)
def test_only_membership_timers_spare_a_leased_consumer(
    old: dict[str, str], new: dict[str, str]
) -> None:
    leased = plan(old, new, kafka_group=False)
    classic = plan(old, new, kafka_group=True)
    # A subscribe()d consumer reads every property; an assign()ed one all but the timers.
    assert classic.new_consumer == (not classic.empty)
    assert leased.new_consumer == bool(leased.keys - MEMBERSHIP_ONLY)
    assert {
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
    } == MEMBERSHIP_ONLY
