"""Which identity holds each client id of a group (pure; one event loop uses it).

A ``client_id`` is the caller's claim: acks, nacks, explicit commits and bindings are
bound to it, so with authorization on a reader of a group that named another reader's
client id could nack its records for hours, ack them unread or unbind it (issue 37,
finding 12). Scope is part of identity (ARCHITECTURE §8): the first identity to name a
client id of a group holds it, and another identity naming it is refused
(``PERMISSION_DENIED``, metadata ``client_id``). Client ids are random per process, so a
holder is normally the only one that ever names its ids.

Bounded: each identity holds at most ``max_per_identity`` client ids; past that its least
recently used id is let go (only its own: another identity cannot push an id out by
naming many of its own). An id no longer held may be claimed again, by anyone.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_CLIENT_IDS_PER_IDENTITY = 4096


class ClientOwners:
    """(group, client id) → the identity holding it."""

    def __init__(self, max_per_identity: int = MAX_CLIENT_IDS_PER_IDENTITY) -> None:
        self._max = max_per_identity
        self._owner: dict[tuple[str, str], str] = {}
        self._held: dict[str, OrderedDict[tuple[str, str], None]] = {}

    def claim(self, group: str, client_id: str, identity: str) -> str | None:
        """Whether ``identity`` may name ``client_id`` of ``group``: None, and it holds it
        now (most recently used); or the identity that holds it."""
        key = (group, client_id)
        owner = self._owner.get(key)
        if owner is not None and owner != identity:
            return owner
        held = self._held.setdefault(identity, OrderedDict())
        held[key] = None
        held.move_to_end(key)
        self._owner[key] = identity
        while len(held) > self._max:
            oldest, _ = held.popitem(last=False)
            del self._owner[oldest]
        return None

    def holder(self, group: str, client_id: str) -> str | None:
        return self._owner.get((group, client_id))
