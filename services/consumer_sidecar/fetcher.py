"""The one Kafka consume loop of a sidecar, on its own thread.

It polls continuously, whatever the application does (so an infrequent caller can never
make Kafka kick anybody, ARCHITECTURE §1.2), buffers records per partition, and keeps memory
under the cap (backpressure): a full buffer holds consume() back for a moment, then pauses
partitions; one partition past its share of the buffer is paused. In leased mode
partitions are added and removed with ``incremental_assign``/``incremental_unassign`` —
never ``subscribe()``, so Kafka never rebalances a leased group. In ``kafka_group`` mode
(:mod:`services.consumer_sidecar.kafka_group_membership`) the assign() consumer is replaced by a
``subscribe()`` one whose rebalance callbacks run here, inside ``consume()``, and back
again when the group switches to leased mode. Every
consumer call happens on this thread (other threads hand it commands and wait on a future).
How long each poll() waits (busy, active, quiet), and when the loop parks instead (nobody
reads: it waits on its wake-up event, which a command or a reader sets, and takes what
librdkafka fetched every half second): :mod:`~services.consumer_sidecar.poll_timing`.
The commits are not made here: :mod:`~services.consumer_sidecar.offset_commits` makes them
(leased mode's on a commit thread of their own). The loop hands its committer what that
needs of it (its mode, its consumer, a way onto this thread), serves it between polls, and
asks it to initialise a ``commit_fencing: kafka`` lease's transactional id on a grant,
before the start offset is read.

Positions move back when records come due again (:meth:`Fetcher.rewind`: the partition
table says where) and forward only where Kafka forces it: in leased mode the consumer runs
with ``auto.offset.reset=error``, so a position that fell outside the log (records deleted
by retention before they were read, a truncated log) is an error here instead of a silent
jump; the loop moves to the log start (or end) itself and reports the offsets it skipped
(:attr:`FetcherEvents.on_gap`: ``ds_sidecar_offset_gaps_total`` and an ``OFFSET_GAP`` fault).

One job, why whole (about 610 lines): the consume loop and every call on its consumer. What
could leave has left (commits: offset_commits.py; poll waits: poll_timing.py; the
backpressure rule: fetch_backpressure.py; record conversion: reader.py); what stays is the
thread's own state (positions, pauses, the kafka_group consumer's swap), which every part
of the loop reads and writes on this one thread.
"""

from __future__ import annotations

import asyncio
import functools
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from services.consumer_sidecar import fetch_backpressure, poll_timing
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.events import FetcherEvents
from services.consumer_sidecar.offset_commits import OffsetCommitter
from services.consumer_sidecar.partitions import UNLEASED_EPOCH, PartitionTable
from services.consumer_sidecar.runs import runs_from_messages
from services.runtime import commitmeta
from services.runtime.topic_partition import TP

if TYPE_CHECKING:
    from services.consumer_sidecar.kafka_group_membership import ClassicMembership

log = structlog.get_logger(__name__)
R = TypeVar("R")

# Leaving kafka_group mode: how long Kafka may take to revoke the partitions after
# unsubscribe(), beyond the time the revoke callback drains in-flight acks.
UNSUBSCRIBE_SECONDS = 10.0
RESET_RETRY_SECONDS = 1.0  # a position out of range whose watermarks could not be read
WATERMARK_TIMEOUT_SECONDS = 5.0
WARM_UP_TIMEOUT_SECONDS = 5.0  # warm_up's committed(): the first grants' assign waits for it
# Errors that mean the fetch position is outside the partition's log (auto.offset.reset
# is "error"): the partition stops fetching until it is given a position again.
_OUT_OF_RANGE_ERRORS = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError._LOG_TRUNCATION})


