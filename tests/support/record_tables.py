"""Arrow tables of records for the codec's and the chunk buffer's unit tests: a table holding
given records, and the records a consumer reads back."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, Message
from hypothesis import strategies as st

from dsclient.records.batches import (
    DsRecord,
)
from services.consumer_sidecar.acks import PartitionAcks
from services.consumer_sidecar.partitions import Partition, PartitionTable
from services.runtime.topic_partition import TP

EPOCHS = {("a", 0): 3, ("a", 1): 4, ("b", 0): 7}


optional_bytes = st.one_of(st.none(), st.binary(max_size=40))


headers = st.one_of(
    st.none(), st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=8)), max_size=3)
)


@st.composite
def consumed(draw: st.DrawFn) -> tuple[list[Message], list[DsRecord]]:
    """A consume() batch (runs of records per partition, errors mixed in) and the records
    an application must read from it."""
    next_offset = {tp: draw(st.integers(0, 10**12)) for tp in EPOCHS}
    messages: list[Message] = []
    expected: list[DsRecord] = []
    for _ in range(draw(st.integers(0, 6))):
        tp = draw(st.sampled_from(sorted(EPOCHS)))
        for _ in range(draw(st.integers(1, 25))):
            if draw(st.integers(0, 30)) == 0:
                messages.append(Message(error=KafkaError(KafkaError._TRANSPORT)))
                continue
            offset = next_offset[tp] + draw(st.sampled_from([0, 0, 0, 1, 5]))  # some gaps
            next_offset[tp] = offset + 1
            key, value, hs = draw(optional_bytes), draw(optional_bytes), draw(headers)
            ts = draw(st.one_of(st.just(-1), st.integers(0, 2**41)))
            messages.append(
                Message(
                    topic=tp[0],
                    partition=tp[1],
                    offset=offset,
                    key=key,
                    value=value,
                    # a copy as the list type the stubs take (List is invariant there)
                    headers=None if hs is None else list(hs),
                    timestamp=(1 if ts >= 0 else 0, ts),
                )
            )
            record = DsRecord(tp[0], tp[1], offset, key, value, ts, hs or None, EPOCHS[tp])
            expected.append(record)
    return messages, expected


def offset_of(message: Message) -> int:
    """The offset of a record (not an error) message."""
    offset = message.offset()
    assert offset is not None, "a record message has an offset"
    return offset


def table_holding(
    messages: list[Message], on_unblocked: Callable[[], None] | None = None
) -> PartitionTable:
    table = PartitionTable(1 << 40, lambda: 0.0, on_unblocked=on_unblocked)
    for (topic, partition), epoch in EPOCHS.items():
        start = min((offset_of(m) for m in messages if m.error() is None
                     and (m.topic(), m.partition()) == (topic, partition)), default=0)  # fmt: skip
        table.add(
            Partition(
                tp=TP(topic, partition),
                epoch=epoch,
                deadline=1.0,
                acks=PartitionAcks(start),
                position=start,
                ready=True,
            )
        )
    return table
