"""What the injector adds to a pod: the sidecar's image, where it finds the mesh, its ports,
resources and shutdown budget. One YAML file (the ``ds-sidecar-template`` ConfigMap in
deploy/k8s) configures the webhook and ``dsctl inject --template`` alike; the defaults are
the values of deploy/k8s/base, so an injection without a file matches the base install."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dsclient.addresses import parse_host_port
from services.runtime.settings import ConfigError, is_loopback, read_yaml

DIST = "dataservice-mesh"
IMAGE_NAME = "dataservice-mesh"


def package_version() -> str:
    """The project version (pyproject.toml), which is also the image tag."""
    try:
        return version(DIST)
    except PackageNotFoundError:  # pragma: no cover - the package is always installed
        return "0.0.0"


def default_image() -> str:
    return f"{IMAGE_NAME}:{package_version()}"


def _host_port(value: str, what: str) -> str:
    # Values may name Kubernetes variables (`$(HOST_IP):8500`), expanded by the kubelet.
    if "$(" not in value:
        parse_host_port(value, what=what)
    return value


class SidecarTemplate(BaseModel):
    """The injected sidecar. Every field is also documented in README "Deploying"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str = Field(default_factory=default_image, min_length=1)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    bootstrap: str = Field(
        "kafka-bootstrap.kafka.svc:9092", description="Kafka bootstrap servers of the sidecar"
    )
    assigner: str = Field(
        "ds-assigner.dataservice.svc:7070",
        description="assigner HOST:PORT (the Service; followers name the leader)",
    )
    consul: str | None = Field(
        None,
        description="Consul agent HOST:PORT, e.g. $(HOST_IP):8500 for a node-local agent; "
        "unset = the sidecar neither registers nor watches the leader key in Consul",
    )
    notifier: str | None = Field(
        "ds-notifier.dataservice.svc:7090", description="where the sidecar reports faults"
    )
    listen_host: str = Field(
        "127.0.0.1",
        description="address the sidecar's gRPC and HTTP servers bind to: loopback (the pod's "
        "own containers, and the socket in uds_dir) by default; 0.0.0.0 lets clients in other "
        "pods and Spark fetch here, which needs TLS and tokens in env (DS_TLS__*, DS_AUTH__*)",
    )
    grpc_port: int = Field(7080, ge=1, le=65535)
    http_port: int = Field(7081, ge=1, le=65535)
    log_format: Literal["json", "console"] = "json"
    # Measured: RSS 150-178 MiB with a 1 GiB backlog and the default 64 MiB buffer cap;
    # bound cap + 150 MiB (README, tests/e2e/test_sidecar_memory.py). Raise both with
    # DS_BUFFER_MAX_BYTES in `env`.
    cpu_request: str = "100m"
    memory_request: str = "192Mi"
    memory_limit: str = "256Mi"
    cpu_limit: str | None = None
    handoff_timeout_seconds: int = Field(
        15, ge=1, le=600, description="the preStop hand-off waits at most this long"
    )
    termination_grace_seconds: int = Field(
        45,
        ge=1,
        le=3600,
        description="the pod's terminationGracePeriodSeconds is raised to at least this: "
        "Kubernetes' default 30 s for the application, then the sidecar's hand-off",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="more DS_* settings of the sidecar (name: value)"
    )
    uds_dir: str | None = Field(
        None,
        description="mount a shared in-memory emptyDir here in the sidecar and every "
        "application container: the sidecar serves on a Unix domain socket in it, which the "
        "pod's clients prefer to TCP; unset = TCP only",
    )
    shm_segment_mib: int = Field(
        32,
        ge=0,
        le=1024,
        description="with uds_dir: the shared-memory segment of each Stream the pod's "
        "application reads with DELIVERY_FORMAT_ARROW_SHM (zero copy), in MiB; the sidecar's "
        "memory, so count shm_streams of them in memory_limit; 0 = that format is refused",
    )
    shm_streams: int = Field(
        2,
        ge=1,
        le=64,
        description="with uds_dir: how many such streams at once the shared volume is sized "
        "for (its sizeLimit); one more is refused and that client reads over TCP",
    )

    workload_identity: bool = Field(
        False,
        description="mount the pod's projected service-account tokens (audience ds-assigner "
        "in DS_TLS__TOKEN_FILE for the sidecar's and the application's calls to the assigner, "
        "ds-sidecar in DS_TLS__SIDECAR_TOKEN_FILE for the application's calls to its sidecar, "
        "ds-notifier in DS_TLS__NOTIFIER_TOKEN_FILE for the sidecar's fault reports), "
        "read-only, rotated by the kubelet; the assigner and the notifier verify them with a "
        "TokenReview, the sidecar its application's against the API server's key set "
        "(DS_AUTH__SERVICE_ACCOUNT_KEYS, policy from sidecar_policy_config_map); needs uds_dir "
        "(the token reaches the sidecar over the pod's socket) or a serving certificate "
        "(DS_TLS__CERT_FILE and DS_TLS__KEY_FILE in env)",
    )
    token_expiration_seconds: int = Field(
        3600,
        ge=600,
        le=86400,
        description="with workload_identity: the tokens' lifetime (the kubelet renews them "
        "at 80%; 600 is Kubernetes' minimum)",
    )
    ca_config_map: str | None = Field(
        None,
        description="with workload_identity: a ConfigMap in the pod's namespace whose ca.crt "
        "signs the assigner's certificate (e.g. distributed by trust-manager), projected "
        "beside the tokens and named by DS_TLS__CA_FILE (a token is only sent over TLS); "
        "unset = DS_TLS__CA_FILE comes from elsewhere (env)",
    )

    sidecar_policy_config_map: str = Field(
        "ds-sidecar-policy",
        min_length=1,
        max_length=253,
        description="with workload_identity: a ConfigMap in the pod's namespace whose "
        "policy.yaml maps the namespace's service accounts to the groups they may read "
        "(system:serviceaccount:NAMESPACE:NAME: [reader:GROUP]); the sidecar's policy, "
        "projected into the sidecar only",
    )
    service_account_issuer: str = Field(
        "https://kubernetes.default.svc",
        min_length=1,
        description="with workload_identity: the API server's --service-account-issuer, the "
        "`iss` the sidecar requires of its application's token",
    )

    @field_validator("bootstrap")
    @classmethod
    def _valid_bootstrap(cls, value: str) -> str:
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts:
            raise ValueError("bootstrap must name at least one HOST:PORT")
        for part in parts:
            _host_port(part, "bootstrap server")
        return ",".join(parts)

    @field_validator("assigner", "consul", "notifier")
    @classmethod
    def _valid_address(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        return _host_port(value, "address")

    @field_validator("env")
    @classmethod
    def _valid_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name.startswith("DS_"):
                raise ValueError(f"env {name!r}: only DS_* settings of the sidecar go here")
        return value

    @field_validator("uds_dir")
    @classmethod
    def _absolute_dir(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        if not value.startswith("/") or len(value) > 64:
            raise ValueError("uds_dir must be an absolute path of at most 64 characters")
        return value.rstrip("/") or "/"

    @model_validator(mode="after")
    def _ca_with_identity(self) -> SidecarTemplate:
        if self.ca_config_map is not None and not self.workload_identity:
            raise ValueError(
                "ca_config_map is projected with the tokens: it needs workload_identity"
            )
        return self

    @model_validator(mode="after")
    def _sidecar_can_take_tokens(self) -> SidecarTemplate:
        """With workload_identity the sidecar authenticates its application: the token must
        reach it over the pod's socket, or over TCP with TLS (a serving certificate in env).
        Without TLS its TCP listener must stay on loopback (the sidecar's settings rule)."""
        if not self.workload_identity or self.serves_tls:
            return self
        if self.uds_dir is None:
            raise ValueError(
                "workload_identity: the sidecar verifies its application's token, sent over "
                "the pod's socket: set uds_dir (or a serving certificate: DS_TLS__CERT_FILE "
                "and DS_TLS__KEY_FILE in env)"
            )
        if not is_loopback(self.listen_host):
            raise ValueError(
                "workload_identity without a serving certificate: listen_host must be "
                "loopback (tokens are taken on the pod's socket only)"
            )
        return self

    @property
    def serves_tls(self) -> bool:
        """Whether the sidecar's TCP listener speaks TLS (a certificate in env)."""
        return "DS_TLS__CERT_FILE" in self.env and "DS_TLS__KEY_FILE" in self.env

    @model_validator(mode="after")
    def _grace_covers_handoff(self) -> SidecarTemplate:
        if self.termination_grace_seconds <= self.handoff_timeout_seconds:
            raise ValueError(
                "termination_grace_seconds must exceed handoff_timeout_seconds, "
                "or the hand-off is cut short"
            )
        return self


def load_template(path: Path | None, **overrides: str | None) -> SidecarTemplate:
    """The template from a YAML file (or the defaults), with non-None ``overrides`` on top;
    ConfigError naming the setting when a value is bad."""
    data = read_yaml(path) if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        template = SidecarTemplate(**data)
    except ValidationError as exc:
        where = f" in {path}" if path else ""
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid sidecar template{where}: {problems}") from exc
    return template
