"""Workload identity at the notifier, against the real API server: an injected sidecar's fault
reports carry its pod's projected token of audience ``ds-notifier`` (the injector's third
token, DS_TLS__NOTIFIER_TOKEN_FILE), and the notifier, as the prod overlay runs it
(DS_AUTH__TOKEN_REVIEW, its service account bound to system:auth-delegator by the overlay,
the overlay's policy), accepts it through its real servicer and authorization interceptor;
the same account's ``ds-assigner`` token (what the sidecar sends the assigner) is refused
UNAUTHENTICATED: wrong audience."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.token_review import TokenReviewSettings
from tests.support.k8s import K8S, find, render
from tests.support.notifier_rpc import Notifier, fault, report, run

pytestmark = [pytest.mark.timeout(180)]

ACCOUNT = "system:serviceaccount:shop:orders-consumer"


def test_the_notifier_accepts_a_sidecar_s_ds_notifier_token_and_refuses_its_ds_assigner_one(
    cluster: kube.Cluster, tmp_path: Path
) -> None:
    cluster.kubectl("apply", "-k", str(K8S / "overlays" / "prod"), "--server-side",
                    "--force-conflicts")  # fmt: skip
    docs = render("prod")
    (container,) = find(docs, "Deployment", "ds-notifier")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    review = TokenReviewSettings.model_validate_json(env["DS_AUTH__TOKEN_REVIEW"])
    credential = tmp_path / "ds-notifier-token"  # what its kube-api-access volume holds
    credential.write_text(
        cluster.kubectl("create", "token", "ds-notifier", "-n", "dataservice", "--duration=10m")
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
    cluster.kubectl("create", "namespace", "shop", check=False)
    for account in ("orders-consumer", "stranger"):
        cluster.kubectl("create", "serviceaccount", account, "-n", "shop", check=False)

    def token(account: str, audience: str) -> str:
        return cluster.kubectl("create", "token", account, "-n", "shop",
                               f"--audience={audience}", "--duration=10m")  # fmt: skip

    for_notifier = token("orders-consumer", "ds-notifier")
    for_assigner = token("orders-consumer", "ds-assigner")
    stranger = token("stranger", "ds-notifier")

    async def body(n: Notifier) -> None:
        def bearer(value: str) -> tuple[tuple[str, str], ...]:
            return (("authorization", f"Bearer {value}"),)

        event = fault(group="orders", source_instance="orders-consumer-7d9f8-x2x5q")
        accepted = await n.stub.ReportFault(report(event), metadata=bearer(for_notifier))
        assert accepted.event_id
        print(f"\nprod overlay: {ACCOUNT} (audience ds-notifier): ReportFault -> OK")
        for who, call_token, expected in (
            ("(audience ds-assigner)", for_assigner, grpc.StatusCode.UNAUTHENTICATED),
            ("stranger (audience ds-notifier)", stranger, grpc.StatusCode.PERMISSION_DENIED),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await n.stub.ReportFault(report(fault()), metadata=bearer(call_token))
            err = caught.value
            print(f"{who}: ReportFault -> {err.code().name}: {err.details()}")
            assert err.code() == expected, err.details()
            if expected == grpc.StatusCode.UNAUTHENTICATED:  # the API server's reason
                assert '["ds-assigner"] is invalid' in str(err.details()), err.details()

    run(tmp_path, body, auth=auth)
