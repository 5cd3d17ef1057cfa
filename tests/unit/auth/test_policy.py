"""The policy's decisions and the method rules, pure (Hypothesis where it fits)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dataservice.assigner.v1 import admin_pb2, assigner_pb2, binding_pb2
from dataservice.notifier.v1 import notifier_pb2
from dataservice.sidecar.v1 import stream_pb2
from services.runtime.auth.policy import Permission, Policy, PolicyError, Role, Verb, parse_policy
from services.runtime.auth.rules import RULES, is_public, rule_for

names = st.text(st.characters(categories=("L", "N"), include_characters="-._"), min_size=1)
verbs = st.sampled_from(list(Verb))
ROLE_TEXTS = ["sidecar", "admin", "reporter", "viewer"]


@given(identity=names, permission=st.builds(Permission, verbs, names))
def test_an_identity_the_policy_does_not_name_may_do_nothing_but_be_known(
    identity: str, permission: Permission
) -> None:
    assume(identity != "someone-else")
    policy = parse_policy("identities: {someone-else: [admin, 'reader:*', sidecar, reporter]}")
    assert policy.allows(identity, permission) is False


@given(group=names, other=names, identity=names)
def test_a_reader_reads_and_describes_its_group_only(group: str, other: str, identity: str) -> None:
    policy = Policy.from_mapping({identity: [f"reader:{group}"]})
    assert policy.allows(identity, Permission(Verb.READ, group))
    assert policy.allows(identity, Permission(Verb.DESCRIBE, group))
    assert policy.allows(identity, Permission(Verb.READ, other)) is (other == group)
    for verb in (Verb.ADMIN, Verb.VIEW, Verb.REPORT, Verb.SESSION):
        assert not policy.allows(identity, Permission(verb, group))


@given(identity=names, other=names)
def test_a_sidecar_holds_sessions_only_for_the_ids_it_names(identity: str, other: str) -> None:
    own = Policy.from_mapping({identity: ["sidecar"]})
    assert own.allows(identity, Permission(Verb.SESSION, identity))
    assert own.allows(identity, Permission(Verb.SESSION, other)) is (other == identity)
    assert not own.allows(identity, Permission(Verb.SESSION, ""))
    named = Policy.from_mapping({identity: [f"sidecar:{other}"]})
    assert named.allows(identity, Permission(Verb.SESSION, other))
    assert not named.allows(identity, Permission(Verb.READ, other))


@given(identity=names, pod=names, other=names)
def test_a_pod_bound_sidecar_holds_its_pod_s_id_and_no_other(
    identity: str, pod: str, other: str
) -> None:
    """Workload identity: the bare ``sidecar`` role also grants the Session (and Leave) of
    the pod the caller's token is bound to; another pod's id, never."""
    policy = Policy.from_mapping({identity: ["sidecar", "serves:orders"]})
    assert policy.allows(identity, Permission(Verb.SESSION, pod), pod=pod)
    assert policy.allows(identity, Permission(Verb.SESSION, identity), pod=pod)
    assert policy.allows(identity, Permission(Verb.SESSION, other), pod=pod) is (
        other in (pod, identity)
    )
    # No pod (a token bound to none, a project JWT, a certificate): today's rule.
    assert policy.allows(identity, Permission(Verb.SESSION, pod)) is (pod == identity)
    assert not policy.allows(identity, Permission(Verb.SESSION, ""), pod="")


ANY_ROLES = st.lists(
    st.sampled_from([*ROLE_TEXTS, "sidecar:x", "reader:demo", "serves:demo", "endpoint:h"])
)


@given(
    identity=names,
    pod=names,
    roles=ANY_ROLES,
    permission=st.builds(Permission, verbs, names | st.just("")),
)
def test_a_pod_changes_nothing_but_the_bare_sidecar_role_s_session(
    identity: str, pod: str, roles: list[str], permission: Permission
) -> None:
    policy = Policy.from_mapping({identity: roles})
    with_pod = policy.allows(identity, permission, pod=pod)
    without = policy.allows(identity, permission)
    if with_pod != without:
        assert with_pod and "sidecar" in roles
        assert (permission.verb, permission.resource) == (Verb.SESSION, pod)
    # Not named by the policy: a pod grants nothing.
    assert not Policy.from_mapping({}).allows(identity, permission, pod=pod) or (
        permission.verb is Verb.AUTHENTICATED
    )


@given(identity=names, pod=names, other=names)
def test_a_named_sidecar_id_is_not_widened_by_the_pod(identity: str, pod: str, other: str) -> None:
    assume(pod != other)
    policy = Policy.from_mapping({identity: [f"sidecar:{other}"]})
    assert policy.allows(identity, Permission(Verb.SESSION, other), pod=pod)
    assert not policy.allows(identity, Permission(Verb.SESSION, pod), pod=pod)


@given(roles=st.lists(st.sampled_from([*ROLE_TEXTS, "reader:demo", "reader:*"])), perm=verbs)
def test_more_roles_never_allow_less(roles: list[str], perm: Verb) -> None:
    """Monotonic: adding a role to an identity never takes a permission away."""
    permission = Permission(perm, "demo")
    fewer = Policy.from_mapping({"x": roles[:-1]})
    more = Policy.from_mapping({"x": roles})
    assert not fewer.allows("x", permission) or more.allows("x", permission)


def test_admin_viewer_reporter() -> None:
    policy = Policy.from_mapping({"ops": ["admin"], "eye": ["viewer"], "rep": ["reporter"]})
    assert policy.allows("ops", Permission(Verb.ADMIN))
    assert policy.allows("ops", Permission(Verb.VIEW))
    assert not policy.allows("ops", Permission(Verb.READ, "demo"))
    assert policy.allows("eye", Permission(Verb.DESCRIBE, "demo"))
    assert not policy.allows("eye", Permission(Verb.ADMIN))
    assert policy.allows("rep", Permission(Verb.REPORT))
    assert not policy.allows("rep", Permission(Verb.VIEW))
    assert all(policy.allows(n, Permission(Verb.AUTHENTICATED)) for n in ("ops", "eye", "rep"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("identities: {a: [root]}", "unknown role"),
        ("identities: {a: [reader]}", "must name a group"),
        ("identities: {a: ['admin:x']}", "takes no argument"),
        ("identities: {a: admin}", "list of role names"),
        ("groups: {}", "one key"),
        ("identities: [", "not valid YAML"),
    ],
)
def test_a_bad_policy_file_is_refused_with_the_entry_named(text: str, why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        parse_policy(text)


def test_role_parse() -> None:
    assert Role.parse("reader:demo") == Role("reader", "demo")
    assert Role.parse(" sidecar:sidecar-1 ") == Role("sidecar", "sidecar-1")


def _methods() -> list[str]:
    out = []
    for module, service in [
        (assigner_pb2, "AssignerService"),
        (binding_pb2, "BindingService"),
        (admin_pb2, "AdminService"),
        (stream_pb2, "StreamService"),
        (notifier_pb2, "NotifierService"),
    ]:
        descriptor = module.DESCRIPTOR.services_by_name[service]
        out += [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]
    return out


@pytest.mark.parametrize("method", _methods())
def test_every_rpc_of_every_service_has_a_rule(method: str) -> None:
    """Fail closed is the interceptor's default; this keeps it from being the API's."""
    assert method in RULES


def test_rules_read_the_resource_from_the_request() -> None:
    join = assigner_pb2.SessionRequest(join=assigner_pb2.SessionJoin(sidecar_id="s-1"))
    session = rule_for("/dataservice.assigner.v1.AssignerService/Session")
    assert session is not None
    assert session.permission(join, "") == Permission(Verb.SESSION, "s-1")
    heartbeat = assigner_pb2.SessionRequest(heartbeat=assigner_pb2.SessionHeartbeat())
    assert session.permission(heartbeat, "") == Permission(Verb.SESSION, "")
    stream = rule_for("/dataservice.sidecar.v1.StreamService/Stream")
    assert stream is not None
    opened = stream_pb2.StreamRequest(open=stream_pb2.StreamOpen(group="demo"))
    assert stream.permission(opened, "") == Permission(Verb.READ, "demo")
    status = rule_for("/dataservice.sidecar.v1.StreamService/Status")
    assert status is not None
    assert status.permission(stream_pb2.StatusRequest(), "demo") == Permission(Verb.READ, "demo")
    assert rule_for("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is not None
    assert rule_for("/dataservice.assigner.v1.AdminService/Unknown") is None
    assert is_public("/grpc.health.v1.Health/Check")


@given(group=names, other=names, identity=names)
def test_a_sidecar_identity_serves_only_the_groups_its_scope_names(
    group: str, other: str, identity: str
) -> None:
    """issue 37, finding 1: the groups a sidecar credential may join are part of it."""
    scoped = Policy.from_mapping({identity: ["sidecar", f"serves:{group}"]})
    assert scoped.allows(identity, Permission(Verb.SERVE, group))
    assert scoped.allows(identity, Permission(Verb.SERVE, other)) is (other == group)
    assert not scoped.allows(identity, Permission(Verb.READ, group)), "serving is not reading"
    unscoped = Policy.from_mapping({identity: ["sidecar"]})
    assert not unscoped.allows(identity, Permission(Verb.SERVE, group)), "no scope: none"
    anywhere = Policy.from_mapping({identity: ["sidecar", "serves:*"]})
    assert anywhere.allows(identity, Permission(Verb.SERVE, other))


def test_an_endpoint_scope_names_hosts_or_a_suffix() -> None:
    policy = Policy.from_mapping({"sc": ["endpoint:*.pods.local", "endpoint:sc-0.example"]})
    for host, allowed in [
        ("a.pods.local", True),
        ("A.PODS.LOCAL", True),
        ("pods.local", False),
        ("a.pods.local.evil.example", False),
        ("sc-0.example", True),
        ("x.sc-0.example", False),
        ("", False),
    ]:
        assert policy.allows("sc", Permission(Verb.ADVERTISE, host)) is allowed, host
    for text in ("serves", "serves:", "endpoint"):
        with pytest.raises(PolicyError):
            Role.parse(text)
