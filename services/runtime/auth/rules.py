"""Which permission each RPC of the mesh needs, read from its request (pure).

One table for every service: the full method name → a rule that reads the permission from
the request (for a client-streaming RPC, from its first message: the Session's join, the
Stream's open). A method the table does not name is refused (fail closed): a new RPC is
unreachable until it is given a rule here, and a unit test holds every RPC of every
service's descriptor to having one.

Health checks are public (Consul and Kubernetes probe them without credentials); server
reflection needs a known caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.runtime.auth.policy import Permission, Verb

# The request (or the first message of a request stream) → the resource it names.
Resource = Callable[[Any], str]


@dataclass(frozen=True)
class Rule:
    """The verb one method needs, and where its resource is in the request."""

    verb: Verb
    resource: Resource | None = None
    # The resource is the serving process's own group (the sidecar's Status).
    served_group: bool = False
    # Where the request names a client id of the group (bound to the caller's identity:
    # :mod:`~services.runtime.auth.client_ids`), if it names one.
    client: Resource | None = None
    # What else the call needs, read from its content: a sidecar's Session and Leave name
    # the group they act in (SERVE on it, the identity's scope: issue 37, finding 1).
    scope: Callable[[Any], tuple[Permission, ...]] | None = None
    # The host of the endpoint a Session advertises: ADVERTISE on it, or the caller's own
    # address (checked by the interceptor, which knows the peer).
    endpoint: Resource | None = None

    def permission(self, request: Any, served_group: str) -> Permission:
        if self.served_group:
            return Permission(self.verb, served_group)
        return Permission(self.verb, self.resource(request) if self.resource else "")


def _group(request: Any) -> str:
    return str(request.group)


def _sidecar(request: Any) -> str:
    return str(request.sidecar_id)


def _join_sidecar(request: Any) -> str:
    return str(request.join.sidecar_id) if request.WhichOneof("kind") == "join" else ""


def _open_group(request: Any) -> str:
    return str(request.open.group) if request.WhichOneof("kind") == "open" else ""


def _join_serves(request: Any) -> tuple[Permission, ...]:
    group = str(request.join.group) if request.WhichOneof("kind") == "join" else ""
    return (Permission(Verb.SERVE, group),)


def _leave_serves(request: Any) -> tuple[Permission, ...]:
    return (Permission(Verb.SERVE, str(request.group)),)


def _join_endpoint_host(request: Any) -> str:
    return endpoint_host(str(request.join.endpoint)) if request.WhichOneof("kind") == "join" else ""


def endpoint_host(endpoint: str) -> str:
    """The host of ``HOST:PORT`` or ``[V6]:PORT`` (lower case, no brackets)."""
    if endpoint.startswith("["):
        return endpoint[1:].partition("]")[0].lower()
    return endpoint.rpartition(":")[0].lower() if ":" in endpoint else endpoint.lower()


def peer_host(peer: str) -> str:
    """The address of a gRPC peer (``ipv4:A:PORT``, ``ipv6:[A]:PORT``); "" for others."""
    kind, _, rest = peer.partition(":")
    return endpoint_host(rest) if kind in ("ipv4", "ipv6") else ""


def _client(request: Any) -> str:
    return str(request.client_id)


def _open_client(request: Any) -> str:
    return str(request.open.client_id) if request.WhichOneof("kind") == "open" else ""


_ASSIGNER = "/dataservice.assigner.v1.AssignerService/"
_BINDING = "/dataservice.assigner.v1.BindingService/"
_ADMIN = "/dataservice.assigner.v1.AdminService/"
_STREAM = "/dataservice.sidecar.v1.StreamService/"
_NOTIFIER = "/dataservice.notifier.v1.NotifierService/"

RULES: Mapping[str, Rule] = {
    _ASSIGNER + "Session": Rule(
        Verb.SESSION, _join_sidecar, scope=_join_serves, endpoint=_join_endpoint_host
    ),
    _ASSIGNER + "Leave": Rule(Verb.SESSION, _sidecar, scope=_leave_serves),
    _BINDING + "Bind": Rule(Verb.READ, _group, client=_client),
    _BINDING + "WatchBinding": Rule(Verb.READ, _group, client=_client),
    _BINDING + "Unbind": Rule(Verb.READ, _group, client=_client),
    _ADMIN + "ListGroups": Rule(Verb.VIEW),
    _ADMIN + "DescribeGroup": Rule(Verb.DESCRIBE, _group),
    _ADMIN + "ListClients": Rule(Verb.DESCRIBE, _group),
    _ADMIN + "CreateGroup": Rule(Verb.ADMIN),
    _ADMIN + "UpdateGroup": Rule(Verb.ADMIN),
    _ADMIN + "DeleteGroup": Rule(Verb.ADMIN),
    _ADMIN + "ResetOffsets": Rule(Verb.ADMIN),
    _ADMIN + "MoveLease": Rule(Verb.ADMIN),
    _ADMIN + "DrainSidecar": Rule(Verb.ADMIN),
    _ADMIN + "UndrainSidecar": Rule(Verb.ADMIN),
    _STREAM + "Fetch": Rule(Verb.READ, _group, client=_client),
    _STREAM + "Stream": Rule(Verb.READ, _open_group, client=_open_client),
    _STREAM + "Ack": Rule(Verb.READ, _group, client=_client),
    _STREAM + "Nack": Rule(Verb.READ, _group, client=_client),
    _STREAM + "ReadRange": Rule(Verb.READ, _group, client=_client),
    _STREAM + "CommitOffsets": Rule(Verb.READ, _group, client=_client),
    _STREAM + "Status": Rule(Verb.READ, served_group=True),
    _NOTIFIER + "ReportFault": Rule(Verb.REPORT),
    _NOTIFIER + "ListFaults": Rule(Verb.VIEW),
    _NOTIFIER + "WatchFaults": Rule(Verb.VIEW),
    _NOTIFIER + "ListAlertTemplates": Rule(Verb.VIEW),
    _NOTIFIER + "PutAlertTemplate": Rule(Verb.ADMIN),
    _NOTIFIER + "DeleteAlertTemplate": Rule(Verb.ADMIN),
}

PUBLIC_PREFIXES = ("/grpc.health.v1.Health/",)
AUTHENTICATED_PREFIXES = (
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


def is_public(method: str) -> bool:
    """Whether anyone, known or not, may call ``method`` (health checks)."""
    return method.startswith(PUBLIC_PREFIXES)


def rule_for(method: str) -> Rule | None:
    """The rule of ``method``; None: no rule, the call is refused."""
    rule = RULES.get(method)
    if rule is None and method.startswith(AUTHENTICATED_PREFIXES):
        return Rule(Verb.AUTHENTICATED)
    return rule
