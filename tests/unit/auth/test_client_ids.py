"""ClientOwners: the first identity to name a client id of a group holds it; each identity
holds a bounded number, its own least recently used let go first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.runtime.auth.client_ids import ClientOwners


def test_the_first_identity_holds_a_client_id_of_its_group() -> None:
    owners = ClientOwners()
    assert owners.claim("g", "app-1", "reader-a") is None
    assert owners.claim("g", "app-1", "reader-a") is None  # again: its own
    assert owners.claim("g", "app-1", "reader-b") == "reader-a"
    assert owners.claim("other", "app-1", "reader-b") is None  # per group


def test_an_identity_cannot_push_another_identitys_ids_out() -> None:
    owners = ClientOwners(max_per_identity=3)
    owners.claim("g", "victim", "reader-a")
    for n in range(100):
        owners.claim("g", f"flood-{n}", "reader-b")
    assert owners.claim("g", "victim", "reader-b") == "reader-a"
    assert owners.holder("g", "flood-0") is None  # reader-b's own oldest let go
    assert owners.holder("g", "flood-99") == "reader-b"


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 9)), max_size=60))
def test_each_identity_holds_at_most_its_bound_and_nobody_holds_anothers(
    claims: list[tuple[str, int]],
) -> None:
    owners = ClientOwners(max_per_identity=4)
    for identity, n in claims:
        holder = owners.holder("g", f"c{n}")
        refused_by = owners.claim("g", f"c{n}", identity)
        assert refused_by == (holder if holder not in (None, identity) else None)
    held = [owners.holder("g", f"c{n}") for n in range(10)]
    assert all(held.count(identity) <= 4 for identity in "ab")
