"""Add the dataservice sidecar to a pod: the one change ``dsctl inject`` makes to manifests
and the admission webhook makes to pods (pure: plain dicts in, new dicts out, no I/O).

What an injected pod gets (ARCHITECTURE §5.7):

* the sidecar as a *native sidecar*: the first init container, ``restartPolicy: Always``,
  so Kubernetes starts it (and waits for its startup probe: its gRPC port listens) before
  the other init containers and the application, and stops it after the application;
* readiness on gRPC health (NOT_SERVING while Kafka or the assigner is unreachable, and
  while stopping), liveness on its HTTP port accepting connections (never on a dependency:
  a Kafka outage must not restart pods);
* a ``preStop`` hook, ``dsctl handoff`` (run as ``python -m services.dsctl.handoff``): the
  sidecar leaves its group through the assigner, which revokes its leases; it drains
  in-flight acks, commits and releases each partition while it still serves, and the hook
  returns once it holds none — then SIGTERM finds nothing left to hand off;
* ``terminationGracePeriodSeconds`` raised to cover the application's stop and the hand-off;
* in every application container, the variables the client library reads
  (clients/python/src/dsclient/mesh_env.py): ``DS_SIDECAR``, ``DS_GROUP``, ``DS_ASSIGNER``;
* with the template's ``uds_dir``: an in-memory ``emptyDir`` (``ds-socket``) mounted there
  in the sidecar and every application container, and ``DS_UDS_DIR`` set in both: the
  sidecar serves its StreamService on a Unix domain socket in it, which the pod's clients
  prefer to TCP (the socket is mode 0660: the containers share a user or the pod's
  ``fsGroup``, else the clients stay on TCP);
* with the template's ``workload_identity``: a projected volume (``ds-token``) of the pod's
  service-account tokens, audience ``ds-assigner`` (``token``), ``ds-sidecar``
  (``sidecar-token``) and ``ds-notifier`` (``notifier-token``), plus the CA of the
  template's ``ca_config_map`` (``ca.crt``), mounted read-only at ``/var/run/dataservice/sa``
  in the sidecar and every application container; the sidecar's ``DS_TLS__TOKEN_FILE``
  names the first and its ``DS_TLS__NOTIFIER_TOKEN_FILE`` the third (its fault reports),
  the application's ``DS_TLS__TOKEN_FILE`` and ``DS_TLS__SIDECAR_TOKEN_FILE`` the first
  two, ``DS_TLS__CA_FILE`` the CA. The kubelet rotates the tokens and the clients re-read
  them; no Secret holds one;
* with ``workload_identity`` too, the sidecar verifies its application's ``ds-sidecar``
  token (``DS_AUTH__ENABLED``, ``__IDENTITY_FROM=token``, ``__SERVICE_ACCOUNT_KEYS``,
  ``__POLICY_FILE``) against the API server's OIDC key set, fetched with a token of the API
  server's own audience; that token, the API server's CA (ConfigMap ``kube-root-ca.crt``)
  and the policy (ConfigMap ``sidecar_policy_config_map``, ``policy.yaml``) are a second
  projected volume (``ds-sidecar-auth``) mounted in the sidecar only, at
  ``/var/run/dataservice/sidecar-auth``: the application gets no API-server credential.

Who is injected: a pod (template) or its workload annotated or labelled
``dataservice.io/inject: "true"`` — or any pod when injection is on by default (a namespace
labelled for the webhook, ``dsctl inject --all``) — unless it says ``"false"``. The group
is ``dataservice.io/group`` (pod template first, then the workload), else the caller's
fallback. Injecting is idempotent: an injected pod is brought to exactly what a fresh
injection gives (a changed template updates it), and injecting that again changes nothing.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dsclient import mesh_env
from services.injector.template import SidecarTemplate

INJECT = "dataservice.io/inject"
GROUP = "dataservice.io/group"
SIDECAR_NAME = "ds-sidecar"
# Kubernetes' default when a pod does not set it.
DEFAULT_GRACE_SECONDS = 30
MAX_GROUP_LENGTH = 249  # Kafka's limit on a group id

# Kinds whose pod template is injected, with the apiVersion they must have.
WORKLOAD_KINDS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "Job": "batch/v1"}
# Variables an injected application container gets; injection owns these names.
APP_ENV_NAMES = (mesh_env.SIDECAR, mesh_env.GROUP, mesh_env.ASSIGNER)
# The shared volume of the sidecar's socket (template.uds_dir); injection owns this name.
SOCKET_VOLUME = "ds-socket"
# The projected service-account tokens (template.workload_identity); injection owns it.
TOKEN_VOLUME = "ds-token"
TOKEN_DIR = "/var/run/dataservice/sa"
ASSIGNER_AUDIENCE = "ds-assigner"
SIDECAR_AUDIENCE = "ds-sidecar"
NOTIFIER_AUDIENCE = "ds-notifier"
TOKEN_FILE = f"{TOKEN_DIR}/token"
SIDECAR_TOKEN_FILE = f"{TOKEN_DIR}/sidecar-token"
NOTIFIER_TOKEN_FILE = f"{TOKEN_DIR}/notifier-token"
CA_FILE = f"{TOKEN_DIR}/ca.crt"
# The client settings (DS_TLS__*) that name those files.
TOKEN_ENV = "DS_TLS__TOKEN_FILE"
SIDECAR_TOKEN_ENV = "DS_TLS__SIDECAR_TOKEN_FILE"
NOTIFIER_TOKEN_ENV = "DS_TLS__NOTIFIER_TOKEN_FILE"
CA_ENV = "DS_TLS__CA_FILE"
# The sidecar's own auth files (workload_identity): mounted in the sidecar only.
SIDECAR_AUTH_VOLUME = "ds-sidecar-auth"
SIDECAR_AUTH_DIR = "/var/run/dataservice/sidecar-auth"
API_TOKEN_FILE = f"{SIDECAR_AUTH_DIR}/api-token"
API_CA_FILE = f"{SIDECAR_AUTH_DIR}/api-ca.crt"
SIDECAR_POLICY_FILE = f"{SIDECAR_AUTH_DIR}/policy.yaml"
API_SERVER = "https://kubernetes.default.svc"
# Kubernetes publishes the API server's CA in every namespace under this name.
KUBE_ROOT_CA = "kube-root-ca.crt"
_OUR_VOLUMES = (SOCKET_VOLUME, TOKEN_VOLUME, SIDECAR_AUTH_VOLUME)
MIB = 1024 * 1024
# Pod fields the sidecar's settings may refer to as $(NAME), from the downward API.
_FIELD_REFS = (
    ("POD_NAME", "metadata.name"),
    ("POD_IP", "status.podIP"),
    ("HOST_IP", "status.hostIP"),
)


class Action(StrEnum):
    INJECTED = "injected"  # the sidecar was added
    UPDATED = "updated"  # an injected pod was brought up to the template
    UNCHANGED = "unchanged"  # already exactly as injection makes it
    SKIPPED = "skipped"  # not opted in, or opted out
    FAILED = "failed"  # opted in, but cannot be injected (no group)


@dataclass(frozen=True)
class Decision:
    """Whether to inject a pod, for which group, and why (for the operator)."""

    inject: bool
    group: str | None
    reason: str
    error: bool = False


@dataclass(frozen=True)
class Result:
    """What happened to one workload of a manifest."""

    kind: str
    name: str
    action: Action
    reason: str


def _metadata_value(metadata: Mapping[str, Any] | None, key: str) -> str | None:
    """An annotation, else a label, of that key (annotations hold what labels cannot)."""
    if not metadata:
        return None
    for section in ("annotations", "labels"):
        values = metadata.get(section) or {}
        if key in values and values[key] is not None:
            return str(values[key]).strip()
    return None


def _first(metas: Sequence[Mapping[str, Any] | None], key: str) -> str | None:
    for meta in metas:
        value = _metadata_value(meta, key)
        if value is not None:
            return value
    return None


def decide(
    pod_metadata: Mapping[str, Any] | None,
    workload_metadata: Mapping[str, Any] | None = None,
    *,
    default: bool = False,
    fallback_group: str | None = None,
) -> Decision:
    """Whether a pod is injected: its own ``dataservice.io/inject`` first, then its
    workload's, then ``default``. The group: ``dataservice.io/group`` the same way, else
    ``fallback_group``. Opted in without a group is an error (``error=True``)."""
    metas = (pod_metadata, workload_metadata)
    flag = _first(metas, INJECT)
    if flag is None and not default:
        return Decision(False, None, f'not opted in ({INJECT}: "true")')
    if flag is not None and flag.lower() == "false":
        return Decision(False, None, f'opted out ({INJECT}: "false")')
    if flag is not None and flag.lower() != "true":
        return Decision(False, None, f'{INJECT}: "{flag}" is neither "true" nor "false"', True)
    group = _first(metas, GROUP) or (fallback_group or "").strip() or None
    if group is None:
        return Decision(False, None, f"no group: annotate {GROUP} or pass --group", True)
    if len(group) > MAX_GROUP_LENGTH:
        return Decision(False, None, f"{GROUP} is longer than {MAX_GROUP_LENGTH}", True)
    return Decision(True, group, "opted in" if flag is not None else "injected by default")


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def sidecar_env(group: str, template: SidecarTemplate) -> list[dict[str, Any]]:
    """The sidecar container's environment: the downward-API fields first (so values may
    name them as $(POD_IP) etc.), then its DS_* settings (README "Running the services")."""
    env = [_field_env(name, path) for name, path in _FIELD_REFS]
    settings: list[tuple[str, str | None]] = [
        ("DS_ID", "$(POD_NAME)"),  # stable id = pod name (a StatefulSet pod keeps it)
        ("DS_GROUP", group),
        ("DS_BOOTSTRAP", template.bootstrap),
        ("DS_ASSIGNER", template.assigner),
        ("DS_CONSUL", template.consul),
        ("DS_NOTIFIER", template.notifier),
        # Loopback by default (issue 37, finding 5): only the pod's containers reach it.
        ("DS_HOST", template.listen_host),
        ("DS_ADVERTISE_HOST", "$(POD_IP)"),
        ("DS_GRPC_PORT", str(template.grpc_port)),
        ("DS_HTTP_PORT", str(template.http_port)),
        ("DS_LOG_FORMAT", template.log_format),
        (mesh_env.UDS_DIR, template.uds_dir),
        (
            "DS_SHM_SEGMENT_BYTES",
            str(template.shm_segment_mib * MIB) if template.uds_dir is not None else None,
        ),
        *identity_env(template, sidecar=True),
        *sidecar_auth_env(template),
    ]
    env += [_env(name, value) for name, value in settings if value is not None]
    own = {entry["name"] for entry in env}
    env += [_env(name, value) for name, value in sorted(template.env.items()) if name not in own]
    return env


def sidecar_container(group: str, template: SidecarTemplate) -> dict[str, Any]:
    """The native sidecar container for ``group``."""
    resources: dict[str, Any] = {
        "requests": {"cpu": template.cpu_request, "memory": template.memory_request},
        "limits": {"memory": template.memory_limit},
    }
    if template.cpu_limit is not None:
        resources["limits"]["cpu"] = template.cpu_limit
    container: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": template.image,
        "imagePullPolicy": template.image_pull_policy,
        "args": ["sidecar"],
        "restartPolicy": "Always",
        "ports": [
            {"name": "ds-grpc", "containerPort": template.grpc_port, "protocol": "TCP"},
            {"name": "ds-http", "containerPort": template.http_port, "protocol": "TCP"},
        ],
        "env": sidecar_env(group, template),
        "resources": resources,
        # The application starts once the sidecar listens (its client retries UNAVAILABLE
        # until the sidecar serves); not on SERVING, which needs Kafka and the assigner.
        "startupProbe": {
            "tcpSocket": {"port": template.grpc_port},
            "periodSeconds": 1,
            "failureThreshold": 60,
        },
        "readinessProbe": {
            "grpc": {"port": template.grpc_port},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "tcpSocket": {"port": template.http_port},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "lifecycle": {"preStop": {"exec": {"command": handoff_command(template)}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},  # admitted by "restricted" namespaces
        },
    }
    return _with_mounts(container, template, sidecar=True)


def handoff_command(template: SidecarTemplate) -> list[str]:
    """The preStop hook: with ``uds_dir`` it finds the sidecar's socket from the sidecar's
    env (``DS_UDS_DIR``, ``DS_ID``; the kubelet does not expand $(VAR) in a hook), where a
    sidecar taking tokens on its socket only answers it; else the TCP port."""
    where = [] if template.uds_dir is not None else ["--sidecar", f"127.0.0.1:{template.grpc_port}"]
    return [
        "python",
        "-m",
        "services.dsctl.handoff",
        *where,
        "--timeout",
        str(template.handoff_timeout_seconds),
    ]


def sidecar_auth_env(template: SidecarTemplate) -> list[tuple[str, str]]:
    """How the sidecar verifies its application's ``ds-sidecar`` token (workload identity):
    locally, against the API server's key set (no RBAC: every service account may read it),
    its policy from the namespace's ConfigMap. None without ``workload_identity``."""
    if not template.workload_identity:
        return []
    keys = {
        "server": API_SERVER,
        "ca_file": API_CA_FILE,
        "token_file": API_TOKEN_FILE,
        "issuer": template.service_account_issuer,
    }
    return [
        ("DS_AUTH__ENABLED", "true"),
        ("DS_AUTH__IDENTITY_FROM", "token"),
        ("DS_AUTH__POLICY_FILE", SIDECAR_POLICY_FILE),
        ("DS_AUTH__SERVICE_ACCOUNT_KEYS", json.dumps(keys, separators=(",", ":"))),
    ]


