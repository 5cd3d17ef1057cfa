"""A service's authentication as the prod overlay runs it, on a live cluster (tests/k8s).

:func:`prod_overlay_auth` applies the prod overlay and gives the settings a service of it
authenticates with: its DS_AUTH__TOKEN_REVIEW (only the API server's address and CA are the
test cluster's: no kubernetes.default.svc there), a token of its own service account (what
its kube-api-access volume holds; the overlay binds it to system:auth-delegator) and the
overlay's policy.
"""

from __future__ import annotations

from pathlib import Path

from services.devstack import kube
from services.runtime.auth import AuthSettings
from services.runtime.auth.token_review import TokenReviewSettings
from tests.support.k8s import K8S, find, render


def prod_overlay_auth(cluster: kube.Cluster, service: str, tmp_path: Path) -> AuthSettings:
    """The prod overlay applied to ``cluster``; ``service``'s (a Deployment in namespace
    dataservice, its service account of the same name) auth settings, files in ``tmp_path``."""
    cluster.kubectl("apply", "-k", str(K8S / "overlays" / "prod"), "--server-side",
                    "--force-conflicts")  # fmt: skip
    docs = render("prod")
    (container,) = find(docs, "Deployment", service)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    review = TokenReviewSettings.model_validate_json(env["DS_AUTH__TOKEN_REVIEW"])
    credential = tmp_path / f"{service}-token"  # what its kube-api-access volume holds
    credential.write_text(
        cluster.kubectl("create", "token", service, "-n", "dataservice", "--duration=10m")
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(find(docs, "ConfigMap", "ds-auth-policy")["data"]["policy.yaml"])
    return AuthSettings(
        enabled=True,
        policy_file=policy,
        identity_from="token",
        token_review=review.model_copy(
            update={"server": cluster.server, "ca_file": Path(cluster.ca), "token_file": credential}
        ),
    )