class Fetcher:
    def __init__(
        self,
        consumer: Consumer,
        table: PartitionTable,
        commits: OffsetCommitter,
        *,
        batch: int,
        on_data: Callable[[], None],
        on_error: Callable[[KafkaError], None] | None = None,
        prefetch_bytes: int = 0,
        events: FetcherEvents | None = None,
        last_read: Callable[[], float] | None = None,
    ) -> None:
        """``commits``: the committer of this sidecar's offsets; this loop hands it what it
        needs of the fetch thread (kafka_group mode's commits run here) and serves it
        between polls. ``events``: what the loop reports (all on this thread).
        ``last_read``: when somebody last read records here (``inf``: somebody reads now;
        :meth:`DataSignal.last_read <services.consumer_sidecar.serving.DataSignal.last_read>`);
        the loop parks once nobody read for a while (None: it never parks)."""
        self._consumer = consumer
        self._commits = commits
        self._table = table
        self._batch = batch
        self._on_data = on_data
        self._on_error = on_error
        self._events = events or FetcherEvents()
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-fetch", daemon=True)
        # Wakes the loop while it holds consumption back: a delivery made room, or a command.
        self._wake = threading.Event()
        table.on_room = self._wake.set
        self._last_read = last_read or (lambda: math.inf)
        self._parked = False  # waiting on _wake instead of in poll() (poll_timing.park_seconds)
        self._set_prefetch(prefetch_bytes)
        self.last_poll = time.monotonic()
        self.classic = False  # True once subscribe()d (kafka_group mode)
        self.subscribed = False  # kafka_group mode: the consumer of now is subscribe()d
        # Every topic this consumer was ever given: with one, records need no topic lookup.
        self._topics: set[str] = set()
        self._full_since: float | None = None  # leased mode: since when the buffer is full
        # Leased mode: where a position outside the log goes (the configured
        # auto.offset.reset: the log start, or with latest/largest/end its end).
        self.reset_to_end = False
        self._resets: dict[TP, int] = {}  # out-of-range positions still to move
        self._resets_retry_at = 0.0
        commits.attach(self)

    # ---- API for other threads --------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and close its consumer. Stop the committer first
        (:meth:`OffsetCommitter.stop`): a commit it runs here in kafka_group mode still has
        the loop."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def reader_came(self) -> None:
        """Any thread: somebody reads records here (a Fetch, a Stream opened). A parked loop
        polls again at once; one polling already is not disturbed."""
        if self._parked:
            self._wake.set()

    def call(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on the fetch thread (between polls); a future of its result."""
        future: Future[R] = Future()
        self._commands.put((functools.partial(fn, *args), future))
        self._wake.set()
        return future

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.wrap_future(self.call(fn, *args))

    @property
    def consumer(self) -> Consumer:
        """The fetch consumer of now (fetch thread only: kafka_group mode commits with it)."""
        return self._consumer

    def assign(self, starts: dict[TP, int]) -> dict[TP, int]:
        """Fetch thread: start fetching each partition at its start offset (<0 = the group's
        committed offset, else the earliest). One committed() round trip for the batch.
        Returns the offset each partition starts from."""
        resolved = dict(starts)
        self._commits.open_leases(starts)  # commit_fencing: kafka: before committed()
        # One committed() round trip for all: the offsets where none was given, and for
        # every partition the metadata with what the previous owner acked above it.
        preacked: dict[TP, tuple[tuple[int, int], ...]] = {}
        queried = [TopicPartition(tp.topic, tp.partition) for tp in starts]
        for found in self._consumer.committed(queried, timeout=10) if queried else []:
            tp = TP(str(found.topic), int(found.partition or 0))
            committed = int(found.offset if found.offset is not None else -1)
            if resolved[tp] < 0:
                resolved[tp] = committed
            meta = commitmeta.decode(found.metadata, committed)
            if meta is not None and meta.acked and committed >= 0 and resolved[tp] == committed:
                preacked[tp] = meta.acked
        for tp, offset in resolved.items():
            if offset < 0:
                low, _high = self._consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10
                )
                resolved[tp] = low if low >= 0 else OFFSET_BEGINNING
        # Ready *before* fetching starts: this thread appends the first records as soon as
        # consume() returns them, and a partition that is not ready drops them.
        assigned: dict[TP, int] = {}
        with self._table.lock:
            for tp, offset in resolved.items():
                part = self._table.partitions.get(tp)
                if part is None or part.revoking or part.ready:
                    continue  # revoked or expired while the offsets were looked up
                part.acks = PartitionAcks(offset, preacked=preacked.get(tp, ()))
                part.position = offset
                part.committed = offset
                part.ready = True
                assigned[tp] = offset
        ktps = [TopicPartition(tp.topic, tp.partition, offset) for tp, offset in assigned.items()]
        self._topics.update(tp.topic for tp in assigned)
        current = self._assignment()
        if stale := [TopicPartition(tp.topic, tp.partition) for tp in assigned if tp in current]:
            # Left over from an earlier epoch of this sidecar (a suspended lease the assigner
            # granted back under a new epoch): incremental_assign refuses a partition already
            # assigned (_CONFLICT), so start over at the new start offset.
            self._consumer.incremental_unassign(stale)
        if ktps:
            self._consumer.incremental_assign(ktps)
            # librdkafka keeps a partition's pause flag across unassign/assign: a partition
            # paused (backpressure, suspension) and later granted back would never fetch.
            self._consumer.resume(ktps)
        return assigned

    def warm_up(self, topics: list[str]) -> None:
        """Fetch thread: before any partition is granted here, find the group's coordinator
        (one committed() round trip) and read the topics' metadata (list_topics: their
        leaders, into librdkafka's cache), so that a fresh consumer's first grants need
        neither. Measured on a sidecar returning under ``hold_mode: handoff``: its first
        assign's committed() took 0.7 s, the next one 0.05 s; and on a fresh consumer
        (one broker, 2 shared cores) committed() 0.25-0.55 s cold vs 0.003-0.06 s after the
        lookup, assign to first records 0.41-0.56 s without the metadata vs 0.05-0.17 s
        with it. The handed-back partitions waited for both. Best effort: a failure is
        left to the assign."""
        if not topics or self.classic:
            return
        try:
            self._consumer.committed(
                [TopicPartition(topic, 0) for topic in topics], timeout=WARM_UP_TIMEOUT_SECONDS
            )
            for topic in topics:
                self._consumer.list_topics(topic, timeout=WARM_UP_TIMEOUT_SECONDS)
        except KafkaException as exc:
            log.info("warm-up before the first grants failed", error=str(exc))

    def suspend(self, tp: TP) -> None:
        """Fetch thread: a suspended lease (local deadline passed) stops fetching and is
        rewound to its delivery cursor (its first due record, else its first undelivered
        one), so the dropped buffer is fetched again if the lease is renewed. Runs in order
        with :meth:`resume` (same thread, FIFO)."""
        with self._table.lock:
            part = self._table.partitions.get(tp)
            if part is None or part.suspended_at is None:
                return
            part.rewinding = False  # the suspension rewinds it
            offset = part.acks.rewind()
            part.position = offset
        ktp = TopicPartition(tp.topic, tp.partition, offset)
        self._consumer.pause([ktp])
        self._seek(ktp)

    def rewind(self, tp: TP) -> None:
        """Fetch thread: records of ``tp`` came due below its delivery cursor: drop its
        buffer and fetch again from the first of them (:meth:`PartitionTable.rewind`).
        Runs between consume() calls, so nothing fetched from the old position is buffered
        after it (seek discards librdkafka's prefetched records)."""
        offset = self._table.rewind(tp)
        if offset is None:
            return
        log.debug(
            "re-reading records due again", topic=tp.topic, partition=tp.partition, offset=offset
        )
        part = self._table.get(tp)
        if part is None or part.suspended_at is not None:
            return  # suspended: the position is set; resume() fetches from it
        self._seek(TopicPartition(tp.topic, tp.partition, offset))

    def _seek(self, ktp: TopicPartition) -> None:
        """Move a partition's fetch position; one that is not fetching at all (librdkafka
        refuses to seek it) is assigned again at the position, its pause kept."""
        try:
            self._consumer.seek(ktp)
        except KafkaException as exc:
            log.info("seek refused; assigning again", partition=ktp.partition, error=str(exc))
            self._reassign(ktp)

    def _reassign(self, ktp: TopicPartition) -> None:
        tp = TP(str(ktp.topic), int(ktp.partition or 0))
        if tp in self._assignment():
            self._consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])
        self._consumer.incremental_assign([ktp])
        part = self._table.get(tp)
        if part is not None and (part.paused or part.suspended_at is not None):
            self._consumer.pause([ktp])
        else:
            self._consumer.resume([ktp])  # librdkafka keeps the pause flag across assigns

    def restart(self, tp: TP, offset: int) -> None:
        """Fetch thread: forget what ``tp`` buffered and has in flight and fetch it from
        ``offset`` (:meth:`PartitionTable.restart`); acks of records delivered before are
        refused from now on."""
        part = self._table.get(tp)
        if part is None or not part.ready:
            return
        self._table.restart(part, offset)
        self._seek(TopicPartition(tp.topic, tp.partition, offset))

    def resume(self, tp: TP) -> None:
        """Fetch thread: the lease was renewed: clear the suspension, fetch again."""
        with self._table.lock:
            part = self._table.partitions.get(tp)
            if part is None:
                return
            part.suspended_at = None
            part.paused = False
        self._consumer.resume([TopicPartition(tp.topic, tp.partition)])

    def unassign(self, tp: TP) -> None:
        """Fetch thread: stop fetching ``tp`` (a no-op when it is not assigned), and end
        its lease producer (commit_fencing: kafka)."""
        self._commits.close_lease(tp)
        if tp in self._assignment():
            self._consumer.incremental_unassign([TopicPartition(tp.topic, tp.partition)])

    def _assignment(self) -> set[TP]:
        return {TP(str(k.topic), int(k.partition or 0)) for k in self._consumer.assignment()}

    def _set_prefetch(self, prefetch_bytes: int) -> None:
        # Held back, librdkafka keeps up to ``prefetch_bytes`` (queued.max.messages.kbytes)
        # prefetched: holding starts that much below the cap (PartitionTable.hold_at).
        self._table.prefetch_bytes = prefetch_bytes

    def replace_consumer(self, config: dict[str, Any]) -> int:
        """Fetch thread, leased mode: a group config change librdkafka cannot apply to a
        running consumer (it can apply none). The new consumer takes over every partition
        the old one fetches, each at the next offset the buffer has not got yet, paused if
        it was (backpressure, a suspended lease); then the old one is closed. The buffer,
        what is in flight and the acks stay as they are (they are the table's, not the
        consumer's), and commits go through the commit consumer meanwhile: nothing is
        delivered twice or skipped, no lease changes, and clients never notice. Whatever
        the old consumer had prefetched beyond the buffer is fetched again. A config
        librdkafka refuses raises KafkaException here, with nothing changed. Returns how
        many partitions moved over."""
        consumer = Consumer(config)
        try:
            starts: list[TopicPartition] = []
            paused: list[TopicPartition] = []
            with self._table.lock:
                for tp in sorted(self._assignment()):
                    part = self._table.partitions.get(tp)
                    if part is None or part.revoking or not part.ready:
                        continue  # being given up: its unassign() finds nothing to do
                    ktp = TopicPartition(tp.topic, tp.partition, part.position)
                    starts.append(ktp)
                    if part.paused or part.suspended_at is not None:
                        paused.append(ktp)
            if starts:
                consumer.incremental_assign(starts)
            if paused:
                consumer.pause(paused)
        except BaseException:
            consumer.close()
            raise
        old, self._consumer = self._consumer, consumer
        self._set_prefetch(int(config.get("queued.max.messages.kbytes", 0)) * 1024)
        old.close()
        return len(starts)

    def resubscribe(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        """Fetch thread, kafka_group mode: a new subscribe()d consumer for a changed group
        config. The old member hands its partitions back as on a revoke (stop delivering,
        drain in-flight acks, commit them) and closes; a static member sends no LeaveGroup,
        so the new consumer joins under the same ``group.instance.id`` in its place and
        Kafka gives the partitions back starting at the commits. A config librdkafka
        refuses raises KafkaException before anything is handed back."""
        consumer = Consumer(config)
        membership.release_all()
        old, self._consumer = self._consumer, consumer
        self.subscribed = False
        self._commits.forget_deferred()  # the partitions were just committed and handed back
        old.close()
        self._subscribe(consumer, topics, membership)

    def _subscribe(
        self, consumer: Consumer, topics: list[str], membership: ClassicMembership
    ) -> None:
        membership.subscribing()
        consumer.subscribe(
            topics,
            on_assign=membership.on_assign,
            on_revoke=membership.on_revoke,
            on_lost=membership.on_lost,
        )
        self.subscribed = True

    def use_classic(
        self, config: dict[str, Any], topics: list[str], membership: ClassicMembership
    ) -> None:
        """Fetch thread: kafka_group mode. Replace the (idle) assign() consumer by one that
        subscribe()s to ``topics``; Kafka's rebalances reach ``membership`` on this thread."""
        consumer = Consumer(config)
        self._topics.update(topics)
        if any(t.startswith("^") for t in topics):
            self._topics.add("^")  # a pattern may match several topics: always look them up
        try:
            self._subscribe(consumer, topics, membership)
        except Exception:
            consumer.close()
            raise
        old, self._consumer = self._consumer, consumer
        self.classic = True
        old.close()

    def use_assign(self, config: dict[str, Any], membership: ClassicMembership) -> list[TP]:
        """Fetch thread: back from kafka_group mode to leased mode. unsubscribe() makes
        Kafka revoke every partition (``membership`` drains, commits and forgets each,
        inside the consume() calls here) and the member leave the group — at once, static
        membership included (librdkafka skips the LeaveGroup of a static member only when
        it closes). Then a fresh assign() consumer takes over. Returns the partitions that
        were dropped without a revoke (Kafka did not answer in time): their unacked records
        are delivered again."""
        consumer = self._consumer
        consumer.unsubscribe()
        deadline = time.monotonic() + membership.drain_timeout + UNSUBSCRIBE_SECONDS
        while time.monotonic() < deadline:
            messages = consumer.consume(self._batch, poll_timing.POLL_TIMEOUT_SECONDS)
            self.last_poll = time.monotonic()
            if messages:
                self._buffer(messages)  # partitions not yet revoked still deliver
            if not consumer.assignment() and not self._table.snapshot():
                break
        dropped = [p.tp for p in self._table.snapshot() if p.epoch == UNLEASED_EPOCH]
        for tp in dropped:
            self._table.remove(tp)
        self._consumer = Consumer(config)
        self.classic = False
        self._commits.forget_deferred()
        consumer.close()
        return dropped

    # ---- the loop ---------------------------------------------------------------------

    def _run(self) -> None:
        busy_until = 0.0
        quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
        try:
            while not self._stop.is_set():
                if self._run_commands():
                    busy_until = self.last_poll + poll_timing.BUSY_SECONDS
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                self._events.on_loop(self.last_poll)
                self._table.alive(time.monotonic())  # a stall of the process shows here
                if self._holding():
                    self._wake.wait(poll_timing.POLL_TIMEOUT_SECONDS)
                    self._wake.clear()
                    self.last_poll = time.monotonic()  # alive, holding back on purpose
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                    continue
                if self._commits.deferred or self._resets:
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS  # retries are due soon
                poll_started = time.monotonic()
                if self._park(poll_started, busy_until):
                    timeout = 0.0  # what librdkafka fetched meanwhile, and its callbacks
                else:
                    timeout = poll_timing.poll_timeout(poll_started, busy_until, quiet_at)
                # Parked, the park counts as the poll's wait (ds_sidecar_poll_wait_seconds).
                messages = self._take(timeout)
                self.last_poll = time.monotonic()
                self._events.on_poll(poll_started, self.last_poll)
                if messages:
                    quiet_at = self.last_poll + poll_timing.QUIET_SECONDS
                    if self._commits.on_fetch_thread:
                        busy_until = self.last_poll + poll_timing.BUSY_SECONDS
                    self._buffer(messages)
                self._apply_backpressure()
                self._commits.between_polls(self.last_poll)
                if self._resets and self.last_poll >= self._resets_retry_at:
                    self._resets_retry_at = self.last_poll + RESET_RETRY_SECONDS
                    self._move_out_of_range()
        except Exception:
            log.exception("fetch loop crashed")
            raise
        finally:
            self._run_commands()
            self._consumer.close()

    def _park(self, now: float, busy_until: float) -> bool:
        """Leased mode, nobody reading: wait on the wake-up event instead of in poll()
        (:func:`~services.consumer_sidecar.poll_timing.park_seconds`), until a command, a
        reader (:meth:`reader_came`), room in the buffer or the park's end. False (poll as
        usual) when somebody reads, a command came lately, or work waits on this thread:
        kafka_group mode (rebalances run in consume(); ``max.poll.interval.ms``), commits
        made here, a deferred commit or an out-of-range position to retry."""
        commits = self._commits
        if self.classic or commits.on_fetch_thread or commits.deferred or self._resets:
            return False
        self._parked = True  # before last_read(): a reader that comes now sees it and wakes us
        try:
            wait = poll_timing.park_seconds(
                now, busy_until, self._last_read(), self._table.stall.limit
            )
            if wait is None:
                return False
            self._wake.wait(wait)
        finally:
            self._parked = False
        self._wake.clear()  # a command queued meanwhile runs next turn (the queue is read)
        return True

    def _take(self, timeout: float) -> list[Message]:
        """The records librdkafka has for us: waits up to ``timeout`` for the first one
        only. consume(num, timeout) returns once it has ``num`` records or the timeout
        passed (librdkafka fills the batch), which held each record that arrived while the
        loop waited for up to the timeout (2 ms busy, 50 ms idle: at 1,000 records/s every
        record). poll() returns as the first arrives; consume(num, 0) then takes what else
        is queued without waiting."""
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        if self._batch == 1:
            return [first]
        return [first, *self._consumer.consume(self._batch - 1, 0)]

    def _run_commands(self) -> bool:
        """Run the queued commands; True if there were any."""
        ran = False
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return ran
            ran = True
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _buffer(self, messages: list[Message]) -> None:
        """Buffer a consume() batch as one column chunk per partition run (runs.py)."""
        only = next(iter(self._topics)) if len(self._topics) == 1 else None
        runs, failed = runs_from_messages(messages, only)
        for msg in failed:
            error = msg.error()
            if error is None:
                continue
            if self._on_error is not None:
                self._on_error(error)
            if error.code() in _OUT_OF_RANGE_ERRORS and msg.topic() is not None:
                self._out_of_range(TP(str(msg.topic()), int(msg.partition() or 0)), msg.offset())
        added = False
        for run in runs:
            chunk = run.chunk
            tp = TP(run.topic, run.partition)
            self._events.on_consumed(run.topic, len(chunk), len(chunk.values) + len(chunk.keys))
            stamps = chunk.timestamps
            self._events.on_fetched(tp, self.last_poll, stamps[0] if stamps else -1)
            if self._table.append(tp, run.chunk):
                added = True
        if added:
            self._on_data()

    def _out_of_range(self, tp: TP, offset: int | None) -> None:
        """A partition's position is outside its log: it stopped fetching (librdkafka's
        ``auto.offset.reset=error``). Move it (now, or retried while Kafka cannot say
        where its log starts and ends)."""
        part = self._table.get(tp)
        if part is None or not part.ready or self.classic:
            return
        self._resets[tp] = offset if offset is not None and offset >= 0 else part.position
        self._resets_retry_at = 0.0
        self._move_out_of_range()

    def _move_out_of_range(self) -> None:
        """Fetch thread: each partition whose position fell outside its log goes on from
        the log start (records deleted before they were read: a gap), or from the log end
        when the log was truncated below the position or the configured reset says so."""
        for tp, offset in list(self._resets.items()):
            part = self._table.get(tp)
            if part is None or not part.ready or part.revoking:
                del self._resets[tp]
                continue
            ktp = TopicPartition(tp.topic, tp.partition)
            try:
                low, high = self._consumer.get_watermark_offsets(
                    ktp, timeout=WATERMARK_TIMEOUT_SECONDS, cached=False
                )
            except KafkaException as exc:
                log.warning("position out of range; log bounds unknown, retrying", error=str(exc))
                continue
            del self._resets[tp]
            if low <= offset <= high:
                target = offset  # in range again (a leader change): no gap
            elif offset > high or self.reset_to_end:
                target = high
            else:
                target = low
            if target > offset:
                self._events.on_gap(tp, offset, target, "retention" if offset < low else "reset")
            elif target < offset:
                self._events.on_gap(tp, target, offset, "truncated")
            if target < part.acks.next_offset:
                self._table.restart(part, target)  # offsets reused below what was delivered
            else:
                with self._table.lock:
                    part.position = target
            self._reassign(TopicPartition(tp.topic, tp.partition, target))

    def _holding(self) -> bool:
        """Leased mode, buffer full: hold consume() back for up to HOLD_SECONDS rather than
        pause every partition at once. pause() drops what librdkafka prefetched, and a
        resumed partition delivered again only after 300+ ms: under a backlog the buffer
        ran dry at every resume. Held back, librdkafka's own queue
        (``queued.max.messages.kbytes``) bounds its prefetching, and consumption goes on the
        moment a delivery makes room. Full for longer (a slow application), partitions are
        paused as before, so that consume() serves statistics (lag) and errors again.
        kafka_group mode never holds back: it must keep polling (``max.poll.interval.ms``)."""
        table = self._table
        if self.classic or table.buffered_bytes < table.hold_at:
            self._full_since = None
            table.holding = False
            return False
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        was = table.holding
        table.holding = fetch_backpressure.still_holding(self._full_since, now)
        if table.holding and not was:
            table.on_backpressure()
        return table.holding

    def _apply_backpressure(self) -> None:
        """Pause and resume partitions as :mod:`~services.consumer_sidecar.fetch_backpressure`
        decides."""
        table = self._table
        cap = table.per_partition_cap(fetch_backpressure.partition_share(self.classic))
        over_total = fetch_backpressure.over_total(
            classic=self.classic,
            buffered=table.buffered_bytes,
            leased_cap=table.leased_cap,
            hold_at=table.hold_at,
            full_since=self._full_since,
            holding=table.holding,
        )
        to_pause: list[TopicPartition] = []
        to_resume: list[TopicPartition] = []
        for part in table.snapshot():
            if part.suspended_at is not None or not part.ready:
                continue  # paused by the lease keeper, not by backpressure
            change = fetch_backpressure.pause_change(
                paused=part.paused, buffered=part.buffered_bytes, cap=cap, over_total=over_total
            )
            if change is None:
                continue
            part.paused = change
            (to_pause if change else to_resume).append(
                TopicPartition(part.tp.topic, part.tp.partition)
            )
        if to_pause:
            self._consumer.pause(to_pause)
            table.on_backpressure()
        if to_resume:
            self._consumer.resume(to_resume)
