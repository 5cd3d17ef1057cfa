"""The group settings ``dsctl config set`` takes beside librdkafka properties (pure):
``ordering`` (issue 39) and ``commit_fencing`` (issue 36), named as ``GroupConfig`` and
UpdateGroup's ``update_mask`` name them, with the values a DsGroup spec takes.

``KEY=VALUE`` arguments and ``--unset`` keys naming one of these go to the group's field of
that name; every other key is a consumer property. ``ordering`` always has a value (the
assigner stores an unspecified one as ``unordered``); ``commit_fencing`` may be unset
(``--unset``): each sidecar's own setting applies. The assigner checks the values again,
and refuses a ``commit_fencing`` change away from ``kafka``
(``services/assigner/admin/validation.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dataservice.assigner.v1 import types_pb2
from services.runtime.group_enums import COMMIT_FENCING_BY_NAME, ORDERING_BY_NAME

# key -> (before, after): the value names; None = unspecified.
SettingsChange = dict[str, tuple[str | None, str | None]]


@dataclass(frozen=True)
class Setting:
    choices: Mapping[str, int]  # value name -> GroupConfig enum number
    # The value of an unspecified field; None: unspecified is a state of its own (unset).
    default: str | None
    unset: str  # what a group that does not set it runs
    effect: str  # what applying a change does, one line


SETTINGS: Mapping[str, Setting] = {
    "ordering": Setting(
        ORDERING_BY_NAME,
        "unordered",
        "unordered",
        "every sidecar applies it from its next hand-out of records; records in flight at a "
        "switch to key or partition have no known key and hold back their partition until "
        "acked (docs/concepts/delivery.md)",
    ),
    "commit_fencing": Setting(
        COMMIT_FENCING_BY_NAME,
        None,
        "each sidecar's commit_fencing setting",
        "every sidecar applies it to the partitions granted to it from now on (a lease held "
        "keeps its fencing); it changes live only towards kafka "
        "(docs/operate/failure-model.md)",
    ),
}


def split(
    sets: Mapping[str, str], unsets: Sequence[str]
) -> tuple[dict[str, str], list[str], dict[str, str], list[str]]:
    """``(consumer sets, consumer unsets, setting sets, setting unsets)``."""
    return (
        {k: v for k, v in sets.items() if k not in SETTINGS},
        [k for k in unsets if k not in SETTINGS],
        {k: v for k, v in sets.items() if k in SETTINGS},
        [k for k in unsets if k in SETTINGS],
    )


def value_of(config: types_pb2.GroupConfig, key: str) -> str | None:
    """The group's ``key`` as a value name; None = unset."""
    setting, number = SETTINGS[key], getattr(config, key)
    return next((name for name, n in setting.choices.items() if n == number), setting.default)


def shown(key: str, value: str | None) -> str:
    return value if value is not None else f"(unset: {SETTINGS[key].unset})"


def check(sets: Mapping[str, str], unsets: Sequence[str]) -> None:
    """ValueError naming an unknown value, a key both set and unset, or an ``--unset`` of a
    setting that is always set (checked before the group is read)."""
    if both := sorted(set(sets) & set(unsets)):
        raise ValueError(f"{', '.join(both)}: both set and unset")
    for key, value in sets.items():
        if value not in (choices := SETTINGS[key].choices):
            names = list(choices)
            expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
            raise ValueError(f"{key}: unknown value {value!r}: expected {expected}")
    for key in unsets:
        if (default := SETTINGS[key].default) is not None:
            raise ValueError(f"--unset {key}: {key} is always set; set {key}={default}")


def changes(
    config: types_pb2.GroupConfig, sets: Mapping[str, str], unsets: Sequence[str]
) -> SettingsChange:
    """The settings that change from ``config`` (only those whose value differs);
    ValueError as :func:`check`, or for an ``--unset`` of a setting the group leaves unset."""
    check(sets, unsets)
    out: SettingsChange = {key: (value_of(config, key), value) for key, value in sets.items()}
    for key in unsets:
        if (before := value_of(config, key)) is None:
            raise ValueError(f"--unset {key}: the group does not set it")
        out[key] = (before, None)
    return {k: change for k, change in sorted(out.items()) if change[0] != change[1]}


def patch(config: types_pb2.GroupConfig, change: SettingsChange) -> list[str]:
    """Writes the new values of ``change`` into ``config`` (an UpdateGroup request's group);
    returns the update_mask paths."""
    for key, (_before, after) in change.items():
        setattr(config, key, 0 if after is None else SETTINGS[key].choices[after])
    return sorted(change)
