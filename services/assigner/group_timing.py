"""A group's failure-detection timing, lease TTL and heartbeat interval (pure; issue 36
item 2). Only a ``kafka``-fenced group may choose its own: there a confirmed lease has no
local deadline on the sidecar (Kafka's transactional fencing keeps a stale holder from
committing), so the TTL only decides how soon a silent sidecar's partitions move. A
``lease``-fenced (or unspecified) group keeps the assigner's settings: its sidecars stop
at a local deadline derived from the TTL, and a takeover's settle time and the leader's
term-check budget are derived from the assigner's TTL to keep that safe
(docs/operate/failure-model.md "Per-group failure detection")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dsclient.reasons import invalid

# A group's own heartbeat interval is at least this (seconds): below it the heartbeats of
# many sidecars load the assigner for little faster detection.
MIN_GROUP_HEARTBEAT = 0.5
# A group's own TTL is at least this many heartbeat intervals: two late heartbeats in a
# row do not yet expire a member.
MIN_HEARTBEATS_PER_TTL = 3.0


@dataclass(frozen=True)
class GroupTiming:
    """A group's effective lease TTL and heartbeat interval (seconds)."""

    ttl: float
    heartbeat: float


def effective_timing(
    ttl: float | None, heartbeat: float | None, default: GroupTiming
) -> GroupTiming:
    """What a group record's values (None = the assigner's) mean."""
    return GroupTiming(
        ttl=default.ttl if ttl is None else ttl,
        heartbeat=default.heartbeat if heartbeat is None else heartbeat,
    )


def check_group_timing(chosen: GroupTiming, default: GroupTiming, commit_fencing: str) -> None:
    """INVALID_ARGUMENT unless ``chosen`` (already within the general ranges) is the
    assigner's ``default`` or a ``kafka``-fenced group's valid own choice."""
    if chosen == default:
        return
    field = "group.lease_ttl" if chosen.ttl != default.ttl else "group.heartbeat_interval"
    if commit_fencing != "kafka":
        raise invalid(
            field,
            f"a per-group lease TTL or heartbeat interval needs commit_fencing kafka: a "
            f"{commit_fencing or 'unspecified'}-fenced group's sidecars stop at a local lease "
            "deadline, and the takeover settle time and the leader's term-check budget that "
            f"keep it safe derive from the assigner's settings (TTL {default.ttl:g} s, "
            f"heartbeat {default.heartbeat:g} s): leave both unset or at those values",
        )
    if chosen.heartbeat < MIN_GROUP_HEARTBEAT:
        raise invalid(
            "group.heartbeat_interval",
            f"a group's own heartbeat interval must be at least {MIN_GROUP_HEARTBEAT:g} s",
        )
    if chosen.ttl < MIN_HEARTBEATS_PER_TTL * chosen.heartbeat:
        raise invalid(
            "group.lease_ttl",
            f"a group's own lease TTL must be at least {MIN_HEARTBEATS_PER_TTL:g} heartbeat "
            f"intervals ({MIN_HEARTBEATS_PER_TTL * chosen.heartbeat:g} s for "
            f"{chosen.heartbeat:g} s), so that a late heartbeat does not expire a member",
        )


def record_timing(chosen: GroupTiming, default: GroupTiming) -> tuple[float | None, float | None]:
    """The (lease_ttl_seconds, heartbeat_interval_seconds) a group record stores for a
    checked ``chosen``: None where it is the assigner's value."""
    return (
        None if chosen.ttl == default.ttl else chosen.ttl,
        None if chosen.heartbeat == default.heartbeat else chosen.heartbeat,
    )


def check_live_change(current: GroupTiming, desired: GroupTiming, commit_fencing: str) -> None:
    """A live change of a group's timing is a ``kafka``-fenced group's only (its bounds are
    check_group_timing's, as at creation): a lease-fenced group's sidecars stop at a local
    deadline derived from the TTL they were told. INVALID_ARGUMENT otherwise."""
    if current == desired or commit_fencing == "kafka":
        return
    field = "group.lease_ttl" if current.ttl != desired.ttl else "group.heartbeat_interval"
    raise invalid(
        field,
        f"cannot change the lease TTL or heartbeat interval of a "
        f"{commit_fencing or 'unspecified'}-fenced group live (now TTL {current.ttl:g} s, "
        f"heartbeat {current.heartbeat:g} s): only a kafka-fenced group's may change",
    )


@dataclass(frozen=True)
class TimingStep:
    """The TTL a group's members were told from config ``version`` on."""

    version: int
    ttl: float


def start_rollout(
    steps: tuple[TimingStep, ...], version: int, ttl: float
) -> tuple[TimingStep, ...]:
    """The steps of a rollout after config ``version`` tells the members ``ttl`` (appended
    to a rollout still under way: a member may still run any of its earlier steps)."""
    return (*steps, TimingStep(version, ttl))


def member_ttl(steps: tuple[TimingStep, ...], reported: int | None) -> float:
    """The TTL a member running config version ``reported`` was told: that of the last
    step at or below it; below every step, the first step's (the oldest any member may
    still run). None (not reported yet: it may run any step) is the longest of them."""
    if reported is None:
        return max(step.ttl for step in steps)
    told = steps[0].ttl
    for step in steps:
        if step.version <= reported:
            told = step.ttl
    return told


def rollout_ttl(
    steps: tuple[TimingStep, ...], reported: Mapping[str, int | None], members: Iterable[str]
) -> tuple[float, tuple[TimingStep, ...]]:
    """The TTL to expire the group's ``members`` by while a timing change rolls out, and
    the steps still to track. ``steps[0]`` is the TTL before the change (its version the
    one before it), the last the current one; ``reported`` is each member's reported
    running config version. Never shorter than what any member not yet on the last step
    was told (the longest of them and the current TTL); once every member reports the
    last step's version (or later), the current TTL and a rollout of just that step
    (done)."""
    current = steps[-1]
    members = list(members)
    if all((reported.get(m) or 0) >= current.version for m in members):
        return current.ttl, (current,)
    return max([current.ttl, *(member_ttl(steps, reported.get(m)) for m in members)]), steps
