"""Relays: move outbox items to their destinations, in order, exactly once.

The webhook relay keeps each destination's order and nothing more: every round it tries
the oldest item of each destination not backing off, so one failing destination delays
no other; a destination that has spent its retry budget has what waits for it
dead-lettered in bulk (``webhook_budget.py``, issue 37), and the outbox bounds each
destination's pending items.

``KafkaRelay`` (one thread) publishes the ``kafka`` lane with an idempotent producer
(``acks=all``, ``message.timeout.ms=0``: librdkafka retries forever while Kafka is down,
and its idempotence keeps order and drops retry duplicates within a producer session).
An item is deleted from the outbox only after Kafka confirmed it. Two things could still
publish an item twice: the notifier dying after Kafka stored an item but before the outbox
forgot it, and a producer that had to be replaced after an uncertain failure. Both are
closed by *reconciliation*, run before publishing starts and after every uncertain
failure: read the destination topics from the creation time of the oldest pending item to
their end, and drop from the outbox every pending item whose id (header ``ds-id``) is
already there. Kafka is the record of what was published; the outbox of what is still due.

``WebhookRelay`` (another thread) POSTs the ``webhook`` lane: at-least-once (the receiver
dedupes on the ``X-DS-Id`` header), in order per URL, a failing URL backing off
without holding back the others. Each POST is checked against the egress policy first and
goes to an address that check passed (``egress.py``, ``webhook.py``); no redirect is
followed. Webhook URLs are logged redacted (they often carry a secret).

Whatever a destination refuses for good goes to the outbox's dead-letter table, so it
never holds back what follows it.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from services.notifier import webhook, webhook_budget
from services.notifier.egress import EgressPolicy, EgressRefused, Target, redact, resolve
from services.notifier.outbox import (
    KAFKA_LANE,
    WEBHOOK_LANE,
    DeadLetter,
    Outbox,
    OutboxItem,
    moved_together,
)
from services.notifier.webhook_budget import (
    MAX_WEBHOOK_AGE_SECONDS,
    MAX_WEBHOOK_ATTEMPTS,
    Budget,
    Destination,
)

log = structlog.get_logger(__name__)

ID_HEADER = "ds-id"
# How long an idle relay thread sleeps when nothing woke it: notify() does for new items
# (every outbox write is this process's), and a webhook relay wakes at its earliest
# backoff, so the timeout only serves the Kafka producer's own events (logs, errors). At
# 1 s the three relays woke an idle notifier ~6 times a second, each with an outbox query
# (issue 34).
IDLE_WAIT_SECONDS = 10.0
# Delivery errors that retrying cannot fix: the item goes to the dead-letter table.
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    }
)
# Pending items read back from Kafka this long before their creation time (clock skew).
RECONCILE_SLACK_MS = 60_000


@dataclass(frozen=True)
class RelayHooks:
    """What the relay reports back (called on the relay thread). ``delivered`` returns the
    items that delivery causes (the alerts of a published fault); they are queued in the
    same outbox transaction that forgets the delivered items. ``dead_letter`` is told of
    items the relay moved to the dead-letter table together (one, or a destination's
    waiting items in bulk), and why."""

    delivered: Callable[[Sequence[OutboxItem]], Sequence[OutboxItem]]
    dead_letter: Callable[[Sequence[OutboxItem], str], None]
    reconciled: Callable[[int], None]

    def report_dead_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Tell ``dead_letter`` of what the outbox dead-lettered instead of queuing
        (``Outbox.append``/``complete``: a webhook destination full), each run of one
        destination and one reason together."""
        for items, why in moved_together(letters):
            self.dead_letter(items, why)


class _Produced(enum.Enum):
    QUEUED = "queued"
    FULL = "full"  # not queued: try it again after a poll
    REFUSED = "refused"  # moved to the dead-letter table


class _Uncertain(Exception):
    """A delivery failed in a way that leaves its outcome unknown: reconcile, resume."""


