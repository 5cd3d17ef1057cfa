"""Workload identity against the real API server: a pod's projected service-account token
(audience ``ds-assigner``, the service's own, here made with ``kubectl create token``, what
the kubelet projects) authenticates a call to the assigner's real servicers behind the real
authorization interceptor, verified by a TokenReview the assigner makes with its own
service account (bound to system:auth-delegator). The identity is
``system:serviceaccount:NAMESPACE:NAME`` and the policy's roles and group scopes apply to
it; a token for another audience (``vault``, or ``ds-sidecar``: one a pod sends its sidecar,
replayed at the assigner), or of a service account the policy does not name, is refused."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml

from dataservice.assigner.v1 import binding_pb2
from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.token_review import TokenReviewSettings
from tests.support.k8s import K8S, find, render
from tests.unit.assigner.rpc_harness import Assigner, reason_of, refused, run

pytestmark = [pytest.mark.timeout(180)]

NAMESPACE = "workload-identity"
READER = f"system:serviceaccount:{NAMESPACE}:orders-reader"


def token(cluster: kube.Cluster, account: str, *audiences: str) -> str:
    flags = [f"--audience={a}" for a in audiences]
    return cluster.kubectl("create", "token", account, "-n", NAMESPACE, "--duration=10m", *flags)


@pytest.fixture(scope="module")
def accounts(cluster: kube.Cluster) -> kube.Cluster:
    cluster.kubectl("create", "namespace", NAMESPACE)
    for account in ("orders-reader", "stranger", "ds-assigner"):
        cluster.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    # The assigner reviews tokens with its own service account (TokenReview needs it).
    cluster.kubectl("create", "clusterrolebinding", "ds-assigner-token-review",
                    "--clusterrole=system:auth-delegator",
                    f"--serviceaccount={NAMESPACE}:ds-assigner")  # fmt: skip
    return cluster


def bearer(value: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {value}"),)


def test_a_projected_token_is_verified_by_token_review_and_mapped_by_the_policy(
    accounts: kube.Cluster, tmp_path: Path
) -> None:
    cluster = accounts
    credential = tmp_path / "assigner-token"
    credential.write_text(token(cluster, "ds-assigner"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"identities": {READER: ["reader:orders"]}}))
    auth = AuthSettings(
        enabled=True,
        policy_file=policy,
        identity_from="token",
        token_review=TokenReviewSettings(
            server=cluster.server, ca_file=Path(cluster.ca), token_file=credential
        ),
    )
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


def test_the_prod_overlay_reviews_with_its_own_binding_and_policy(
    cluster: kube.Cluster, tmp_path: Path
) -> None:
    """The prod overlay as applied: its ClusterRoleBinding lets the assigner's service
    account (dataservice/ds-assigner) make the TokenReviews, with the settings of its
    DS_AUTH__TOKEN_REVIEW (only the server's address and CA are this cluster's: no
    kubernetes.default.svc here) and the overlay's policy, which scopes the example's
    service account to orders."""
    cluster.kubectl("apply", "-k", str(K8S / "overlays" / "prod"), "--server-side",
                    "--force-conflicts")  # fmt: skip
    docs = render("prod")
    (container,) = find(docs, "Deployment", "ds-assigner")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    review = TokenReviewSettings.model_validate_json(env["DS_AUTH__TOKEN_REVIEW"])
    credential = tmp_path / "ds-assigner-token"  # what its kube-api-access volume holds
    credential.write_text(
        cluster.kubectl("create", "token", "ds-assigner", "-n", "dataservice", "--duration=10m")
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(find(docs, "ConfigMap", "ds-auth-policy")["data"]["policy.yaml"])
    auth = AuthSettings(
        enabled=True,
        policy_file=policy,
        identity_from="token",
        token_review=review.model_copy(
            update={"server": cluster.server, "ca_file": Path(cluster.ca), "token_file": credential}
        ),
    )
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
