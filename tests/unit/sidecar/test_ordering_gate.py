"""Property tests of the ordering gate (services/consumer_sidecar/ordering.py, issue 39).

A model partition goes through random takes by several holders, acks, nacks, timeouts and
holders going away; after every take the promise of the group's ordering is checked: in
``key`` mode no key is in flight to two holders and every record handed out has every
record of its key below it acked (or handed out earlier in the same take, to the same
holder); ``partition`` mode likewise with one key; the gate never deadlocks (a take with
nothing in flight hands something out); ``unordered`` holds nothing back. Where the take
path's shortcut applies (no record due, every candidate new), :func:`eligible_new` gives
what :func:`eligible_prefix` gives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.ordering import (
    UNKNOWN,
    Key,
    Kind,
    Ordering,
    eligible_ahead,
    eligible_new,
    eligible_prefix,
    held_of,
)

PROPERTY = settings(max_examples=200, deadline=None)
HOLDERS = ["a", "b", "c", "d"]


@dataclass
class Model:
    """One partition: each record's key and state (None: never delivered, "acked",
    "due", or the holder it is in flight to)."""

    keys: list[Key]
    state: dict[int, str] = field(default_factory=dict)

    def unacked(self) -> list[tuple[int, Key, bool]]:
        return [
            (o, self.keys[o], s == "due")
            for o, s in sorted(self.state.items())
            if s not in ("acked",)
        ]

    def candidates(self) -> list[tuple[int, Key, Kind]]:
        """The buffer from the cursor on: the lowest record due or never delivered."""
        waiting = [o for o in range(len(self.keys)) if self.state.get(o) in (None, "due")]
        if not waiting:
            return []
        out = []
        for o in range(waiting[0], len(self.keys)):
            s = self.state.get(o)
            kind = Kind.NEW if s is None else Kind.DUE if s == "due" else Kind.SKIP
            out.append((o, self.keys[o], kind))
        return out

    def take(self, mode: Ordering, holder: str, limit: int) -> list[int]:
        candidates = self.candidates()
        n = min(limit, eligible_prefix(mode, self.unacked(), candidates))
        check_shortcut(mode, self.unacked(), candidates)
        handed = [o for o, _k, kind in candidates[:n] if kind is not Kind.SKIP]
        for o in handed:
            self.state[o] = holder
        return handed


def check_shortcut(
    mode: Ordering,
    unacked: list[tuple[int, Key, bool]],
    candidates: list[tuple[int, Key, Kind]],
) -> None:
    """The take path's shortcut (and the rule given the summary) agrees with the rule
    where it applies."""
    if any(due for *_, due in unacked) or any(k is not Kind.NEW for *_, k in candidates):
        return
    held = held_of(mode, [key for _, key, _ in unacked], [])
    assert eligible_prefix(mode, held, candidates) == eligible_prefix(mode, unacked, candidates)
    fast = eligible_new(mode, held, [key for _, key, _ in candidates])
    assert fast == eligible_prefix(mode, unacked, candidates)


ops = st.lists(
    st.tuples(
        st.sampled_from(["take", "take", "take", "ack", "nack", "release"]),
        st.sampled_from(HOLDERS),
        st.integers(1, 6),
        st.integers(0, 10_000),
    ),
    max_size=60,
)
keys = st.lists(
    st.one_of(st.none(), st.sampled_from([b"k1", b"k2", b"k3"])), min_size=1, max_size=25
)


def ordered_by(mode: Ordering, key: Key) -> Key | bytes | None:
    return b"p" if mode is Ordering.PARTITION else key


def check_take(model: Model, mode: Ordering, holder: str, handed: list[int]) -> None:
    """The promise of ``mode`` after a take handed ``handed`` out to ``holder``."""
    in_flight: dict[object, set[str]] = {}
    for o, s in model.state.items():
        slot = ordered_by(mode, model.keys[o])
        if slot is not None and s not in ("acked", "due"):
            in_flight.setdefault(slot, set()).add(s)
    assert all(len(h) == 1 for h in in_flight.values()), in_flight
    for o in handed:
        slot = ordered_by(mode, model.keys[o])
        if slot is None:
            continue
        for below in range(o):
            if ordered_by(mode, model.keys[below]) == slot:
                # acked, or handed out in this take before it (same holder, in order)
                assert model.state.get(below) == "acked" or below in handed, (below, o)


@PROPERTY
@given(keys, ops, st.sampled_from([Ordering.KEY, Ordering.PARTITION]))
def test_ordered_modes_keep_their_promise_through_nacks_timeouts_and_holders_leaving(
    record_keys: list[Key], steps: list[tuple[str, str, int, int]], mode: Ordering
) -> None:
    model = Model(record_keys)
    for op, holder, limit, pick in steps:
        if op == "take":
            nothing_in_flight = all(s in ("acked", "due") for s in model.state.values())
            handed = model.take(mode, holder, limit)
            check_take(model, mode, holder, handed)
            if nothing_in_flight and model.candidates():
                assert handed, "nothing in flight and nothing handed out: a deadlock"
        elif op == "ack":
            unacked = [o for o, s in model.state.items() if s != "acked"]
            if unacked:
                model.state[unacked[pick % len(unacked)]] = "acked"
        elif op == "nack":  # one record of the holder's (a nack, or its deadline passed)
            mine = [o for o, s in model.state.items() if s == holder]
            if mine:
                model.state[mine[pick % len(mine)]] = "due"
        else:  # the holder went away: all it holds is due
            for o, s in list(model.state.items()):
                if s == holder:
                    model.state[o] = "due"


@PROPERTY
@given(keys, ops)
def test_unordered_holds_nothing_back(
    record_keys: list[Key], steps: list[tuple[str, str, int, int]]
) -> None:
    model = Model(record_keys)
    for op, holder, limit, pick in steps:
        if op == "take":
            candidates = model.candidates()
            assert eligible_prefix(Ordering.UNORDERED, model.unacked(), candidates) == len(
                candidates
            )
            model.take(Ordering.UNORDERED, holder, limit)
        elif model.state:
            some = sorted(model.state)[pick % len(model.state)]
            model.state[some] = "acked" if op == "ack" else "due"


@PROPERTY
@given(keys, st.sampled_from([Ordering.KEY, Ordering.PARTITION]))
def test_with_nothing_in_flight_every_record_goes_out_in_one_take(
    record_keys: list[Key], mode: Ordering
) -> None:
    """A single client draining a partition is never held back (no throughput cost alone)."""
    model = Model(record_keys)
    assert model.take(mode, "a", len(record_keys)) == list(range(len(record_keys)))


def test_other_keys_pass_a_key_in_flight_until_a_record_of_it_comes() -> None:
    held = [(0, b"x", False)]
    candidates = [
        (1, b"y", Kind.NEW),
        (2, None, Kind.NEW),
        (3, b"x", Kind.NEW),
        (4, b"z", Kind.NEW),
    ]
    assert eligible_prefix(Ordering.KEY, held, candidates) == 2  # x at 3 holds back z at 4
    assert eligible_prefix(Ordering.PARTITION, held, candidates) == 0
    assert eligible_prefix(Ordering.UNORDERED, held, candidates) == 4


def test_a_due_record_goes_before_later_records_of_its_key_and_blocks_them_otherwise() -> None:
    # 0 (x) was nacked: due; 1 (x) still in flight to its first holder -> 0 waits for it
    held = [(0, b"x", True), (1, b"x", False)]
    assert eligible_prefix(Ordering.KEY, held, [(0, b"x", Kind.DUE), (1, b"x", Kind.SKIP)]) == 0
    # 1 acked: 0 goes again, then a new record of x may follow it in the same take
    held = [(0, b"x", True)]
    candidates = [(0, b"x", Kind.DUE), (1, b"x", Kind.SKIP), (2, b"x", Kind.NEW)]
    assert eligible_prefix(Ordering.KEY, held, candidates) == 3
    # but not without it: a due record of x below a new one holds it back
    assert eligible_prefix(Ordering.KEY, held, [(2, b"x", Kind.NEW), (3, b"y", Kind.NEW)]) == 0


def test_a_record_delivered_before_the_switch_holds_every_key_back_until_acked() -> None:
    """Switched live from unordered: the keys of records already in flight are not known."""
    held = [(0, UNKNOWN, False)]
    candidates = [(1, None, Kind.NEW), (2, b"y", Kind.NEW)]
    assert eligible_prefix(Ordering.KEY, held, candidates) == 1
    assert eligible_prefix(Ordering.KEY, [], candidates) == 2


@PROPERTY
@given(keys, ops, st.sampled_from([Ordering.KEY, Ordering.PARTITION, Ordering.UNORDERED]))
def test_the_look_ahead_holds_only_the_keys_in_flight(
    record_keys: list[Key], steps: list[tuple[str, str, int, int]], mode: Ordering
) -> None:
    """:func:`eligible_ahead` (nothing due, every candidate a first delivery): in ``key``
    mode a record is held exactly when a record of its key is in flight (no other key's
    record is held by it, whatever its place); ``partition``: all or nothing; ``unordered``:
    nothing held. What it lets go keeps the promise (:func:`check_take`)."""
    model = Model(record_keys)
    for op, holder, _limit, pick in steps:
        waiting = [o for o in range(len(record_keys)) if o not in model.state]
        if op == "take" and waiting:
            in_flight = [record_keys[o] for o, s in model.state.items() if s != "acked"]
            held = held_of(mode, in_flight, [])
            mask = eligible_ahead(mode, held, [record_keys[o] for o in waiting])
            for o, ok in zip(waiting, mask, strict=True):
                key = record_keys[o]
                if mode is Ordering.UNORDERED or not in_flight:
                    assert ok
                elif mode is Ordering.PARTITION:
                    assert not ok
                else:
                    assert ok == (key is None or key not in in_flight), (o, key)
            handed = [o for o, ok in zip(waiting, mask, strict=True) if ok]
            for o in handed:
                model.state[o] = holder
            if mode is not Ordering.UNORDERED:
                check_take(model, mode, holder, handed)
        elif op in ("ack", "nack", "release"):  # no dues here: every give-back is an ack
            mine = sorted(o for o, s in model.state.items() if s == holder)
            if mine:
                model.state[mine[pick % len(mine)]] = "acked"