class KafkaRelay:
    def __init__(
        self,
        outbox: Outbox,
        *,
        new_producer: Callable[[], Producer],
        new_consumer: Callable[[], Consumer],
        hooks: RelayHooks,
        ready: threading.Event | None = None,
        max_in_flight: int = 1000,
    ) -> None:
        self._outbox = outbox
        self._ready = ready
        self._new_producer = new_producer
        self._new_consumer = new_consumer
        self._hooks = hooks
        self._max_in_flight = max_in_flight
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-kafka", daemon=True)
        self.connected = threading.Event()  # set once reconciliation has succeeded

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        """New items were appended: publish them now rather than on the next tick."""
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """Stop after giving in-flight items up to ``timeout`` seconds to be confirmed."""
        self._stop_deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout + 5)

    # ---- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while self._ready is not None and not self._ready.is_set():
            if self._stop.is_set():
                return
            self._ready.wait(0.5)
        while not self._stop.is_set():
            try:
                self._reconcile()
                self.connected.set()
                backoff = 0.5
                self._pump()
            except _Uncertain as exc:
                log.warning("outbox relay: delivery outcome uncertain; reconciling", error=str(exc))
            except Exception as exc:
                log.warning("outbox relay failed; retrying", error=repr(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _pump(self) -> None:
        producer = self._new_producer()
        in_flight: dict[int, OutboxItem] = {}
        done: list[tuple[OutboxItem, KafkaError | None]] = []
        last_seq = 0

        def on_delivery(item: OutboxItem) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, _msg: Message) -> None:
                done.append((item, err))

            return callback

        try:
            while True:
                if self._stop.is_set():
                    self._finish(producer, in_flight, done)
                    return
                room = self._max_in_flight - len(in_flight)
                if room > 0:
                    for item in self._outbox.pending(KAFKA_LANE, room, after_seq=last_seq):
                        outcome = self._produce(producer, item, on_delivery(item))
                        if outcome is _Produced.FULL:
                            break  # librdkafka's queue is full: poll, then go on from here
                        if outcome is _Produced.QUEUED:
                            in_flight[item.seq] = item
                        last_seq = item.seq
                producer.poll(0.05 if in_flight else 0)
                self._settle(done, in_flight)
                if not in_flight:
                    # notify() wakes it for new items; the timeout only serves the
                    # producer's own events (IDLE_WAIT_SECONDS).
                    self._wake.wait(IDLE_WAIT_SECONDS)
                    self._wake.clear()
        finally:
            # Unsent messages must not leave later: their items stay in the outbox and
            # are published (or found by reconciliation) by the next producer.
            producer.purge(in_queue=True, in_flight=False, blocking=False)
            producer.flush(0)

    def _produce(
        self,
        producer: Producer,
        item: OutboxItem,
        callback: Callable[[KafkaError | None, Message], None],
    ) -> _Produced:
        """Hand one item to the producer. An item the producer refuses outright (over
        ``message.max.bytes``, a topic name Kafka cannot have, ...) goes to the dead-letter
        table, so it cannot hold back the items behind it; a fatal producer error is raised
        (a new producer is made after reconciliation)."""
        try:
            producer.produce(
                item.destination,
                key=item.key,
                value=item.value,
                headers=item.header_pairs(),
                on_delivery=callback,
            )
        except BufferError:
            return _Produced.FULL
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.fatal():
                raise
            self._dead_letter(item, f"the producer refused it: {error.str() if error else exc}")
            return _Produced.REFUSED
        except (TypeError, ValueError) as exc:
            self._dead_letter(item, f"the producer refused it: {exc}")
            return _Produced.REFUSED
        return _Produced.QUEUED

    def _dead_letter(self, item: OutboxItem, why: str) -> None:
        self._outbox.dead_letter(item, why)
        self._hooks.dead_letter([item], why)

    def _settle(
        self,
        done: list[tuple[OutboxItem, KafkaError | None]],
        in_flight: dict[int, OutboxItem],
    ) -> None:
        if not done:
            return
        batch, done[:] = list(done), []
        delivered = [item for item, err in batch if err is None]
        if delivered:
            follow_ups = self._hooks.delivered(delivered)
            self._hooks.report_dead_letters(
                self._outbox.complete([item.seq for item in delivered], follow_ups)
            )
        uncertain: list[str] = []
        for item, err in batch:
            in_flight.pop(item.seq, None)
            if err is None:
                continue
            if err.code() in _PERMANENT:
                self._dead_letter(item, err.str())
            else:
                uncertain.append(f"{item.id}: {err.str()}")
        if uncertain:
            raise _Uncertain("; ".join(uncertain[:3]))

    def _finish(
        self,
        producer: Producer,
        in_flight: dict[int, OutboxItem],
        done: list[tuple[OutboxItem, KafkaError | None]],
    ) -> None:
        deadline = getattr(self, "_stop_deadline", time.monotonic())
        while in_flight and time.monotonic() < deadline:
            producer.poll(0.1)
            try:
                self._settle(done, in_flight)
            except _Uncertain:
                return
        if in_flight:
            log.info(
                "outbox relay stopping with items in flight; they stay queued", count=len(in_flight)
            )

    # ---- reconciliation -----------------------------------------------------------------

    def _reconcile(self) -> None:
        pending = self._outbox.pending(KAFKA_LANE, 1_000_000)
        if not pending:
            return
        by_topic: dict[str, list[OutboxItem]] = {}
        for item in pending:
            by_topic.setdefault(item.destination, []).append(item)
        found: set[str] = set()
        consumer = self._new_consumer()
        try:
            for topic, items in by_topic.items():
                since = min(i.created_ms for i in items) - RECONCILE_SLACK_MS
                found |= self._ids_in_topic(consumer, topic, since, {i.id for i in items})
        finally:
            consumer.close()
        if found:
            published = [item for item in pending if item.id in found]
            # Their delivery was confirmed by reading them back: do what delivery does.
            follow_ups = self._hooks.delivered(published)
            self._hooks.report_dead_letters(
                self._outbox.complete([item.seq for item in published], follow_ups)
            )
        self._hooks.reconciled(len(found))
        log.info("outbox reconciled", pending=len(pending), already_published=len(found))

    def _ids_in_topic(
        self, consumer: Consumer, topic: str, since_ms: int, wanted: set[str]
    ) -> set[str]:
        metadata = consumer.list_topics(topic, timeout=10)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            if info is not None and info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return set()  # nothing was published to a topic that does not exist
            raise KafkaException(info.error if info is not None else "no metadata")
        starts = consumer.offsets_for_times(
            [TopicPartition(topic, p, max(since_ms, 0)) for p in info.partitions], timeout=10
        )
        ends: dict[int, int] = {}
        assign: list[TopicPartition] = []
        for tp in starts:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10
            )
            start = tp.offset if tp.offset >= 0 else high  # -1: nothing at/after the time
            if start < high:
                ends[tp.partition] = high
                assign.append(TopicPartition(topic, tp.partition, start))
        if not assign:
            return set()
        found: set[str] = set()
        consumer.assign(assign)
        deadline = time.monotonic() + 120
        try:
            while ends and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.5):
                    if msg.error() is not None:
                        continue
                    partition = int(msg.partition() or 0)
                    for key, value in msg.headers() or []:  # type: ignore[str-unpack]
                        if key == ID_HEADER and value is not None:
                            text = value.decode() if isinstance(value, bytes) else str(value)
                            if text in wanted:
                                found.add(text)
                    offset = int(msg.offset() or 0)
                    if partition in ends and offset + 1 >= ends[partition]:
                        del ends[partition]
            if ends:
                raise KafkaException(f"reconciliation of {topic} did not reach the log end")
        finally:
            consumer.unassign()
        return found


