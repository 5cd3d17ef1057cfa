"""The shared-memory segment's ring (services/consumer_sidecar/shm_ring.py): regions held
by the client never overlap and stay inside the segment, space comes back as the client
releases, and an emptied ring holds a region as large as the segment again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.consumer_sidecar.shm_ring import Region, Ring

CAPACITY = 1000

steps = st.lists(
    st.one_of(
        st.tuples(st.just("allocate"), st.integers(1, 400)),
        st.tuples(st.just("release"), st.integers(0, 30)),  # an index into those held
        st.tuples(st.just("release_unknown"), st.integers(1000, 2000)),
    ),
    max_size=80,
)


@settings(max_examples=500, deadline=None)
@given(steps)
def test_held_regions_never_overlap_and_released_space_comes_back(script: list) -> None:  # type: ignore[type-arg]
    ring = Ring(CAPACITY)
    held: list[Region] = []
    ids: set[int] = set()
    for kind, arg in script:
        if kind == "allocate":
            region = ring.allocate(arg)
            if region is None:
                # Refused only while something is held: an empty ring takes any region
                # that fits the segment.
                assert held
                continue
            assert region.id not in ids  # ids are never reused within a stream
            ids.add(region.id)
            assert region.position >= 0 and region.end <= CAPACITY
            for other in held:
                assert region.end <= other.position or other.end <= region.position
            held.append(region)
        elif kind == "release" and held:
            region = held.pop(arg % len(held))
            assert ring.release(region.id)
            assert not ring.release(region.id)  # twice: nothing more
        elif kind == "release_unknown":
            assert not ring.release(arg)
        assert ring.held == len(held)
        room = ring.room()  # what allocate() takes now, and not a byte more
        assert 0 <= room <= CAPACITY
        if room < CAPACITY:
            assert ring._room(room + 1) is None
        if room:
            assert ring._room(room) is not None
    for region in held:
        ring.release(region.id)
    assert len(ring) == 0
    assert ring.allocate(CAPACITY) is not None


def test_the_space_after_a_held_region_waits_for_it() -> None:
    ring = Ring(100)
    first, second, third = ring.allocate(40), ring.allocate(40), ring.allocate(20)
    assert first and second and third
    assert ring.allocate(1) is None  # full
    assert ring.release(second.id)
    assert ring.allocate(10) is None  # the oldest (first) is still held: no reuse yet
    assert ring.release(first.id)
    again = ring.allocate(80)  # both gone: the start of the segment is free again
    assert again is not None and again.position == 0


def test_a_region_that_does_not_fit_before_the_end_starts_again_at_zero() -> None:
    ring = Ring(100)
    a, b = ring.allocate(60), ring.allocate(30)
    assert a and b
    ring.release(a.id)
    c = ring.allocate(20)  # 10 bytes left at the end: wraps to 0
    assert c is not None and c.position == 0
    assert ring.allocate(41) is None  # between 20 and 60 (b's start) there are 40
    d = ring.allocate(40)
    assert d is not None and (d.position, d.end) == (20, 60)


def test_fits_says_whether_a_region_can_ever_be_handed_out() -> None:
    ring = Ring(100)
    assert ring.fits(100) and not ring.fits(101) and not ring.fits(0)
