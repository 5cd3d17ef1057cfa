"""What is an external commit (issue 23), given a commit's metadata and the holder's
history: Hypothesis properties of :func:`services.runtime.commitmeta.is_external`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.runtime.commitmeta import committed_by, encode, is_external, ranges_of

offsets = st.integers(min_value=0, max_value=10**12)
seen = st.integers(min_value=-1, max_value=10**12)
epochs = st.integers(min_value=0, max_value=10**9)
# Every committer the mesh has: sidecars (any id) and the assigner's resets.
committers = st.one_of(
    st.just("assigner"), st.text(min_size=1, max_size=40).filter(lambda s: s.strip("\x00"))
)


@settings(max_examples=500, deadline=None)
@given(
    committed=offsets,
    last_seen=seen,
    epoch=epochs,
    sidecar=committers,
    acked=st.sets(st.integers(min_value=0, max_value=300), max_size=50),
    nul=st.booleans(),
)
def test_no_commit_of_the_mesh_is_ever_external(
    committed: int, last_seen: int, epoch: int, sidecar: str, acked: set[int], nul: bool
) -> None:
    """Whatever the epoch (this holder's, an older holder's late commit, a kafka_group
    member's 0, a reset's new one) and whatever the holder saw last."""
    metadata = encode(epoch, sidecar, committed, ranges_of(committed + a for a in acked))
    if nul:  # as the commit log holds what confluent-kafka wrote
        metadata += "\x00"
    assert not is_external(committed, metadata, last_seen)


@settings(max_examples=300, deadline=None)
@given(committed=offsets, metadata=st.one_of(st.none(), st.text(max_size=100)))
def test_an_unchanged_offset_is_never_external(committed: int, metadata: str | None) -> None:
    assert not is_external(committed, metadata, committed)


@settings(max_examples=300, deadline=None)
@given(metadata=st.one_of(st.none(), st.text(max_size=100)), last_seen=seen)
def test_nothing_committed_is_never_external(metadata: str | None, last_seen: int) -> None:
    assert not is_external(-1, metadata, last_seen)
    assert not is_external(-1001, metadata, last_seen)


@settings(max_examples=300, deadline=None)
@given(
    committed=offsets,
    last_seen=seen,
    metadata=st.one_of(
        st.none(),
        st.just(""),
        st.just("\x00"),
        st.text(max_size=60).filter(lambda s: not s.lstrip().startswith(("{", "[", '"'))),
        st.just('{"epoch": 3}'),  # names no committer
    ),
)
def test_a_moved_offset_without_the_meshs_metadata_is_external(
    committed: int, last_seen: int, metadata: str | None
) -> None:
    """kafka-consumer-groups --reset-offsets writes no metadata; foreign text is not ours."""
    if committed != last_seen:
        assert is_external(committed, metadata, last_seen)


def test_kafka_tools_reset_against_the_holders_history() -> None:
    mine = encode(7, "sidecar-a", 900, [(905, 906)])
    assert not is_external(900, mine, 850)  # our own commit, its answer not recorded yet
    assert not is_external(900, "", 900)  # reset to where we are: nothing changed
    assert is_external(0, "", 900)  # --to-earliest
    assert is_external(850, None, 900)  # --shift-by -50


@settings(max_examples=300, deadline=None)
@given(committed=offsets, epoch=epochs, sidecar=committers, nul=st.booleans())
def test_committed_by_names_the_mesh_committer_under_its_epoch(
    committed: int, epoch: int, sidecar: str, nul: bool
) -> None:
    metadata = encode(epoch, sidecar, committed, ()) + ("\x00" if nul else "")
    writer = committed_by(metadata, committed)
    assert f"(epoch {epoch})" in writer and not writer.startswith("external")
    if sidecar == "assigner":
        assert writer == f"reset through the mesh (epoch {epoch})"
    else:
        assert writer == f"{sidecar} (epoch {epoch})"


@given(committed=offsets, foreign=st.text(max_size=200))
def test_committed_by_calls_anything_else_external(committed: int, foreign: str) -> None:
    writer = committed_by(foreign, committed)
    if is_external(committed, foreign, -1):
        assert writer.startswith("external (")
    assert committed_by("", committed) == "external (no metadata)"
    assert committed_by(foreign, -1) == ""  # nothing committed
