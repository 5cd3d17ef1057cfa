"""Authentication and authorization of every call, in one server interceptor.

For each method the interceptor covers it: authenticates the caller (bearer token or client
certificate, :class:`~services.runtime.auth.identity.Authenticator`), reads the permission
the call needs from its request (:mod:`~services.runtime.auth.rules`; for a client stream,
from its first message, before the servicer sees it), asks the policy
(:class:`~services.runtime.auth.policy.Policy`, re-read when its file changes), checks the
client id the request names against the identities holding the group's client ids
(:class:`~services.runtime.auth.client_ids.ClientOwners`), and either serves the call with
:data:`~services.runtime.auth.identity.CURRENT` set to the caller, or refuses it:
``UNAUTHENTICATED`` or ``PERMISSION_DENIED`` with ErrorInfo (metadata ``permission`` names
what was needed), counted and rate-limit logged by
:class:`~services.runtime.auth.refusals.Refusals`. Servicers hold no authorization code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc.aio

from dsclient.reasons import DsError, Reason
from dsclient.watched_file import WatchedFile
from services.runtime.auth.client_ids import ClientOwners
from services.runtime.auth.identity import (
    CURRENT,
    Authenticator,
    Identity,
    bearer_token,
    certificate_name,
    unauthenticated,
)
from services.runtime.auth.policy import Permission, Policy, Verb
from services.runtime.auth.refusals import Refusals
from services.runtime.auth.rules import Rule, is_public, peer_host, rule_for
from services.runtime.handlers import Behavior, WrappingInterceptor

Context = grpc.aio.ServicerContext[Any, Any]

SOCKET_ONLY = (
    "callers are authenticated on this sidecar's pod socket (uds_dir) only: its TCP port "
    "has no TLS, so a token is never taken there"
)


def is_unix_peer(peer: str) -> bool:
    """Whether a gRPC peer (``unix:PATH``, ``ipv4:A:PORT``, ...) came over a Unix socket."""
    return peer.startswith("unix")


def permission_denied(identity: Identity, permission: Permission, method: str) -> DsError:
    who = f"{identity.name!r} (pod {identity.pod})" if identity.pod else repr(identity.name)
    return DsError(
        Reason.PERMISSION_DENIED,
        f"{who} may not call {method}: it needs permission {permission}",
        metadata={"permission": str(permission), "identity": identity.name, "rpc": method},
    )


def client_id_held(identity: Identity, client_id: str, method: str) -> DsError:
    return DsError(
        Reason.PERMISSION_DENIED,
        f"{identity.name!r} may not call {method} as client {client_id!r}: another identity "
        "holds that client id of the group; use a client id of your own",
        metadata={
            "permission": f"client_id:{client_id}",
            "identity": identity.name,
            "rpc": method,
            "client_id": client_id,
        },
    )


def no_rule(identity: Identity, method: str) -> DsError:
    return DsError(
        Reason.PERMISSION_DENIED,
        f"{method} has no authorization rule; nobody may call it",
        metadata={"permission": "none", "identity": identity.name, "rpc": method},
    )


class AuthInterceptor(WrappingInterceptor):
    """Refuses every call whose caller the policy does not allow (health checks aside)."""

    def __init__(
        self,
        authenticator: Authenticator,
        policy: WatchedFile[Policy],
        refusals: Refusals,
        *,
        served_group: str = "",
        clients: ClientOwners | None = None,
        socket_only: bool = False,
    ) -> None:
        """``socket_only``: the server has no TLS (a sidecar serving its pod's socket,
        ``ServiceSettings.tokens_only_on_socket``): a call is authenticated on a Unix
        domain socket only; over TCP every covered call is UNAUTHENTICATED, a token sent
        there in the clear is never taken."""
        self._authenticator = authenticator
        self._socket_only = socket_only
        self._policy = policy
        self._refusals = refusals
        self._served_group = served_group
        self._clients = clients

    def covers(self, method: str) -> bool:
        return not is_public(method)

    # ---- the decisions ------------------------------------------------------------------

    def _refuse(self, err: DsError, identity: Identity | None, method: str) -> DsError:
        self._refusals.refused(
            identity.name if identity else None, err.code.name, method, err.message
        )
        return err

    def authenticate(self, method: str, context: Context) -> Identity:
        try:
            if self._socket_only and not is_unix_peer(context.peer()):
                raise unauthenticated(SOCKET_ONLY)
            return self._authenticator.authenticate(
                bearer_token(context.invocation_metadata() or ()),
                certificate_name(context.auth_context()),
            )
        except DsError as err:
            raise self._refuse(err, None, method) from None

    def authorize(
        self, method: str, rule: Rule | None, identity: Identity, request: Any, peer: str = ""
    ) -> None:
        if rule is None:
            raise self._refuse(no_rule(identity, method), identity, method)
        policy = self._policy.get()
        permission = rule.permission(request, self._served_group)
        needed = (permission, *(rule.scope(request) if rule.scope is not None else ()))
        for each in needed:
            if not policy.allows(identity.name, each, pod=identity.pod):
                raise self._refuse(permission_denied(identity, each, method), identity, method)
        if rule.endpoint is not None:
            host = rule.endpoint(request)
            advertise = Permission(Verb.ADVERTISE, host)
            allowed = policy.allows(identity.name, advertise, pod=identity.pod)
            if host and host != peer_host(peer) and not allowed:
                err = permission_denied(identity, advertise, method)
                raise self._refuse(err, identity, method)
        if rule.client is not None and self._clients is not None:
            client_id = rule.client(request)
            if client_id and self._clients.claim(permission.resource, client_id, identity.name):
                err = client_id_held(identity, client_id, method)
                raise self._refuse(err, identity, method)

    # ---- the wrapping -------------------------------------------------------------------

    def wrap(
        self, method: str, behavior: Behavior, request_streaming: bool, response_streaming: bool
    ) -> Behavior:
        rule = rule_for(method)
        if request_streaming:
            return self._wrap_request_stream(method, rule, behavior, response_streaming)
        if response_streaming:

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                identity = self.authenticate(method, context)
                self.authorize(method, rule, identity, request, context.peer())
                CURRENT.set(identity)
                async for response in behavior(request, context):
                    yield response

            return unary_stream

        async def unary_unary(request: Any, context: Context) -> Any:
            identity = self.authenticate(method, context)
            self.authorize(method, rule, identity, request, context.peer())
            CURRENT.set(identity)
            return await behavior(request, context)

        return unary_unary

    def _wrap_request_stream(
        self, method: str, rule: Rule | None, behavior: Behavior, response_streaming: bool
    ) -> Behavior:
        async def first_checked(requests: AsyncIterator[Any], context: Context) -> Any:
            """The request stream, its first message authorized before anything is served;
            None for a stream that ends before its first message."""
            identity = self.authenticate(method, context)
            iterator = aiter(requests)
            try:
                first = await anext(iterator)
            except StopAsyncIteration:
                return None
            self.authorize(method, rule, identity, first, context.peer())
            CURRENT.set(identity)

            async def chained() -> AsyncIterator[Any]:
                yield first
                async for request in iterator:
                    yield request

            return chained()

        if response_streaming:

            async def stream_stream(requests: Any, context: Context) -> AsyncIterator[Any]:
                checked = await first_checked(requests, context)
                if checked is None:
                    return
                async for response in behavior(checked, context):
                    yield response

            return stream_stream

        async def stream_unary(requests: Any, context: Context) -> Any:
            checked = await first_checked(requests, context)
            return await behavior(_empty() if checked is None else checked, context)

        return stream_unary


async def _empty() -> AsyncIterator[Any]:
    return
    yield  # pragma: no cover - makes this an async generator