def sidecar_auth_volume(template: SidecarTemplate) -> dict[str, Any]:
    """The sidecar's own auth files: a token of the API server's audience (no ``audience``:
    the API server's) to fetch its key set with, the API server's CA, the policy."""
    sources: list[dict[str, Any]] = [
        {
            "serviceAccountToken": {
                "expirationSeconds": template.token_expiration_seconds,
                "path": API_TOKEN_FILE.rsplit("/", 1)[1],
            }
        },
        {"configMap": {"name": KUBE_ROOT_CA, "items": [{"key": "ca.crt", "path": "api-ca.crt"}]}},
        {
            "configMap": {
                "name": template.sidecar_policy_config_map,
                "items": [{"key": "policy.yaml", "path": "policy.yaml"}],
            }
        },
    ]
    return {"name": SIDECAR_AUTH_VOLUME, "projected": {"sources": sources, "defaultMode": 0o644}}


def identity_env(template: SidecarTemplate, *, sidecar: bool) -> list[tuple[str, str]]:
    """The token (and CA) files of workload identity, as (name, value): the sidecar sends
    the ``ds-assigner`` token to the assigner and the ``ds-notifier`` one with its fault
    reports; the application sends the first to the assigner too and the ``ds-sidecar``
    token to its sidecar, and so does the sidecar's preStop hand-off (its ``Status``).
    None without ``workload_identity``."""
    if not template.workload_identity:
        return []
    env = [(TOKEN_ENV, TOKEN_FILE)]
    if sidecar:
        env.append((NOTIFIER_TOKEN_ENV, NOTIFIER_TOKEN_FILE))
        # Its preStop hand-off asks the sidecar itself for its Status, as its application.
        env.append((SIDECAR_TOKEN_ENV, SIDECAR_TOKEN_FILE))
    else:
        env.append((SIDECAR_TOKEN_ENV, SIDECAR_TOKEN_FILE))
    if template.ca_config_map is not None:
        env.append((CA_ENV, CA_FILE))
    return env


