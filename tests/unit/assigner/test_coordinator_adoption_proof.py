"""After a restart or a leader change, a lease is adopted only by the sidecar that held it
(issue 37, finding 2). During the settle window a join naming a FREE lease's current epoch
used to be granted it; epochs are readable by any viewer (DescribeGroup), so an epoch is
no proof. The holder of each epoch is made durable with it (the state topic's epoch
record), and only that sidecar adopts it: anyone else naming it is fenced.
"""

from __future__ import annotations

from services.assigner.coordinator import (
    GroupCoordinator,
    HeldLease,
    Progress,
    RevokeCmd,
    RevokeWhy,
    Timing,
)
from services.assigner.state import StateSnapshot, apply_record
from services.runtime.topic_partition import TopicPartition
from tests.unit.assigner.coordinator_support import grants, member, revokes

TPS = [TopicPartition("t", p) for p in range(4)]
TIMING = Timing(ttl=2.0, grace=1.0)


def restored() -> GroupCoordinator:
    """After a restart: epochs 3, partitions 0-1 held by a, 2-3 by b, settling until 4."""
    holders = {tp: ("a" if tp.partition < 2 else "b") for tp in TPS}
    return GroupCoordinator(
        "g", TPS, TIMING, epochs={tp: 3 for tp in TPS}, holders=holders, settle_until=4.0
    )


def test_a_join_naming_every_epoch_adopts_none_of_anothers_leases() -> None:
    coord = restored()
    out = coord.join(member("z"), [HeldLease(tp, 3) for tp in TPS], now=0.5)
    print("z names every epoch after the restart: renewed", out.renewed, "fenced", revokes(out))
    assert out.renewed == []
    assert revokes(out) == [RevokeCmd("z", tp, 3, RevokeWhy.FENCED) for tp in TPS]
    assert all(lease.holder is None for lease in coord.leases.values())
    # The real holders re-attach and adopt theirs; nothing moves.
    assert len(coord.join(member("a"), [HeldLease(tp, 3) for tp in TPS[:2]], 1.0).renewed) == 2
    assert len(coord.join(member("b"), [HeldLease(tp, 3) for tp in TPS[2:]], 1.0).renewed) == 2
    for m, tps in (("a", TPS[:2]), ("b", TPS[2:]), ("z", [])):
        coord.heartbeat(m, [Progress(tp, 3) for tp in tps], [], now=3.5)
    assert grants(coord.disconnect_expired(now=4.5)) == []
    assert {tp: lease.holder for tp, lease in coord.leases.items()} == {
        **dict.fromkeys(TPS[:2], "a"),
        **dict.fromkeys(TPS[2:], "b"),
    }


def test_the_state_topic_keeps_each_epochs_holder() -> None:
    snapshot = StateSnapshot()
    key = b'["epoch","g","t",0]'
    apply_record(snapshot, key, b'{"epoch": 3, "holder": "a"}')
    apply_record(snapshot, key, b'{"epoch": 2, "holder": "z"}')  # older: ignored
    assert snapshot.epochs["g"][TPS[0]] == 3 and snapshot.holders["g"][TPS[0]] == "a"
    apply_record(snapshot, key, b'{"epoch": 4}')  # a reset's epoch: nobody holds it yet
    assert snapshot.epochs["g"][TPS[0]] == 4 and TPS[0] not in snapshot.holders["g"]
