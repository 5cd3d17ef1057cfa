"""The webhook egress policy (pure): the allow-list, the address rules, redaction."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.notifier.egress import EgressPolicy, EgressRefused, Target, is_redacted, redact

PUBLIC_V4 = "192.0.43.10"


def target(url: str, policy: EgressPolicy) -> Target:
    return policy.target(url)


def test_nothing_is_allowed_by_default() -> None:
    with pytest.raises(EgressRefused, match="allow-list"):
        EgressPolicy().target("https://hooks.example.com/x")


@pytest.mark.parametrize(
    ("entries", "url"),
    [
        (["hooks.example.com"], "https://hooks.example.com/services/T0/B0/secret"),
        (["*.example.com"], "https://a.b.example.com/x"),
        (["hooks.example.com:8443"], "https://hooks.example.com:8443/x"),
        (["10.0.0.0/8"], "http://10.1.2.3:8080/hook"),
        (["::1"], "http://[::1]:9000/"),
        (["127.0.0.1:9000"], "http://127.0.0.1:9000/alerts"),
    ],
)
def test_an_allow_listed_host_is_a_target(entries: list[str], url: str) -> None:
    EgressPolicy(entries).target(url)


@pytest.mark.parametrize(
    ("entries", "url", "why"),
    [
        (["hooks.example.com"], "https://evil.example.com/x", "allow-list"),
        (["*.example.com"], "https://example.com/x", "allow-list"),
        (["*.example.com"], "https://example.com.evil.net/x", "allow-list"),
        (["hooks.example.com:8443"], "https://hooks.example.com/x", "allow-list"),
        (["127.0.0.1:9000"], "http://127.0.0.1:8500/v1/kv/x", "allow-list"),  # Consul
        (["hooks.example.com"], "ftp://hooks.example.com/x", "http"),
        (["hooks.example.com"], "https://user:pw@hooks.example.com/x", "credentials"),
        ([], "http://169.254.169.254/latest/meta-data/", "allow-list"),
    ],
)
def test_other_targets_are_refused(entries: list[str], url: str, why: str) -> None:
    with pytest.raises(EgressRefused, match=why):
        EgressPolicy(entries).target(url)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",  # the cloud metadata address
        "100.64.0.1",  # shared address space
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        # issue 37, finding 10: on a NAT64 network these reach private IPv4
        "64:ff9b::a00:1",  # NAT64 well-known prefix, 10.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata address
        "64:ff9b:1::a00:1",  # NAT64 local-use prefix (RFC 8215)
        "64:ff9b:1:ffff::1",
        "::a00:1",  # IPv4-compatible 10.0.0.1
        "::169.254.169.254",
        "::ffff:0:a00:1",  # IPv4-translated (SIIT) 10.0.0.1
        "100::1",  # discard-only
        "200::1",  # unallocated (reserved) IPv6
    ],
)
def test_a_name_resolving_to_an_internal_address_is_refused(address: str) -> None:
    policy = EgressPolicy(["hooks.example.com"])
    t = policy.target("https://hooks.example.com/x")
    with pytest.raises(EgressRefused, match="not allow-listed by address"):
        policy.check_addresses(t, [PUBLIC_V4, address])  # one bad answer taints the name
    assert policy.check_addresses(t, [PUBLIC_V4]) == [PUBLIC_V4]


def test_nat64_of_a_public_address_is_public_and_of_an_allowed_network_allowed() -> None:
    policy = EgressPolicy(["hooks.example.com", "10.0.0.0/8"])
    t = policy.target("https://hooks.example.com/x")
    nat64_public = "64:ff9b::808:808"  # 8.8.8.8 through the NAT64 gateway
    assert policy.check_addresses(t, [nat64_public]) == [nat64_public]
    assert policy.check_addresses(t, ["64:ff9b::a00:1"]) == ["64:ff9b::a00:1"]  # 10.0.0.1
    with pytest.raises(EgressRefused):
        policy.check_addresses(t, ["64:ff9b::c0a8:1"])  # 192.168.0.1: not allow-listed


def test_an_internal_address_is_allowed_only_by_address_and_port() -> None:
    policy = EgressPolicy(["alerts.internal", "10.0.0.0/8:8080"])
    on_port = policy.target("http://alerts.internal:8080/x")
    assert policy.check_addresses(on_port, ["10.1.2.3"]) == ["10.1.2.3"]
    other_port = policy.target("http://alerts.internal:8500/x")
    with pytest.raises(EgressRefused):
        policy.check_addresses(other_port, ["10.1.2.3"])
    with pytest.raises(EgressRefused):
        policy.check_addresses(on_port, ["192.168.0.1"])


def test_bad_entries_are_refused_when_settings_load() -> None:
    for entry in ("", "not a host!", "h:99999", "h:port"):
        with pytest.raises(ValueError):
            EgressPolicy([entry])
    # Unicode digits pass str.isdigit(): the entry is named, not int()'s own message.
    with pytest.raises(ValueError, match="bad port"):
        EgressPolicy(["h:\u00b9"])


_internal_v4 = st.one_of(
    st.ip_addresses(v=4, network="127.0.0.0/8"),
    st.ip_addresses(v=4, network="10.0.0.0/8"),
    st.ip_addresses(v=4, network="192.168.0.0/16"),
    st.ip_addresses(v=4, network="169.254.0.0/16"),
    st.ip_addresses(v=4, network="172.16.0.0/12"),
)


@given(
    address=st.one_of(
        _internal_v4,
        _internal_v4.map(lambda a: ipaddress.IPv6Address(f"::ffff:{a}")),
        st.ip_addresses(v=6, network="fe80::/10"),
        st.ip_addresses(v=6, network="fc00::/7"),
    ),
    allowed=st.lists(st.sampled_from(["10.0.0.0/8", "127.0.0.1", "fd00::/8"]), max_size=2),
)
def test_a_non_global_address_passes_only_inside_an_allow_listed_network(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, allowed: list[str]
) -> None:
    policy = EgressPolicy(["hooks.example.com", *allowed])
    t = policy.target("https://hooks.example.com/x")
    plain = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    inside = any(
        (plain or address) in network or address in network
        for network in (ipaddress.ip_network(a) for a in allowed)
    )
    if inside:
        assert policy.check_addresses(t, [str(address)]) == [str(address)]
    else:
        with pytest.raises(EgressRefused):
            policy.check_addresses(t, [str(address)])


def test_redaction_keeps_scheme_host_and_port_only() -> None:
    assert redact("https://hooks.slack.com/services/T0/B0/XXXX") == "https://hooks.slack.com/…"
    assert redact("http://127.0.0.1:9000/alerts?token=s3cret") == "http://127.0.0.1:9000/…"
    assert redact("https://user:pw@h.example.com/") == "https://h.example.com/…"
    assert redact("https://h.example.com") == "https://h.example.com"
    assert redact("http://[::1]:9000/x") == "http://[::1]:9000/…"
    assert is_redacted(redact("https://hooks.slack.com/services/T0/B0/XXXX"))
    assert not is_redacted("https://hooks.slack.com/services/T0/B0/XXXX")