def token_volume(template: SidecarTemplate) -> dict[str, Any]:
    """The pod's projected service-account tokens, one per audience, and the CA that signs
    the assigner's certificate (``ca_config_map``); the kubelet writes and rotates them."""
    lifetime = template.token_expiration_seconds
    sources: list[dict[str, Any]] = [
        {
            "serviceAccountToken": {
                "audience": audience,
                "expirationSeconds": lifetime,
                "path": path.rsplit("/", 1)[1],
            }
        }
        for audience, path in (
            (ASSIGNER_AUDIENCE, TOKEN_FILE),
            (SIDECAR_AUDIENCE, SIDECAR_TOKEN_FILE),
            (NOTIFIER_AUDIENCE, NOTIFIER_TOKEN_FILE),
        )
    ]
    if template.ca_config_map is not None:
        sources.append(
            {
                "configMap": {
                    "name": template.ca_config_map,
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            }
        )
    # 0644, as Kubernetes' own kube-api-access volume: every container of the pod reads it.
    return {"name": TOKEN_VOLUME, "projected": {"sources": sources, "defaultMode": 0o644}}


def socket_volume(template: SidecarTemplate) -> dict[str, Any]:
    """The pod's shared volume for the sidecar's socket and its shared-memory segments, in
    memory: 1 MiB for the socket, and ``shm_streams`` segments (a segment is allocated
    whole when its stream opens, so one too many is refused, never a SIGBUS)."""
    mib = 1 + template.shm_streams * template.shm_segment_mib
    return {"name": SOCKET_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{mib}Mi"}}


def _with_mounts(
    container: Mapping[str, Any], template: SidecarTemplate, *, sidecar: bool = False
) -> dict[str, Any]:
    """``container`` with the socket volume mounted at ``template.uds_dir`` and the token
    volume (read-only) at ``TOKEN_DIR``, each when the template asks for it, and in the
    ``sidecar`` its auth volume (a mount of ours from an earlier injection replaced)."""
    mounts = _without_ours(container.get("volumeMounts"))
    if template.uds_dir is not None:
        mounts.append({"name": SOCKET_VOLUME, "mountPath": template.uds_dir})
    if template.workload_identity:
        mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
    if template.workload_identity and sidecar:
        mounts.append(
            {"name": SIDECAR_AUTH_VOLUME, "mountPath": SIDECAR_AUTH_DIR, "readOnly": True}
        )
    return _with_list(container, "volumeMounts", mounts)


def _without_ours(entries: Sequence[Mapping[str, Any]] | None) -> list[Any]:
    return [e for e in entries or [] if e.get("name") not in _OUR_VOLUMES]


def _with_list(owner: Mapping[str, Any], key: str, entries: list[Any]) -> dict[str, Any]:
    """``owner`` with ``entries`` under ``key``; an empty list only where the owner wrote
    one itself (so taking our entry away again gives back what was there)."""
    before = owner.get(key)
    if entries or (before is not None and not any(e.get("name") in _OUR_VOLUMES for e in before)):
        return {**owner, key: entries}
    return {k: v for k, v in owner.items() if k != key}


def app_env(group: str, template: SidecarTemplate) -> list[dict[str, Any]]:
    """What every application container gets: how the client library finds the mesh."""
    env = [
        _env(mesh_env.SIDECAR, f"127.0.0.1:{template.grpc_port}"),
        _env(mesh_env.GROUP, group),
        _env(mesh_env.ASSIGNER, template.assigner),
    ]
    if template.uds_dir is not None:
        env.append(_env(mesh_env.UDS_DIR, template.uds_dir))
    env += [_env(name, value) for name, value in identity_env(template, sidecar=False)]
    return env


def _ours(entry: Mapping[str, Any]) -> bool:
    """A variable of workload identity that an earlier injection set (it names a file of
    our token volume): the application's own DS_TLS__* variables are left alone."""
    value = entry.get("value")
    return (
        entry.get("name") in (TOKEN_ENV, SIDECAR_TOKEN_ENV, NOTIFIER_TOKEN_ENV, CA_ENV)
        and isinstance(value, str)
        and value.startswith(f"{TOKEN_DIR}/")
    )


def _with_env(container: Mapping[str, Any], ours: list[dict[str, Any]]) -> dict[str, Any]:
    """``container`` with our variables first (the application's own may refer to them as
    $(DS_GROUP)) and its other variables after them, in their order."""
    owned = {*APP_ENV_NAMES, mesh_env.UDS_DIR, *(e["name"] for e in ours)}
    theirs = [e for e in container.get("env") or [] if e.get("name") not in owned and not _ours(e)]
    return {**container, "env": [*ours, *theirs]}


def inject_pod(pod: Mapping[str, Any], group: str, template: SidecarTemplate) -> dict[str, Any]:
    """A copy of ``pod`` (a Pod, or a pod template: ``metadata`` + ``spec``) with the sidecar
    for ``group``. Applied to its own result it changes nothing."""
    result = copy.deepcopy(dict(pod))
    spec = dict(result.get("spec") or {})
    init = [c for c in spec.get("initContainers") or [] if c.get("name") != SIDECAR_NAME]
    spec["initContainers"] = [sidecar_container(group, template), *init]
    ours = app_env(group, template)
    spec["containers"] = [
        _with_mounts(_with_env(c, ours), template) for c in spec.get("containers") or []
    ]
    volumes = _without_ours(spec.get("volumes"))
    if template.uds_dir is not None:
        volumes.append(socket_volume(template))
    if template.workload_identity:
        volumes += [token_volume(template), sidecar_auth_volume(template)]
    spec = _with_list(spec, "volumes", volumes)
    current = spec.get("terminationGracePeriodSeconds")
    grace = DEFAULT_GRACE_SECONDS if current is None else int(current)
    spec["terminationGracePeriodSeconds"] = max(grace, template.termination_grace_seconds)
    result["spec"] = spec
    return result


def has_sidecar(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return any(c.get("name") == SIDECAR_NAME for c in spec.get("initContainers") or [])


def _action(before: Mapping[str, Any], after: Mapping[str, Any]) -> Action:
    if before == after:
        return Action.UNCHANGED
    return Action.UPDATED if has_sidecar(before) else Action.INJECTED


def inject_document(
    document: Any,
    template: SidecarTemplate,
    *,
    default: bool = False,
    fallback_group: str | None = None,
) -> tuple[Any, list[Result]]:
    """One manifest document with its workloads injected, and what happened to each. A
    ``List`` is injected item by item; every other kind is returned as it is."""
    if not isinstance(document, dict):
        return document, []
    kind = document.get("kind")
    if kind == "List":
        items, results = _inject_all(document.get("items") or [], template, default, fallback_group)
        return {**document, "items": items}, results
    if WORKLOAD_KINDS.get(str(kind)) != document.get("apiVersion"):
        return document, []
    metadata = document.get("metadata") or {}
    name = f"{kind}/{metadata.get('name', '?')}"
    pod = (document.get("spec") or {}).get("template") or {}
    decision = decide(pod.get("metadata"), metadata, default=default, fallback_group=fallback_group)
    if not decision.inject or decision.group is None:
        action = Action.FAILED if decision.error else Action.SKIPPED
        return document, [Result(str(kind), name, action, decision.reason)]
    injected = inject_pod(pod, decision.group, template)
    action = _action(pod, injected)
    if action is Action.UNCHANGED:
        return document, [Result(str(kind), name, action, "already injected")]
    out = {**document, "spec": {**document["spec"], "template": injected}}
    return out, [Result(str(kind), name, action, f"group {decision.group}")]


def _inject_all(
    documents: Iterable[Any],
    template: SidecarTemplate,
    default: bool,
    fallback_group: str | None,
) -> tuple[list[Any], list[Result]]:
    out: list[Any] = []
    results: list[Result] = []
    for document in documents:
        injected, found = inject_document(
            document, template, default=default, fallback_group=fallback_group
        )
        out.append(injected)
        results += found
    return out, results


def inject_documents(
    documents: Iterable[Any],
    template: SidecarTemplate,
    *,
    default: bool = False,
    fallback_group: str | None = None,
) -> tuple[list[Any], list[Result]]:
    """Every document of a multi-document manifest, in order (see :func:`inject_document`)."""
    return _inject_all(documents, template, default, fallback_group)
