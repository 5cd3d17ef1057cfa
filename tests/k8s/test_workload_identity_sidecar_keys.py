"""A sidecar checking its callers' ``ds-sidecar`` tokens without a TokenReview: the API
server's OIDC key set (/openid/v1/jwks), fetched with a service account's own token and no
RBAC of its own (Kubernetes' system:service-account-issuer-discovery), verifies a
pod-bound token locally, through the sidecar's real StreamService servicer behind its
authorization interceptor (auth.service_account_keys). A token for another audience is
refused UNAUTHENTICATED, another account PERMISSION_DENIED."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import yaml

from dataservice.sidecar.v1 import stream_pb2_grpc
from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.service_account_keys import (
    ServiceAccountKeys,
    ServiceAccountKeysSettings,
)
from services.runtime.auth.token_review import Subject
from tests.unit.sidecar.stream_harness import GROUP, Sidecar, fetch_request, reason_of, run

pytestmark = [pytest.mark.timeout(180)]

NAMESPACE = "sidecar-keys"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:orders-consumer"
POD = "orders-consumer-5c8d7-q2w4e"


def test_a_sidecar_verifies_a_pod_token_against_the_api_server_s_key_set(
    cluster: kube.Cluster, tmp_path: Path
) -> None:
    cluster.kubectl("create", "namespace", NAMESPACE)
    for account in ("orders-consumer", "stranger"):
        cluster.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": POD, "namespace": NAMESPACE},
           "spec": {"serviceAccountName": "orders-consumer",
                    "containers": [{"name": "app", "image": "example.invalid/app:1"}]}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def token(account: str, audience: str, *bound: str) -> str:
        return cluster.kubectl("create", "token", account, "-n", NAMESPACE,
                               f"--audience={audience}", "--duration=10m", *bound)  # fmt: skip

    # The sidecar's own credential: its pod's token (the same account), no binding made.
    own = tmp_path / "kube-api-access-token"
    own.write_text(token("orders-consumer", "https://kubernetes.default.svc"))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"identities": {ACCOUNT: [f"reader:{GROUP}"]}}))
    auth = AuthSettings(
        enabled=True,
        policy_file=policy,
        identity_from="token",
        service_account_keys=(
            keys := ServiceAccountKeysSettings(
                server=cluster.server, ca_file=Path(cluster.ca), token_file=own
            )
        ),
    )
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={POD}"]
    app = token("orders-consumer", "ds-sidecar", *bound)
    for_assigner = token("orders-consumer", "ds-assigner", *bound)
    stranger = token("stranger", "ds-sidecar")
    # The token names its pod, as a TokenReview would (the sidecar role's own-pod Session).
    assert ServiceAccountKeys(keys, "ds-sidecar").identity(app) == Subject(ACCOUNT, POD)

    async def body(stub: stream_pb2_grpc.StreamServiceStub, sc: Sidecar) -> None:
        def bearer(value: str) -> tuple[tuple[str, str], ...]:
            return (("authorization", f"Bearer {value}"),)

        sc.hold(0, epoch=1)
        sc.buffer(0, range(3))
        got = await stub.Fetch(fetch_request(client_id="app-1"), metadata=bearer(app))
        print(f"\n{ACCOUNT} (pod {POD}, audience ds-sidecar): Fetch -> {len(got.records)} records")
        assert len(got.records) == 3
        for who, call_token, expected in (
            ("(audience ds-assigner)", for_assigner, grpc.StatusCode.UNAUTHENTICATED),
            ("stranger (audience ds-sidecar)", stranger, grpc.StatusCode.PERMISSION_DENIED),
            ("(not a token)", "x" * 40, grpc.StatusCode.UNAUTHENTICATED),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Fetch(fetch_request(client_id="app-2"), metadata=bearer(call_token))
            code, _, _ = reason_of(caught.value)
            print(f"{who}: Fetch -> {code.name}: {caught.value.details()}")
            assert code == expected, caught.value.details()

    run(body, auth=auth)