# Destinations looked at per round (each its oldest item).
MAX_DESTINATIONS_PER_ROUND = 1000
# Items moved to the dead-letter table per transaction when a destination's are, in bulk.
DEAD_LETTER_BATCH = 1000


class WebhookRelay:
    """POSTs the webhook lane; per-URL order, a backoff and a retry budget per failing URL
    (``webhook_budget.py``)."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        hooks: RelayHooks,
        egress: EgressPolicy,
        timeout: float = 5.0,
        max_backoff: float = 60.0,
        max_attempts: int = MAX_WEBHOOK_ATTEMPTS,
        max_age: float = MAX_WEBHOOK_AGE_SECONDS,
        resolver: Callable[[Target], list[str]] = resolve,
    ) -> None:
        """``egress``: where webhooks may go; every POST is checked against it again
        (the allow-list may have changed since the template was put, and DNS answers do)."""
        self._outbox = outbox
        self._hooks = hooks
        self._egress = egress
        self._timeout = timeout
        self._budget = Budget(
            max_attempts=max_attempts,
            max_age_seconds=max_age,
            first_backoff=min(0.5, max_backoff),
            max_backoff=max_backoff,
        )
        self._resolve = resolver
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._runs: dict[str, Destination] = {}  # url -> its current run of failures
        self._thread = threading.Thread(target=self._run, name="outbox-webhook", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self._round()
            except Exception as exc:
                log.warning("webhook relay failed; retrying", error=repr(exc))
                sent = 0
            if not sent:
                self._wake.wait(self._idle_wait(time.monotonic()))
                self._wake.clear()

    def _idle_wait(self, now: float) -> float:
        """Until the earliest backed-off destination may be tried again, at most
        IDLE_WAIT_SECONDS (notify() wakes the relay for new items)."""
        waits = [max(0.0, run.retry_at - now) for run in self._runs.values()]
        return min([IDLE_WAIT_SECONDS, *waits])

    def _round(self) -> int:
        now = time.monotonic()
        webhook_budget.forget_stale(self._runs, self._budget, now)
        # An attempt that fails dead-letters, once the budget is spent, only what was
        # queued before this round began (never an item no attempt was made after).
        queued_up_to = self._outbox.last_seq()
        blocked: set[str] = set()
        sent = 0
        # The oldest item of every destination (issue 37, finding 7): one destination with
        # many items pending, failing, does not hide the others' items.
        for item in self._outbox.heads(WEBHOOK_LANE, MAX_DESTINATIONS_PER_ROUND):
            if self._stop.is_set():
                break
            url = item.destination
            run = self._runs.get(url)
            if run is None and (run := webhook_budget.resumed(item.attempts, now)) is not None:
                self._runs[url] = run  # after a restart: its recorded failures in a row
            if url in blocked or (run is not None and not run.may_try(now)):
                continue  # keep this URL's order: nothing after a failed item goes first
            outcome = self._post(item)
            if outcome is None:
                self._hooks.report_dead_letters(
                    self._outbox.complete([item.seq], self._hooks.delivered([item]))
                )
                self._runs.pop(url, None)
                sent += 1
            elif outcome.startswith("permanent:"):
                self._outbox.dead_letter(item, outcome)
                self._hooks.dead_letter([item], outcome)
            else:
                self._outbox.record_attempt(item.seq)
                self._failed(url, outcome, queued_up_to)
                blocked.add(url)
        return sent

    def _failed(self, url: str, error: str, queued_up_to: int) -> None:
        """Back ``url`` off; dead-letter what waits for it past its budget or max age."""
        decision = webhook_budget.failed(
            self._runs.get(url),
            self._budget,
            now=time.monotonic(),
            now_ms=int(time.time() * 1000),
            queued_up_to_seq=queued_up_to,
            error=error,
        )
        self._runs[url] = decision.destination
        spent = self._dead_letter_waiting(
            url, decision.spent_reason, up_to_seq=decision.spent_up_to_seq
        )
        expired = self._dead_letter_waiting(
            url, decision.expired_reason, created_before_ms=decision.expired_before_ms
        )
        log.warning(
            "webhook delivery failed; backing off",
            url=redact(url),
            error=error,
            failures_in_a_row=decision.destination.failures,
            retry_in=round(decision.destination.retry_at - time.monotonic(), 1),
            dead_lettered=spent + expired,
        )

    def _dead_letter_waiting(
        self,
        url: str,
        why: str,
        *,
        up_to_seq: int | None = None,
        created_before_ms: int | None = None,
    ) -> int:
        """Move ``url``'s waiting items that match to the dead-letter table, in batches;
        how many."""
        if up_to_seq is None and created_before_ms is None:
            return 0
        moved = 0
        while True:
            items = self._outbox.dead_letter_waiting(
                WEBHOOK_LANE, url, why, up_to_seq=up_to_seq,
                created_before_ms=created_before_ms, limit=DEAD_LETTER_BATCH,
            )  # fmt: skip
            if items:
                self._hooks.dead_letter(items, why)
                moved += len(items)
            if len(items) < DEAD_LETTER_BATCH:
                return moved

    def _post(self, item: OutboxItem) -> str | None:
        """None when delivered; else why (prefixed ``permanent:`` for what retrying cannot
        fix: a target the egress policy refuses, a redirect, a 4xx)."""
        try:
            target = self._egress.target(item.destination)
            addresses = self._egress.check_addresses(target, self._resolve(target))
        except EgressRefused as exc:
            return f"permanent: egress refused: {exc}"
        except OSError as exc:  # the name does not resolve (now)
            return f"{type(exc).__name__}: {exc}"
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        for key, value in item.headers:
            if key.startswith("ds-"):  # ds-id -> X-DS-Id (the receiver dedupes on it)
                headers.append((f"X-DS-{key.removeprefix('ds-').title()}", value))
        try:
            status = webhook.post(target, addresses, item.value, headers, timeout=self._timeout)
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return None
        if 300 <= status < 400:
            return f"permanent: HTTP {status}: redirects are not followed"
        if 400 <= status < 500 and status not in (408, 429):
            return f"permanent: HTTP {status}"
        return f"HTTP {status}"
