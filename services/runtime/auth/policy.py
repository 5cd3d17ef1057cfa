"""Who may do what: roles, the permissions they grant, and the policy file (pure, no I/O).

A caller's identity (its certificate subject's common name or its token's subject) is
given roles by the policy file::

    identities:
      sidecar-0: [sidecar, reporter, viewer]     # Session/Leave as sidecar-0 only
      spark-etl: ["reader:demo", viewer]
      ops-alice: [admin]
      notifier: [reporter, viewer, "reader:ds-probe", "admin"]

Roles (ARCHITECTURE §8):

* ``sidecar`` holds a Session and may Leave only as the sidecar id equal to its identity,
  or, when the caller's token is a service-account token bound to a pod (TokenReview:
  :mod:`.token_review`), as that pod's name: an injected sidecar's id is its pod's name,
  its identity the service account its Deployment's pods share, so each pod holds its own
  id and no other pod's. ``sidecar:ID`` names another id (one role per id).
* ``serves:GROUP`` — the scope of a sidecar identity (issue 37, finding 1): the groups its
  Session may join (``serves:*`` every group). A sidecar identity without one joins none.
* ``endpoint:HOST`` — the host names (or ``*.suffix``) a sidecar identity may advertise as
  its endpoint; without one, only the address its Session comes from.
* ``reader:GROUP`` reads that group's data (Fetch, Stream, Ack, ReadRange, CommitOffsets,
  Status, Bind, WatchBinding, Unbind) and describes it (DescribeGroup); ``reader:*`` every
  group.
* ``admin`` mutates (AdminService writes, ResetOffsets, alert-template writes) and views.
* ``reporter`` reports faults.
* ``viewer`` calls the read-only admin and notifier RPCs and sees ``/ui``.

A :class:`Permission` is what one call needs; :meth:`Policy.allows` is the whole decision.
Nothing is granted by default: an identity the file does not name has no role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import yaml

ANY_GROUP = "*"


class Verb(StrEnum):
    """What a call does, as far as authorization cares."""

    SESSION = "session"  # hold a sidecar's Session or Leave as it (resource: sidecar id)
    READ = "read"  # a group's data and bindings (resource: group)
    DESCRIBE = "describe"  # one group's description (resource: group)
    VIEW = "view"  # read-only admin and notifier calls, /ui
    ADMIN = "admin"  # every mutation of the control plane
    REPORT = "report"  # report a fault
    AUTHENTICATED = "authenticated"  # anything any known caller may do (reflection)
    SERVE = "serve"  # a sidecar's Session joins a group (resource: group)
    ADVERTISE = "advertise"  # a sidecar advertises an endpoint (resource: its host)


@dataclass(frozen=True)
class Permission:
    """What one call needs: a verb on a resource (a group or a sidecar id, or none)."""

    verb: Verb
    resource: str = ""

    def __str__(self) -> str:
        return f"{self.verb}:{self.resource}" if self.resource else str(self.verb)


class PolicyError(ValueError):
    """The policy file is malformed; the message names the entry."""


@dataclass(frozen=True)
class Role:
    """One parsed role: its name (``reader``) and its argument (``demo``), if any."""

    name: str
    arg: str = ""

    @classmethod
    def parse(cls, text: str) -> Role:
        name, _, arg = text.strip().partition(":")
        if name not in _ROLE_NAMES:
            raise PolicyError(f"unknown role {text!r} (roles: {', '.join(sorted(_ROLE_NAMES))})")
        if name in ("reader", "serves") and not arg:
            raise PolicyError(f"role {text!r} must name a group: {name}:GROUP (or {name}:*)")
        if name == "endpoint" and not arg:
            raise PolicyError(f"role {text!r} must name a host: endpoint:HOST (or *.suffix)")
        if name in ("admin", "reporter", "viewer") and arg:
            raise PolicyError(f"role {name!r} takes no argument (got {text!r})")
        return cls(name, arg)

    def grants(self, identity: str, permission: Permission, pod: str = "") -> bool:
        """Whether this role lets ``identity`` do ``permission``; ``pod``: the pod its
        token is bound to ("" when it is bound to none), an id the bare ``sidecar`` role
        may hold beside the identity's own."""
        verb, resource = permission.verb, permission.resource
        if verb is Verb.AUTHENTICATED:
            return True
        if self.name == "admin":
            return verb in (Verb.ADMIN, Verb.VIEW, Verb.DESCRIBE)
        if self.name == "viewer":
            return verb in (Verb.VIEW, Verb.DESCRIBE)
        if self.name == "reporter":
            return verb is Verb.REPORT
        if self.name == "reader":
            return verb in (Verb.READ, Verb.DESCRIBE) and self.arg in (ANY_GROUP, resource)
        if self.name == "sidecar":
            ids = (self.arg,) if self.arg else (identity, pod)
            return verb is Verb.SESSION and resource in ids and resource != ""
        if self.name == "serves":
            return verb is Verb.SERVE and self.arg in (ANY_GROUP, resource) and resource != ""
        if self.name == "endpoint":
            return verb is Verb.ADVERTISE and _host_matches(self.arg, resource)
        return False  # pragma: no cover - parse admits no other name


_ROLE_NAMES = frozenset({"sidecar", "reader", "admin", "reporter", "viewer", "serves", "endpoint"})


def _host_matches(pattern: str, host: str) -> bool:
    """``host`` is ``pattern``, or ends in ``.suffix`` for a ``*.suffix`` pattern."""
    host, pattern = host.lower(), pattern.lower()
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern and host != ""


@dataclass(frozen=True)
class Policy:
    """Identity → roles. An identity not named has none."""

    roles: Mapping[str, tuple[Role, ...]] = field(default_factory=dict)

    def allows(self, identity: str, permission: Permission, *, pod: str = "") -> bool:
        """Whether ``identity`` may do what ``permission`` names; ``pod``: the pod its
        token is bound to, if any (only a TokenReview says so)."""
        return any(role.grants(identity, permission, pod) for role in self.roles.get(identity, ()))

    def roles_of(self, identity: str) -> tuple[Role, ...]:
        return tuple(self.roles.get(identity, ()))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Iterable[str]]) -> Policy:
        return cls({str(name): tuple(Role.parse(r) for r in roles) for name, roles in data.items()})


def parse_policy(text: bytes | str) -> Policy:
    """The policy file's YAML (``identities: {NAME: [ROLE, ...]}``); PolicyError if bad."""
    try:
        data: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PolicyError(f"the policy is not valid YAML: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict) or set(data) - {"identities"}:
        raise PolicyError("the policy must be a mapping with one key, identities")
    identities = data.get("identities") or {}
    if not isinstance(identities, dict):
        raise PolicyError("identities must map each identity to a list of roles")
    for name, roles in identities.items():
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise PolicyError(f"identities.{name} must be a list of role names")
    return Policy.from_mapping(identities)
