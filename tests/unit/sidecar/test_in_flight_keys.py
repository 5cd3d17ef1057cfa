"""InFlightKeys (services/consumer_sidecar/in_flight_keys.py, issue 39): the keys in flight
kept from look to look agree, after every look, with the set rebuilt from every record in
flight, whatever runs come and go (handed out, acked, split by a partial ack, come due)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.in_flight_keys import InFlightKeys
from services.consumer_sidecar.ordering import UNKNOWN, Key

OFFSETS = 40
# Each offset's key: a few keys, keyless records (None), and offsets with no known key.
key_of = st.lists(st.sampled_from([b"a", b"b", b"c", None, "unknown"]), min_size=OFFSETS,
                  max_size=OFFSETS)  # fmt: skip
# A look: which offsets are in flight; consecutive ones form runs, cut at random points.
looks = st.lists(
    st.tuples(st.sets(st.integers(0, OFFSETS - 1)), st.sets(st.integers(1, OFFSETS - 1))),
    max_size=12,
)


def runs_of(offsets: set[int], cuts: set[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if runs and runs[-1][1] == o and o not in cuts:
            runs[-1] = (runs[-1][0], o + 1)
        else:
            runs.append((o, o + 1))
    return runs


@settings(max_examples=300, deadline=None)
@given(key_of, looks)
def test_kept_counts_agree_with_a_rebuild_after_every_look(
    keys_by_offset: list[Key | str], steps: list[tuple[set[int], set[int]]]
) -> None:
    keys = {o: k for o, k in enumerate(keys_by_offset) if k != "unknown"}
    tracked = InFlightKeys()
    for offsets, cuts in steps:
        tracked.sync(runs_of(offsets, cuts), keys)  # type: ignore[arg-type]
        rebuilt = [keys.get(o, UNKNOWN) for o in offsets]
        assert set(tracked.keys) == {k for k in rebuilt if k is not None}
        assert tracked.keyless == rebuilt.count(None)
    tracked.sync([], keys)  # type: ignore[arg-type]
    assert not tracked.keys
    assert tracked.keyless == 0
