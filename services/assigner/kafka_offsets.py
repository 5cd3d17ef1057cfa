"""The Kafka edge of the offsets: a group's committed offsets and its partitions' log bounds,
and the timestamps of the oldest unconsumed records.

Every method of :class:`KafkaOffsets` blocks (confluent-kafka calls): call it in a worker
thread (``asyncio.to_thread``, as :class:`~services.assigner.offsets_view.OffsetsView`
does), never on the event loop.

``lag_seconds`` is the age of the record at the committed offset (the oldest unconsumed
one): its timestamp is read with a short-lived consumer (``assign()``, never commits), see
:meth:`KafkaOffsets.oldest_timestamps`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from dsclient.reasons import DsError
from services.assigner.offsets import NO_OFFSET, PartitionOffsets, unavailable
from services.runtime import commitmeta
from services.runtime.kafka import is_retriable, new_consumer
from services.runtime.settings import ServiceSettings
from services.runtime.topic_partition import TopicPartition

KAFKA_TIMEOUT_SECONDS = 5.0
LAG_PROBE_SECONDS = 2.0
LAG_PROBE_MAX_PARTITIONS = 256
# Groups whose committed-offsets consumer is kept open between reads (least recently read
# closed first): the assigner's groups, and a ListGroups page's, stay warm.
COMMITTED_READERS_KEPT = 128
# Pause before asking again after a retriable error (the coordinator is being re-found).
COMMITTED_RETRY_SECONDS = 0.1


class KafkaOffsets:
    """Reads a group's committed offsets and its partitions' log bounds from Kafka.

    Every method blocks (up to ``timeout``): call it through ``asyncio.to_thread``. One
    call's requests share one deadline; Kafka that cannot answer in time raises
    ``DsError(KAFKA_UNAVAILABLE)``.

    Committed offsets are read by a consumer whose ``group.id`` is the group, never by an
    AdminClient: see :meth:`_committed`. No consumer here subscribes (so none joins a
    group) or commits; all are used and closed under ``_lock``, one thread at a time.
    """

    def __init__(
        self, settings: ServiceSettings, *, timeout: float = KAFKA_TIMEOUT_SECONDS
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self._lock = threading.RLock()  # read_many holds it around _watermarks
        self._consumer: Consumer | None = None  # for watermarks
        self._readers: OrderedDict[str, Consumer] = OrderedDict()  # committed offsets, by group

    def read(
        self, group: str, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, PartitionOffsets]:
        result = self.read_many({group: partitions})[group]
        if isinstance(result, DsError):
            raise result
        return result

    def read_many(
        self, groups: Mapping[str, Sequence[TopicPartition]]
    ) -> dict[str, dict[TopicPartition, PartitionOffsets] | DsError]:
        """Offsets of several groups: each group's committed offsets, then the watermarks
        of all their partitions, within one deadline."""
        deadline = time.monotonic() + self.timeout
        all_tps = sorted({tp for tps in groups.values() for tp in tps})
        if not all_tps:
            return {g: {} for g in groups}
        out: dict[str, dict[TopicPartition, PartitionOffsets] | DsError] = {}
        committed: dict[str, dict[tuple[str, int], tuple[int, str]]] = {}
        with self._lock:
            for group, tps in groups.items():
                try:
                    committed[group] = self._committed(group, tps, deadline) if tps else {}
                except KafkaException as exc:
                    out[group] = unavailable(
                        f"cannot read committed offsets of group {group!r}: {_text(exc)}", group
                    )
            if not any(groups[g] for g in committed):
                return {group: out.get(group, {}) for group in groups}
            try:
                bounds = self._watermarks(all_tps, deadline)
            except KafkaException as exc:
                err = unavailable(f"cannot read partition offsets from Kafka: {_text(exc)}")
                return {group: err if tps else {} for group, tps in groups.items()}
        for group, tps in groups.items():
            if group in out:
                continue
            found = committed[group]
            out[group] = {
                tp: PartitionOffsets(
                    committed=found.get(tp, (NO_OFFSET, ""))[0],
                    earliest=bounds[tp][0],
                    end=bounds[tp][1],
                    committed_by=found.get(tp, (NO_OFFSET, ""))[1],
                )
                for tp in tps
            }
        return {group: out[group] for group in groups}

    def _committed(
        self, group: str, tps: Sequence[TopicPartition], deadline: float
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """(topic, partition) -> the group's committed offset and who wrote it
        (:func:`~services.runtime.commitmeta.committed_by`); a partition without one is
        missing. Called under ``_lock``.

        Through a consumer of the group, not AdminClient.list_consumer_group_offsets: when
        an OffsetFetch is answered NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, librdkafka
        (2.16 here; confluentinc/librdkafka#5040) asks the client's own consumer group to
        re-find its coordinator, and an AdminClient has none: a NULL dereference on its
        rdk:main thread, a SIGSEGV that kills the assigner. Kafka answers so whenever a
        group's coordinator is not where the client looked: on a fresh broker until
        __consumer_offsets is loaded (the first DescribeGroup), and on every coordinator
        move. A consumer has the group, re-finds the coordinator, and the read is asked
        again until ``deadline``.
        """
        reader = self._reader(group)
        request = [_ktp(tp) for tp in tps]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaException(f"timed out reading the committed offsets of {group}")
            try:
                listed = reader.committed(request, timeout=left)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not (isinstance(error, KafkaError) and is_retriable(error)):
                    raise
                time.sleep(max(0.0, min(COMMITTED_RETRY_SECONDS, deadline - time.monotonic())))
                continue
            return {
                (ktp.topic, ktp.partition): (
                    ktp.offset if ktp.offset >= 0 else NO_OFFSET,
                    commitmeta.committed_by(ktp.metadata, ktp.offset),
                )
                for ktp in listed
                if ktp.error is None
            }

    def _reader(self, group: str) -> Consumer:
        """The group's committed-offsets consumer, kept for the next read. Under ``_lock``."""
        reader = self._readers.pop(group, None)
        if reader is None:
            reader = new_consumer(self.settings, group=group, client_id="ds-assigner-offsets")
        self._readers[group] = reader  # the most recently read last
        while len(self._readers) > COMMITTED_READERS_KEPT:
            _, oldest = self._readers.popitem(last=False)
            oldest.close()
        return reader

    def _watermarks(
        self, tps: Sequence[TopicPartition], deadline: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(log start, high watermark) per partition. A consumer's watermark query rather
        than AdminClient.list_offsets: the assigner once died (segfault in rdk:main) around
        list_offsets on a fresh broker, most likely the OffsetFetch crash of
        :meth:`_committed` rather than list_offsets itself."""
        out: dict[TopicPartition, tuple[int, int]] = {}
        with self._lock:
            if self._consumer is None:
                self._consumer = new_consumer(
                    self.settings, group="ds-assigner-watermarks", client_id="ds-assigner-admin"
                )
            for tp in tps:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaException(
                        f"timed out reading the end offset of {tp.topic}/{tp.partition}"
                    )
                marks = self._consumer.get_watermark_offsets(_ktp(tp), timeout=left, cached=False)
                if marks is None:
                    raise KafkaException(
                        f"timed out reading the end offset of {tp.topic}/{tp.partition}"
                    )
                out[tp] = (int(marks[0]), int(marks[1]))
        return out

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            while self._readers:
                self._readers.popitem()[1].close()

    def oldest_timestamps(
        self, starts: Mapping[TopicPartition, int], budget: float = LAG_PROBE_SECONDS
    ) -> dict[TopicPartition, int]:
        """Timestamp (ms) of the first record at or after each start offset, as far as a
        short-lived consumer can read them within ``budget``; it never commits and joins no
        group (``assign()``). Partitions not read in time are missing from the result."""
        wanted = dict(sorted(starts.items())[:LAG_PROBE_MAX_PARTITIONS])
        if not wanted:
            return {}
        consumer = new_consumer(
            self.settings,
            group="ds-assigner-lag-probe",
            client_id="ds-assigner-lag-probe",
            overrides={
                "max.partition.fetch.bytes": 65536,
                "fetch.wait.max.ms": 50,
                "enable.auto.offset.store": False,
            },
        )
        found: dict[TopicPartition, int] = {}
        try:
            consumer.assign([_ktp(tp, offset) for tp, offset in wanted.items()])
            deadline = time.monotonic() + budget
            while len(found) < len(wanted) and (left := deadline - time.monotonic()) > 0:
                for msg in consumer.consume(num_messages=500, timeout=min(left, 0.5)):
                    topic, partition = msg.topic(), msg.partition()
                    if msg.error() is not None or topic is None or partition is None:
                        continue
                    tp = TopicPartition(topic, partition)
                    if tp in found or tp not in wanted:
                        continue
                    kind, ts = msg.timestamp()
                    if kind != TIMESTAMP_NOT_AVAILABLE and ts >= 0:
                        found[tp] = ts
                    consumer.pause([_ktp(tp)])
        except KafkaException:
            pass  # what was read stays; the rest is unknown (-1)
        finally:
            consumer.close()
        return found


def _ktp(tp: TopicPartition, offset: int | None = None) -> KafkaTopicPartition:
    if offset is None:
        return KafkaTopicPartition(tp.topic, tp.partition)
    return KafkaTopicPartition(tp.topic, tp.partition, offset)


def _text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    return str(arg.str()) if hasattr(arg, "str") else str(arg)
