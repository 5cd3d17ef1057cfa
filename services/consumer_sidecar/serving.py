"""What StreamService serves from: the narrow view of the sidecar its servicer is given.

The servicer (``rpc.py``) and the modules it hands the RPCs to (``fetch_rpc.py``,
``ack_rpcs.py``, ``stream_rpc.py``, ``range_rpcs.py``, ``status_rpc.py``) validate requests,
map them onto this object and map its answers to responses and statuses; they never see the
sidecar's wiring (the session, the fetcher, the settings, ``SidecarApp``). :class:`Serving`
covers exactly what the RPCs need:

* delivery from the :class:`PartitionTable` (take, auto-ack) and the event that records
  were buffered (:class:`DataSignal`: notified on the fetch thread, awaited by Fetch and
  Stream);
* acks, nacks, commits, redelivery and the lease clock of the :class:`LeaseKeeper`;
* what ReadRange gave each client (:class:`RangeReads`), to which explicit commits are bound;
* the held partitions and the buffer, for ReadRange's lease checks and Status, and the
  :class:`ReadBudget` ReadRange streams reserve their memory from (off the buffer's cap);
* who this sidecar is (its group and id), whether it has joined the assigner, and the
  consumer configuration Status shows, with the version of the group's config that runs.

So the RPCs are tested in-process against a real table and keeper, with no process around
them (``tests/unit/sidecar/test_stream_rpc.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from dataservice.sidecar.v1 import stream_pb2
from dsclient.records.batches import Slice
from services.consumer_sidecar.acks import Holder
from services.consumer_sidecar.lease_checks import Problem, lease_problem
from services.consumer_sidecar.lease_commits import CommitOutcome, ExplicitCommit
from services.consumer_sidecar.leasing import LeaseKeeper
from services.consumer_sidecar.partitions import Partition, PartitionTable, Redelivery
from services.consumer_sidecar.range_reads import RangeReads
from services.consumer_sidecar.read_budget import ReadBudget, Refusal
from services.runtime.topic_partition import TP


class DataSignal:
    """Records can be taken (buffered, or due again): notified on any thread, awaited on
    the event loop. Fetch waits on the shared :attr:`event`; each Stream on an event of
    its own (:meth:`add_waiter`), which no other stream clears: a shared one cleared by one
    stream could hide the records from another, which therefore looked again every 0.5 s
    (an idle Stream woke twice a second, issue 34). It also knows when somebody last read
    (:meth:`last_read`): the fetch loop of a sidecar nobody reads from parks."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.event = asyncio.Event()
        self._waiters: set[asyncio.Event] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a _set is queued on the loop and has not run yet
        self._clock = clock
        self._read_at = -math.inf  # the last Fetch (a Stream reads for as long as it is open)
        # Somebody reads (a Fetch, a Stream opened): the fetch loop, if parked, polls again
        # (app.py: Fetcher.reader_came).
        self.on_read: Callable[[], None] = lambda: None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the RPCs run on; until it is bound, :meth:`notify` does nothing."""
        self._loop = loop

    def notify(self) -> None:
        """Set the events, from any thread. Notifies made before the loop ran the last
        one's callback go with it: one wake-up of the loop (a byte on its self-pipe) per
        loop turn, not per fetched batch."""
        if self._loop is not None and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        self._scheduled = False  # before the events: a notify from now on schedules anew
        self.event.set()
        for waiter in self._waiters:
            waiter.set()

    def add_waiter(self, event: asyncio.Event) -> None:
        """Set ``event`` (the caller's own) at each notify until it is dropped (:meth:`drop`).
        A Stream's: it reads for as long as it is open (:meth:`last_read`)."""
        self._waiters.add(event)
        self.on_read()

    def drop(self, waiter: asyncio.Event) -> None:
        self._waiters.discard(waiter)
        self._read_at = self._clock()

    def read(self) -> None:
        """A Fetch came (whether it finds records or waits for them)."""
        self._read_at = self._clock()
        self.on_read()

    def last_read(self) -> float:
        """When somebody last read here: ``inf`` while a Stream is open (any thread: the
        fetch loop parks when nobody read for a while, poll_timing.park_seconds)."""
        return math.inf if self._waiters else self._read_at


class Serving:
    def __init__(
        self,
        table: PartitionTable,
        keeper: LeaseKeeper,
        data: DataSignal,
        *,
        group: str,
        sidecar_id: str,
        connected: Callable[[], bool],
        consumer_config: Callable[[], dict[str, str]],
        config_version: Callable[[], int] = lambda: 0,
        read_budget: ReadBudget | None = None,
    ) -> None:
        self.group = group
        self.sidecar_id = sidecar_id
        self._table = table
        self._keeper = keeper
        self._connected = connected
        self._consumer_config = consumer_config
        self._config_version = config_version
        self._range_reads = RangeReads()
        # By default as the sidecar's settings default: 4 streams, half the cap.
        self.read_budget = read_budget or ReadBudget(4, table.buffer_max_bytes // 2)
        # Set when records were buffered; Fetch and Stream clear it before they look.
        self.data_ready = data.event
        self.data = data

    # ---- the session ------------------------------------------------------------------

    def connected(self) -> bool:
        """The session to the assigner is up."""
        return self._connected()

    def has_joined(self) -> bool:
        """Something can be served: the session is up, or partitions are still held (a
        broken session keeps serving its leases until their local deadlines)."""
        return self._connected() or bool(self._table.snapshot())

    # ---- delivery ---------------------------------------------------------------------

    def take(self, max_records: int, max_bytes: int, holder: Holder) -> list[Slice]:
        """Up to the limits from live partitions, fairly, marked delivered to ``holder``
        (in flight until acked, nacked, released or past the visibility timeout)."""
        return self._table.take(max_records, max_bytes, holder)

    def holds_at_least(self, records: int, max_bytes: int) -> bool:
        """Whether a whole batch of these limits is buffered (a Stream's linger ends)."""
        return self._table.holds_at_least(records, max_bytes)

    def written(self, slices: list[Slice]) -> None:
        """auto_ack: these slices were written to the client: they count as acked, and
        the commit loop commits them soon (nothing waits for it)."""
        self._table.ack_slices(slices)
        self._keeper.committer.request_commit()

    def not_sent(self, slices: list[Slice]) -> None:
        """A response that took these slices never reached the client: deliver them again."""
        self._keeper.redeliverer.not_sent(slices)

    def release(self, holder: Holder) -> None:
        """``holder`` (a stream) ended: what it received and did not ack comes again."""
        self._keeper.redeliverer.release_holder(holder)

    @property
    def redelivery(self) -> Redelivery:
        """The group's redelivery policy in effect (visibility timeout, delivery limit)."""
        return self._table.redelivery

    # ---- acks and commits -------------------------------------------------------------

    def ack(self, ack: stream_pb2.RecordAck, client: str) -> stream_pb2.RejectedAck | None:
        """Apply one record ack from ``client``; why it is refused, or None
        (:meth:`LeaseKeeper.ack`)."""
        return self._keeper.ack(ack, client)

    def ack_range(
        self, ack: stream_pb2.RangeAck, client: str
    ) -> stream_pb2.RejectedRangeAck | None:
        """Apply one range ack from ``client``; why it is refused, or None
        (:meth:`LeaseKeeper.ack_range`)."""
        return self._keeper.ack_range(ack, client)

    async def commit_acked(self, touched: dict[TP, tuple[Partition, int]]) -> dict[TP, Problem]:
        """Make the acks applied so far durable; the partitions of ``touched`` whose acks
        could not be (refuse them), or ``DsError`` KAFKA_UNAVAILABLE when Kafka refused."""
        return await self._keeper.committer.commit_acked(touched)

    def nack_range(
        self, topic: str, partition: int, epoch: int, lo: int, hi: int, client: str, delay: float
    ) -> tuple[Problem | None, int]:
        """``client``'s records of [lo, hi) given back (:meth:`LeaseKeeper.nack_range`)."""
        return self._keeper.nack_range(topic, partition, epoch, lo, hi, client, delay)

    def nack_all(self, client: str, delay: float) -> int:
        """Every record of ``client`` in flight here given back; how many."""
        return self._keeper.nack_all(client, delay)

    def range_given(self, tp: TP, epoch: int, client: str, start: int, next_offset: int) -> None:
        """ReadRange sent ``client`` the records of ``tp`` in ``[start, next_offset)`` under
        ``epoch`` (:meth:`RangeReads.given`): what it may commit past."""
        self._range_reads.given(tp, epoch, client, start, next_offset)

    async def commit_offsets(
        self, commits: list[ExplicitCommit], client: str
    ) -> list[CommitOutcome]:
        """``client``'s explicit commits, each fenced by its lease epoch and bound to what
        ReadRange gave ``client`` under it from the partition's committed offset on
        (:meth:`RangeReads.commit_problem`: no unread record skipped, none backward);
        outcomes in their order. A commit the lease refuses is answered with the lease's reason (the
        keeper's), so a stale epoch stays STALE_EPOCH whoever asks."""
        now = self._keeper.clock()
        outcomes: dict[int, CommitOutcome] = {}
        passed: list[tuple[int, ExplicitCommit]] = []
        for index, commit in enumerate(commits):
            part = self._table.get(commit.tp)
            if part is not None and lease_problem(part, now, commit.epoch) is None:
                problem = self._range_reads.commit_problem(
                    commit.tp, commit.epoch, client, commit.offset, part.committed
                )
                if problem is not None:
                    outcomes[index] = CommitOutcome(commit, *problem)
                    continue
            passed.append((index, commit))
        results = await self._keeper.committer.commit_offsets([c for _, c in passed])
        for (index, _), outcome in zip(passed, results, strict=True):
            outcomes[index] = outcome
        return [outcomes[i] for i in range(len(commits))]

    # ---- the held partitions ----------------------------------------------------------

    def partition(self, tp: TP) -> Partition | None:
        """The table's entry for ``tp``, if this sidecar holds it (in any state)."""
        return self._table.get(tp)

    def partitions(self) -> list[Partition]:
        return self._table.snapshot()

    def now(self) -> float:
        """The lease clock (monotonic seconds), against which deadlines are compared."""
        return self._keeper.clock()

    def reserve_read(self, nbytes: int) -> Refusal | None:
        """Open a ReadRange stream that may hold ``nbytes``: why not, or None, and then
        the leased buffer's share is smaller by ``nbytes`` until :meth:`release_read`."""
        refusal = self.read_budget.reserve(nbytes)
        if refusal is None:
            self._table.reserved_bytes = self.read_budget.reserved
        return refusal

    def release_read(self, nbytes: int) -> None:
        """A ReadRange stream that reserved ``nbytes`` ended: the leased buffer has room
        again (a fetch thread holding back on a full buffer is woken)."""
        self.read_budget.release(nbytes)
        self._table.reserved_bytes = self.read_budget.reserved
        if self._table.holding:
            self._table.on_room()

    @property
    def buffered_bytes(self) -> int:
        return self._table.buffered_bytes

    @property
    def buffer_cap_bytes(self) -> int:
        return self._table.buffer_max_bytes

    def consumer_config(self) -> dict[str, str]:
        """The effective librdkafka configuration, secrets masked (Status)."""
        return self._consumer_config()

    def config_version(self) -> int:
        """The version of the group's config that runs (0: none applied yet)."""
        return self._config_version()
