"""Static stability with commits fenced by Kafka (issue 36, ``DS_COMMIT_FENCING=kafka``).

* The assigner killed (kill -9) under traffic for many lease TTLs: every partition keeps
  delivering and its commits keep landing; produced = received, nothing lost; the
  assigner comes back and takes over with no lease moved (same holders, same epochs).
  CI runs a 25 s outage (8 TTLs); the 10-minute one is marked ``long``.
* A sidecar SIGSTOPped past its lease while its partitions move, then SIGCONTed while the
  assigner is paused (so only Kafka can stop it): no local deadline stops it any more, so
  it tries to commit the ack it finds waiting, and Kafka refuses it
  (``_FENCED``: the survivor's grant initialised the leases' transactional ids); no commit
  of it lands behind the survivor; duplicates only among what it had delivered and not
  acked (or whose ack Kafka's refusal turned down).

Real Kafka, a real assigner and sidecar processes, a producer and a ``DsClient`` reading
and acking; every record is counted.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid

import grpc
import pytest

from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.devstack.kafka import TopicFactory
from tests.support.assignment import (
    GroupView,
    describe_retrying,
    holders,
    wait_until,
)
from tests.support.loadrun import LoadRun
from tests.support.mesh import Mesh
from tests.support.ops import unexplained_duplicates
from tests.support.records import describe_missing
from tests.support.sidecar_probe import (
    CommitWatcher,
    committed,
    final_commits_not_the_survivors,
    zombie_commit_problems,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KAFKA_FENCED = {"DS_COMMIT_FENCING": "kafka"}


def own_state() -> dict[str, str]:
    """The assigner's own state topic and transactional id: on a broker shared with other
    test runs, an assigner started elsewhere under the default id fences this one's state
    writes and it stops leading (seen: "lost leadership: another assigner took the state
    topic's transactional id" in the middle of a run)."""
    suffix = uuid.uuid4().hex[:8]
    return {
        "DS_STATE_TOPIC": f"__ds_assigner_state_fenced_{suffix}",
        "DS_STATE_TRANSACTIONAL_ID": f"ds-assigner-state-fenced-{suffix}",
    }


TTL, GRACE = 3.0, 1.0  # the assigner's defaults


def log_count(run: LoadRun, text: str) -> int:
    return sum(svc.log.read_text(errors="replace").count(text) for svc in run.sidecars.values())


# ---- 1. every assigner away -----------------------------------------------------------

AWAY_PARTITIONS = 6
AWAY_SIDECARS = ("sc-a", "sc-b", "sc-c")


@pytest.mark.parametrize(
    "away",
    [
        pytest.param(25.0, id="25s", marks=pytest.mark.timeout(300)),
        pytest.param(600.0, id="10min", marks=[pytest.mark.long, pytest.mark.timeout(1200)]),
    ],
)
def test_kafka_fenced_leases_keep_delivering_and_committing_while_the_assigner_is_away(
    mesh: Mesh, topic_factory: TopicFactory, away: float
) -> None:
    topic = topic_factory(partitions=AWAY_PARTITIONS)
    run = LoadRun(
        mesh, topic, AWAY_PARTITIONS, AWAY_SIDECARS, rate=300,
        sidecar_env=KAFKA_FENCED, assigner_env=own_state(),
    )  # fmt: skip
    run.start()
    assert run.assigner is not None
    try:
        time.sleep(3)
        before = run.stable()
        committed_at_kill = run.committed()
        run.assigner.kill()  # every replica: this group has one
        killed_at = time.monotonic()
        time.sleep(away)
        back_at = time.monotonic()
        committed_at_return = run.committed()
        run.assigner.start()
        run.assigner.wait_serving(90)

        def reattached(view: GroupView) -> bool:
            return set(view.members) == set(AWAY_SIDECARS) and all(
                view.leases[p].granted for p in range(AWAY_PARTITIONS)
            )

        _, after = wait_until(run.addr, run.group, reattached, timeout=90)
        time.sleep(3)
        final_view = describe_retrying(run.addr, run.group)
    except BaseException:
        run.abort()
        raise
    result = run.finish()

    # Delivered during the outage, per partition: from the second TTL of it to its end.
    during = {
        d.partition for d in run.tally.deliveries if killed_at + 2 * TTL <= d.fetched_at < back_at
    }
    advanced = {p for p in range(AWAY_PARTITIONS) if committed_at_return[p] > committed_at_kill[p]}
    moved = {
        p: (before[p].holder, before[p].epoch, final_view.leases[p].holder,
            final_view.leases[p].epoch)
        for p in range(AWAY_PARTITIONS)
        if (final_view.leases[p].holder, final_view.leases[p].epoch)
        != (before[p].holder, before[p].epoch)
    }  # fmt: skip
    expired = log_count(run, "lease expired locally")
    print(
        f"assigner killed for {away:.0f}s ({away / TTL:.0f} TTLs), 3 sidecars, commit_fencing "
        f"kafka: produced {len(result.produced)}, received {len(run.tally.received())}, lost "
        f"{len(result.missing)}, duplicates {result.duplicate_count} (unexplained "
        f"{len(unexplained_duplicates(run.tally))}); partitions delivering during the outage "
        f"{sorted(during)}, commits advanced during it {sorted(advanced)} "
        f"({committed_at_kill} -> {committed_at_return}); leases expired locally {expired}; "
        f"holders before {holders(before)}, after {holders(after.leases)}; moved {moved}"
    )
    assert not result.errors, f"the application saw errors: {result.errors!r}"
    assert not result.missing, describe_missing(
        result.missing, AWAY_PARTITIONS, producer=run.producer, tally=run.tally
    )
    assert during == set(range(AWAY_PARTITIONS)), "a partition stopped delivering"
    assert advanced == set(range(AWAY_PARTITIONS)), "a partition's commits stopped landing"
    assert expired == 0, "a lease expired locally"
    assert moved == {}, "a lease moved"
    # Nothing moved, so a record comes twice only when its first delivery's ack did not get
    # through (seen under load: an ack cut by the client's channel being rebuilt when the
    # assigner came back, "ack failed; records will be redelivered"): never one whose ack
    # was accepted.
    acked_again = [ds for ds in result.duplicates.values() if any(d.acked for d in ds[:-1])]
    assert unexplained_duplicates(run.tally) == {}
    assert acked_again == [], acked_again[:3]


# ---- 2. a zombie fenced at Kafka --------------------------------------------------------

HELD_CLIENT = "held-app"


def hold_a_batch(addr: str, group: str) -> list[stream_pb2.Record]:
    """Records fetched from ``addr`` by a second client that does not ack them (yet)."""
    with grpc.insecure_channel(addr) as channel:
        stub = stream_pb2_grpc.StreamServiceStub(channel)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            request = stream_pb2.FetchRequest(client_id=HELD_CLIENT, group=group, max_records=20)
            request.max_wait.FromMilliseconds(500)
            records = list(stub.Fetch(request, timeout=10).records)
            if records:
                return records
    raise AssertionError("the zombie delivered nothing to the held client")


class LateAck(threading.Thread):
    """The held batch's ack, on its own thread: it blocks while the sidecar is stopped."""

    def __init__(self, addr: str, group: str, records: list[stream_pb2.Record]) -> None:
        super().__init__(daemon=True)
        self.addr, self.group, self.records = addr, group, records
        self.accepted = self.refused = 0
        self.reasons: set[str] = set()
        self.error: str | None = None

    def start(self) -> LateAck:
        super().start()
        return self

    def run(self) -> None:
        acks = [
            stream_pb2.RecordAck(
                topic=r.topic, partition=r.partition, offset=r.offset, lease_epoch=r.lease_epoch
            )
            for r in self.records
        ]
        try:
            with grpc.insecure_channel(self.addr) as channel:
                stub = stream_pb2_grpc.StreamServiceStub(channel)
                response = stub.Ack(
                    stream_pb2.AckRequest(client_id=HELD_CLIENT, group=self.group, acks=acks),
                    timeout=30,
                )
        except grpc.RpcError as err:
            self.error = f"{err.code().name}: {err.details()}"
            return
        self.accepted = response.acked_count
        self.refused = len(response.rejected_acks)
        self.reasons = {stream_pb2.RejectReason.Name(r.reason) for r in response.rejected_acks}


ZOMBIE_PARTITIONS = 6
STOP_AT_LEAST = 8.0  # seconds: well past TTL + grace
ASSIGNER_PAUSE = 2.0  # seconds: less than TTL + grace


@pytest.mark.timeout(420)
def test_sigstopped_zombie_is_fenced_at_kafka_and_commits_nothing_behind_the_new_holder(
    mesh: Mesh, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=ZOMBIE_PARTITIONS)
    run = LoadRun(
        mesh, topic, ZOMBIE_PARTITIONS, ("zombie", "survivor"), rate=200,
        sidecar_env=KAFKA_FENCED, assigner_env=own_state(),
    )  # fmt: skip
    run.start()
    commits = CommitWatcher(mesh.bootstrap, run.group, topic, ZOMBIE_PARTITIONS, interval=0.1)
    try:
        commits.start()
        time.sleep(3)
        before = run.stable()
        zombie_parts = {p for p, v in before.items() if v.holder == "zombie"}
        zombie_addr = run.endpoint_of("zombie")
        held = hold_a_batch(zombie_addr, run.group)
        run.sidecars["zombie"].signal(signal.SIGSTOP)
        stopped_at = time.monotonic()

        def moved_to_survivor(view: GroupView) -> bool:
            return all(
                view.leases[p].granted
                and view.leases[p].holder == "survivor"
                and view.leases[p].epoch > before[p].epoch
                for p in zombie_parts
            )

        moved_at, view = wait_until(run.addr, run.group, moved_to_survivor, timeout=30)
        time.sleep(max(0.0, stopped_at + STOP_AT_LEAST - time.monotonic()))
        # The held batch's ack, sent while the zombie is stopped: it waits in the socket
        # and is the first thing the zombie commits when it wakes up.
        late_ack = LateAck(zombie_addr, run.group, held).start()
        time.sleep(0.5)
        # The zombie wakes up cut off from the control plane (the assigner paused for less
        # than TTL + grace, so the survivor keeps its leases): no FENCED revoke reaches it
        # first, nothing but Kafka can stop its commit.
        assert run.assigner is not None
        run.assigner.signal(signal.SIGSTOP)
        run.sidecars["zombie"].signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        new_epochs = {p: view.leases[p].epoch for p in zombie_parts}
        late_ack.join(ASSIGNER_PAUSE)
        time.sleep(max(0.0, resumed_at + ASSIGNER_PAUSE - time.monotonic()))
        run.assigner.signal(signal.SIGCONT)
        late_ack.join(30)
        time.sleep(8)  # the zombie's commits, acks and session run again
        after = describe_retrying(run.addr, run.group)
    except BaseException:
        run.abort()
        commits.stop()
        raise
    result = run.finish()
    time.sleep(1.5)  # the survivor's last acks get committed
    commits.stop()
    final = committed(mesh.bootstrap, run.group, topic, ZOMBIE_PARTITIONS)
    zombie_log = run.sidecars["zombie"].log.read_text(errors="replace")
    refusals = [line for line in zombie_log.splitlines() if "lease commit refused by Kafka" in line]
    stalls = [line for line in zombie_log.splitlines() if "this sidecar was stalled" in line]

    # Commits: none by the zombie under its old epoch once the survivor committed or after
    # SIGCONT; never an offset or an epoch going back.
    bad_commits = zombie_commit_problems(
        commits,
        ZOMBIE_PARTITIONS,
        {p: before[p].epoch for p in zombie_parts},
        stopped_at,
        resumed_at,
    )
    final_wrong = final_commits_not_the_survivors(final, new_epochs)

    # Deliveries by the zombie under its old epoch that reached the client after SIGCONT:
    # none may have its ack accepted (its commit is refused by Kafka), and none may have
    # been asked for after SIGCONT: a sidecar that was stopped past what its leases outlast
    # delivers nothing of them until a commit verified them (stall_watch.py; CI, 2 Dec:
    # 351 records the survivor had had acked, handed out again by the woken zombie). What
    # arrives late was taken before the stop and sent after it.
    late = [
        d
        for d in run.tally.deliveries
        if d.sidecar == zombie_addr
        and d.partition in zombie_parts
        and d.epoch == before[d.partition].epoch
        and d.fetched_at >= resumed_at
    ]
    late_acked = [d for d in late if d.acked]
    asked_after = [d for d in late if d.requested_at >= resumed_at]
    # Duplicates: never a record whose ack was accepted before it was asked for again
    # (unexplained_duplicates); those first delivered by the zombie under its old epoch are
    # what it had delivered and not acked when it stopped. Others come from a partition
    # moved at the start (a grant revoked while its producer initialised fences the next
    # holder: docs/operate/failure-model.md, known gaps), also delivered and not acked.
    bad_dups = list(unexplained_duplicates(run.tally))
    unacked_dups = [
        seq
        for seq, ds in result.duplicates.items()
        if ds[0].sidecar == zombie_addr
        and ds[0].partition in zombie_parts
        and ds[0].epoch == before[ds[0].partition].epoch
        and not ds[0].acked
    ]
    print(
        f"SIGSTOP zombie (held {sorted(zombie_parts)}), commit_fencing kafka: moved to the "
        f"survivor with new epochs {new_epochs} after {moved_at - stopped_at:.2f}s; SIGCONT "
        f"after {resumed_at - stopped_at:.2f}s; holders after {holders(after.leases)}"
    )
    print(
        f"produced {len(result.produced)}, received {len(run.tally.received())}, lost "
        f"{len(result.missing)}, duplicates {result.duplicate_count}: {len(unacked_dups)} "
        f"delivered by the zombie before the stop and not acked, {len(bad_dups)} acked "
        f"before delivered again; zombie "
        f"deliveries after SIGCONT {len(late)} (asked for after it {len(asked_after)}, acks "
        f"accepted {len(late_acked)}); commits "
        f"refused by Kafka {len(refusals)}; bad commits {bad_commits}"
    )
    print(
        f"the held batch ({len(held)} records of {sorted({r.partition for r in held})}) acked "
        f"while the zombie was stopped: accepted {late_ack.accepted}, refused "
        f"{late_ack.refused} ({late_ack.reasons}), error {late_ack.error}"
    )
    for line in stalls[:1] + refusals[:2]:
        print(f"zombie: {line.strip()}")
    print(f"final commits of moved partitions: { {p: final[p].raw for p in zombie_parts} }")
    assert not result.errors, f"the application saw errors: {result.errors!r}"
    assert not result.missing, describe_missing(
        result.missing, ZOMBIE_PARTITIONS, producer=run.producer, tally=run.tally
    )
    assert zombie_parts, "the zombie held no partition"
    assert late_ack.accepted == 0, "an ack of the zombie was accepted after the move"
    assert refusals, "the zombie never tried to commit after SIGCONT (nothing shown refused)"
    assert all("_FENCED" in line for line in refusals), refusals[:3]
    assert not bad_commits, bad_commits
    assert not final_wrong, f"last commits not by the new owner's epoch: {final_wrong}"
    assert not late_acked, f"acks of the zombie accepted after SIGCONT: {late_acked[:5]}"
    assert stalls, "the woken zombie did not notice it had been stopped"
    assert not asked_after, f"the woken zombie delivered moved leases: {asked_after[:5]}"
    assert not bad_dups, {s: result.duplicates[s] for s in bad_dups[:5]}
