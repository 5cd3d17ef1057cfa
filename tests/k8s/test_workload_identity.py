"""Workload identity against the real API server: a pod's projected service-account token
(audience ``ds-assigner``, the service's own, here made with ``kubectl create token``, what
the kubelet projects) authenticates a call to the assigner's real servicers behind the real
authorization interceptor, verified by a TokenReview the assigner makes with its own
service account (bound to system:auth-delegator). The identity is
``system:serviceaccount:NAMESPACE:NAME`` and the policy's roles and group scopes apply to
it; a token for another audience (``vault``, or ``ds-sidecar``: one a pod sends its sidecar,
replayed at the assigner), or of a service account the policy does not name, is refused.
A token bound to a pod (what the kubelet projects) names its pod too: an injected sidecar,
whose id is its pod's name, holds its own Session with it and no other pod's."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml

from dataservice.assigner.v1 import assigner_pb2, binding_pb2
from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.token_review import TokenReviewSettings
from tests.support.prod_overlay_auth import prod_overlay_auth
from tests.unit.assigner.rpc_harness import (
    Assigner,
    Sidecar,
    join,
    reason_of,
    refused,
    run,
    stream_refused,
)

pytestmark = [pytest.mark.timeout(180)]

NAMESPACE = "workload-identity"
READER = f"system:serviceaccount:{NAMESPACE}:orders-reader"
CONSUMER = f"system:serviceaccount:{NAMESPACE}:orders-consumer"
POD = "orders-consumer-7d9f8-x2x5q"  # a Deployment's pod, by name (no kubelet runs it)


def token(cluster: kube.Cluster, account: str, *audiences: str, pod: str = "") -> str:
    """A token of ``account`` (``kubectl create token``: a TokenRequest), bound to ``pod``
    when named (the kind the kubelet projects)."""
    flags = [f"--audience={a}" for a in audiences]
    if pod:
        flags += ["--bound-object-kind=Pod", f"--bound-object-name={pod}"]
    return cluster.kubectl("create", "token", account, "-n", NAMESPACE, "--duration=10m", *flags)


@pytest.fixture(scope="module")
def accounts(cluster: kube.Cluster) -> kube.Cluster:
    cluster.kubectl("create", "namespace", NAMESPACE)
    for account in ("orders-reader", "orders-consumer", "stranger", "ds-assigner"):
        cluster.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    # The assigner reviews tokens with its own service account (TokenReview needs it).
    cluster.kubectl("create", "clusterrolebinding", "ds-assigner-token-review",
                    "--clusterrole=system:auth-delegator",
                    f"--serviceaccount={NAMESPACE}:ds-assigner")  # fmt: skip
    return cluster


def bearer(value: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {value}"),)


def review_auth(
    cluster: kube.Cluster, directory: Path, identities: dict[str, list[str]]
) -> AuthSettings:
    """The assigner's auth: this policy, and TokenReviews made with the test namespace's
    ds-assigner service account (bound to system:auth-delegator) against this cluster."""
    credential = directory / "assigner-token"
    credential.write_text(token(cluster, "ds-assigner"))
    policy = directory / "policy.yaml"
    policy.write_text(yaml.safe_dump({"identities": identities}))
    return AuthSettings(
        enabled=True,
        policy_file=policy,
        identity_from="token",
        token_review=TokenReviewSettings(
            server=cluster.server, ca_file=Path(cluster.ca), token_file=credential
        ),
    )


def test_a_projected_token_is_verified_by_token_review_and_mapped_by_the_policy(
    accounts: kube.Cluster, tmp_path: Path
) -> None:
    cluster = accounts
    auth = review_auth(cluster, tmp_path, {READER: ["reader:orders"]})
    reader = token(cluster, "orders-reader", "ds-assigner")
    other_audience = token(cluster, "orders-reader", "vault")
    for_sidecar = token(cluster, "orders-reader", "ds-sidecar")
    stranger = token(cluster, "stranger", "ds-assigner")

    async def body(a: Assigner) -> None:
        for group in ("orders", "payments"):
            await a.create(group)

        def bind(group: str) -> binding_pb2.BindRequest:
            return binding_pb2.BindRequest(client_id="app-1", group=group)

        bound = await a.bindings.Bind(bind("orders"), metadata=bearer(reader))
        assert bound.binding.group == "orders"
        print(f"\n{READER} (audience ds-assigner): Bind orders -> OK")
        for who, call_token, group, expected in (
            (READER, reader, "payments", grpc.StatusCode.PERMISSION_DENIED),  # out of scope
            ("(audience vault)", other_audience, "orders", grpc.StatusCode.UNAUTHENTICATED),
            ("(audience ds-sidecar)", for_sidecar, "orders", grpc.StatusCode.UNAUTHENTICATED),
            ("stranger", stranger, "orders", grpc.StatusCode.PERMISSION_DENIED),  # no role
            ("(not a token)", "x" * 40, "orders", grpc.StatusCode.UNAUTHENTICATED),
        ):
            err = await refused(a.bindings.Bind(bind(group), metadata=bearer(call_token)))
            code, _, _ = reason_of(err)
            print(f"{who}: Bind {group} -> {code.name}: {err.details()}")
            assert code == expected, err.details()

    run(body, auth=auth, timeout=60)


def test_a_pod_bound_token_holds_the_session_of_its_pod_s_sidecar_id_only(
    accounts: kube.Cluster, tmp_path: Path
) -> None:
    """An injected sidecar's id is its pod's name (DS_ID=$(POD_NAME)) and its identity the
    service account the Deployment's pods share. A token bound to the pod (TokenRequest
    with boundObjectRef kind Pod, as the kubelet projects it) is reviewed with the pod's
    name, and the bare ``sidecar`` role holds that id's Session and no other; a token of
    the same account bound to no pod keeps the old rule (only the id equal to the identity)."""
    cluster = accounts
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": POD, "namespace": NAMESPACE},
           "spec": {"serviceAccountName": "orders-consumer",
                    "containers": [{"name": "app", "image": "example.invalid/app:1"}]}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    bound = token(cluster, "orders-consumer", "ds-assigner", pod=POD)
    unbound = token(cluster, "orders-consumer", "ds-assigner")
    auth = review_auth(cluster, tmp_path, {CONSUMER: ["sidecar", "serves:orders"]})

    async def body(a: Assigner) -> None:
        for group in ("orders", "payments"):
            await a.create(group)

        def sidecar(sidecar_id: str, call_token: str) -> Sidecar:
            # Its endpoint is the address its Session comes from (DS_ADVERTISE_HOST=$(POD_IP)).
            return Sidecar(a.sessions, sidecar_id, metadata=bearer(call_token),
                           endpoint="127.0.0.1:7080")  # fmt: skip

        own = sidecar(POD, bound)
        accepted = await own.join("orders")
        members = [m.id for m in a.groups.group("orders").coordinator.live_members()]
        assert accepted.session_id and members == [POD]
        print(f"\n{CONSUMER} (token bound to pod {POD}): Session {POD} in orders -> "
              f"accepted, members {members}")  # fmt: skip
        another = "orders-consumer-7d9f8-other"
        for who, sidecar_id, call_token, group, needed in (
            ("bound to the pod", another, bound, "orders", f"session:{another}"),
            ("bound to the pod", POD, bound, "payments", "serve:payments"),  # not its scope
            ("bound to no pod", POD, unbound, "orders", f"session:{POD}"),
        ):
            other = sidecar(sidecar_id, call_token)
            await other.call.write(join(sidecar_id, group, endpoint="127.0.0.1:7080"))
            err = await stream_refused(other.call)
            code, _, metadata = reason_of(err)
            print(f"token {who}: Session {sidecar_id} in {group} -> {code.name}: {err.details()}")
            assert (code, metadata["permission"]) == (grpc.StatusCode.PERMISSION_DENIED, needed)
        leave = assigner_pb2.LeaveRequest(group="orders", sidecar_id=POD, graceful=True)
        err = await refused(a.sessions.Leave(leave, metadata=bearer(unbound)))
        code, _, metadata = reason_of(err)
        print(f"token bound to no pod: Leave {POD} -> {code.name}")
        assert (code, metadata["permission"]) == (
            grpc.StatusCode.PERMISSION_DENIED,
            f"session:{POD}",
        )
        await a.sessions.Leave(leave, metadata=bearer(bound))
        print(f"token bound to the pod: Leave {POD} -> OK")
        await own.close()

    run(body, auth=auth, timeout=60)


def test_the_prod_overlay_reviews_with_its_own_binding_and_policy(
    cluster: kube.Cluster, tmp_path: Path
) -> None:
    """The prod overlay as applied: its ClusterRoleBinding lets the assigner's service
    account (dataservice/ds-assigner) make the TokenReviews, with the settings of its
    DS_AUTH__TOKEN_REVIEW (only the server's address and CA are this cluster's: no
    kubernetes.default.svc here) and the overlay's policy, which scopes the example's
    service account to orders."""
    auth = prod_overlay_auth(cluster, "ds-assigner", tmp_path)
    # Created if missing, never applied: tests/k8s/test_injection_webhook.py labels it.
    cluster.kubectl("create", "namespace", "shop", check=False)
    cluster.kubectl("create", "serviceaccount", "orders-consumer", "-n", "shop", check=False)
    app = cluster.kubectl("create", "token", "orders-consumer", "-n", "shop",
                          "--audience=ds-assigner", "--duration=10m")  # fmt: skip

    async def body(a: Assigner) -> None:
        for group in ("orders", "payments"):
            await a.create(group)
        request = binding_pb2.BindRequest(client_id="app-1", group="orders")
        bound = await a.bindings.Bind(request, metadata=bearer(app))
        assert bound.binding.group == "orders"
        print("\nprod overlay: system:serviceaccount:shop:orders-consumer: Bind orders -> OK")
        request = binding_pb2.BindRequest(client_id="app-1", group="payments")
        err = await refused(a.bindings.Bind(request, metadata=bearer(app)))
        code, _, _ = reason_of(err)
        print(f"prod overlay: ... Bind payments -> {code.name}: {err.details()}")
        assert code == grpc.StatusCode.PERMISSION_DENIED

    run(body, auth=auth, timeout=60)
