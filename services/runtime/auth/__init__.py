"""Authentication and authorization of the mesh's callers (ARCHITECTURE §8).

* :mod:`.settings`: :class:`AuthSettings` (``auth:`` / ``DS_AUTH__*``), off by default;
* :mod:`.policy` (pure): roles, permissions and the policy file;
* :mod:`.rules` (pure): the permission each RPC needs, read from its request;
* :mod:`.tokens`: JWTs (PyJWT) and static tokens → identities;
* :mod:`.identity`: :class:`Authenticator` (token or certificate → identity) and the
  current call's identity (:func:`current_identity`);
* :mod:`.refusals`: refusals counted per identity, logged once per identity per minute;
* :mod:`.client_ids` (pure): which identity holds each client id of a group;
* :mod:`.interceptor`: :class:`AuthInterceptor`, the one place calls are allowed or refused;
* :class:`Guard` (here): the same decision for the HTTP pages (``/ui``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from dsclient.reasons import DsError
from dsclient.watched_file import WatchedFile
from services.runtime.auth.client_ids import ClientOwners
from services.runtime.auth.identity import (
    Authenticator,
    Identity,
    current_identity,
    unauthenticated,
)
from services.runtime.auth.interceptor import SOCKET_ONLY, AuthInterceptor, permission_denied
from services.runtime.auth.policy import Permission, Policy, Verb, parse_policy
from services.runtime.auth.refusals import Refusals
from services.runtime.auth.settings import AuthSettings

__all__ = [
    "AuthInterceptor",
    "AuthSettings",
    "Guard",
    "Identity",
    "Permission",
    "Verb",
    "build_guard",
    "current_identity",
]


@dataclass(frozen=True)
class Guard:
    """Everything authorization needs in one process: the authenticator, the policy file
    and the refusal counter; the gRPC interceptor and the HTTP pages share it."""

    authenticator: Authenticator
    policy: WatchedFile[Policy]
    refusals: Refusals
    # Which identity holds each client id of a group, shared by the process's interceptors.
    clients: ClientOwners = field(default_factory=ClientOwners)
    # The server has no TLS: callers are authenticated on its Unix domain socket only
    # (AuthInterceptor's socket_only); the HTTP pages, never on a socket, refuse every token.
    socket_only: bool = False

    def interceptor(self, served_group: str = "") -> AuthInterceptor:
        return AuthInterceptor(
            self.authenticator,
            self.policy,
            self.refusals,
            served_group=served_group,
            clients=self.clients,
            socket_only=self.socket_only,
        )

    def check(
        self, what: str, token: str | None, certificate: str | None, permission: Permission
    ) -> Identity:
        """The caller, if it may do ``permission``; DsError UNAUTHENTICATED or
        PERMISSION_DENIED (counted and logged like a refused call) if not."""
        identity: Identity | None = None
        try:
            if self.socket_only:
                raise unauthenticated(SOCKET_ONLY)
            identity = self.authenticator.authenticate(token, certificate)
            if not self.policy.get().allows(identity.name, permission, pod=identity.pod):
                raise permission_denied(identity, permission, what)
            return identity
        except DsError as err:
            self.refusals.refused(
                identity.name if identity else None, err.code.name, what, err.message
            )
            raise


def build_guard(
    settings: AuthSettings, registry: CollectorRegistry, audience: str, *, socket_only: bool = False
) -> Guard | None:
    """The process's guard; None when authorization is off. ``audience``: the service's own
    (its discovery name), the ``aud`` its tokens must name. ``socket_only``: the server has
    no TLS, callers are authenticated on its Unix socket only. Reads the policy (and so
    fails at start, with the file named, when it is missing or malformed)."""
    if not settings.enabled:
        return None
    assert settings.policy_file is not None
    policy = WatchedFile(settings.policy_file, parse_policy)
    policy.get()
    return Guard(
        Authenticator(settings, audience), policy, Refusals(registry), socket_only=socket_only
    )
