"""Workload identity against the real API server: a pod's projected service-account token
(audience ``dataservice``, here made with ``kubectl create token``, what the kubelet
projects) authenticates a call to the assigner's real servicers behind the real
authorization interceptor, verified by a TokenReview the assigner makes with its own
service account (bound to system:auth-delegator). The identity is
``system:serviceaccount:NAMESPACE:NAME`` and the policy's roles and group scopes apply to
it; a token for another audience, or of a service account the policy does not name, is
refused."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml

from dataservice.assigner.v1 import binding_pb2
from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.token_review import TokenReviewSettings
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
    reader = token(cluster, "orders-reader", "dataservice")
    other_audience = token(cluster, "orders-reader", "vault")
    stranger = token(cluster, "stranger", "dataservice")

    async def body(a: Assigner) -> None:
        for group in ("orders", "payments"):
            await a.create(group)

        def bind(group: str) -> binding_pb2.BindRequest:
            return binding_pb2.BindRequest(client_id="app-1", group=group)

        bound = await a.bindings.Bind(bind("orders"), metadata=bearer(reader))
        assert bound.binding.group == "orders"
        print(f"\n{READER} (audience dataservice): Bind orders -> OK")
        for who, call_token, group, expected in (
            (READER, reader, "payments", grpc.StatusCode.PERMISSION_DENIED),  # out of scope
            ("(audience vault)", other_audience, "orders", grpc.StatusCode.UNAUTHENTICATED),
            ("stranger", stranger, "orders", grpc.StatusCode.PERMISSION_DENIED),  # no role
            ("(not a token)", "x" * 40, "orders", grpc.StatusCode.UNAUTHENTICATED),
        ):
            err = await refused(a.bindings.Bind(bind(group), metadata=bearer(call_token)))
            code, _, _ = reason_of(err)
            print(f"{who}: Bind {group} -> {code.name}: {err.details()}")
            assert code == expected, err.details()

    run(body, auth=auth, timeout=60)
