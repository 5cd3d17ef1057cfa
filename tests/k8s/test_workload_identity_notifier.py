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
from tests.support.notifier_rpc import Notifier, fault, report, run
from tests.support.prod_overlay_auth import prod_overlay_auth

pytestmark = [pytest.mark.timeout(180)]

ACCOUNT = "system:serviceaccount:shop:orders-consumer"


def test_the_notifier_accepts_a_sidecar_s_ds_notifier_token_and_refuses_its_ds_assigner_one(
    cluster: kube.Cluster, tmp_path: Path
) -> None:
    auth = prod_overlay_auth(cluster, "ds-notifier", tmp_path)
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
