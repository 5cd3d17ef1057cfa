"""Zero-copy delivery (``DELIVERY_FORMAT_ARROW_SHM``, Stream over the local socket only):
a stream's shared-memory segment made, how much one take may hold, and taken records
written into the segment as Arrow, the Stream message saying where.

The segment (``shm_segment.py``) is a file in the directory of the sidecar's local socket;
the client maps it and releases what it read (a Stream's ``acks.released``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from dataservice.sidecar.v1 import stream_pb2
from dsclient.reasons import DsError, Reason
from dsclient.records.batches import Slice
from services.consumer_sidecar.stream_flow import StreamState

if TYPE_CHECKING:
    from services.consumer_sidecar.shm_ring import Ring
    from services.consumer_sidecar.shm_segment import Segment

log = structlog.get_logger(__name__)

STREAM_SHARED_RECORDS = 50_000  # DELIVERY_FORMAT_ARROW_SHM: the bytes are the segment's
# ARROW_SHM: what Arrow adds to a record's key and value bytes (its offset, timestamp, and
# the offsets of its key, value and headers: 34-38 bytes measured, 1,000 records a run).
SHM_RECORD_OVERHEAD = 40


@dataclass(frozen=True)
class SharedMemory:
    """Where ``DELIVERY_FORMAT_ARROW_SHM`` streams get their segments: the directory of the
    sidecar's local socket, ``capacity`` bytes each (``shm_segment.py``)."""

    directory: Path
    capacity: int


async def open_segment(shared_memory: SharedMemory, sidecar_id: str) -> Segment:
    """A new stream's shared-memory segment; UNAVAILABLE if it cannot be made (the
    client reads on over TCP). Made on a thread: allocating every page takes
    milliseconds (4-12 for 32 MiB here), and the first one imports pyarrow; the event
    loop serves the other calls meanwhile. A stream that goes while its segment is
    made has it closed (its file removed) as soon as it is made."""
    making = asyncio.ensure_future(
        asyncio.to_thread(
            _make_segment, shared_memory.directory, sidecar_id, shared_memory.capacity
        )
    )
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:
        making.add_done_callback(_close_made)
        raise
    except OSError as err:
        log.warning("shared-memory segment not made", error=str(err))
        raise DsError(
            Reason.SERVICE_NOT_READY, f"cannot make a shared-memory segment: {err}"
        ) from err


def shared_limits(capacity: int) -> tuple[int, int]:
    """DELIVERY_FORMAT_ARROW_SHM: the records and bytes of one take from a segment of
    ``capacity``. The response carries no record: only the segment bounds what one takes.
    A quarter of it keeps a few responses in flight, and fewer, larger partition runs (each
    costs its Arrow arrays' set-up, tens of µs; takes sized to the room left shrank as the
    client held more, and cut the runs small: 1 KiB records read at 0.5 of the direct loop
    instead of 0.7). The records limit keeps Arrow's per-record share within an eighth of
    the segment in small ones."""
    records = max(1, min(STREAM_SHARED_RECORDS, capacity // (8 * SHM_RECORD_OVERHEAD)))
    return records, max(1, capacity // 4)


def has_room(ring: Ring, limits: tuple[int, int]) -> bool:
    """Whether a take of ``limits`` may go: Arrow adds about SHM_RECORD_OVERHEAD a record
    and 1.3 KiB a run to the keys and values, so the segment must have room for the take's
    bytes and half as much again (an empty ring always takes); what still does not fit
    waits for room, already taken."""
    nbytes = limits[1]
    return ring.room() >= min(ring.capacity, nbytes + nbytes // 2)


def _make_segment(directory: Path, sidecar_id: str, capacity: int) -> Segment:
    from services.consumer_sidecar.shm_segment import Segment  # pyarrow: on first use

    return Segment(directory, sidecar_id, capacity)


def _close_made(making: asyncio.Future[Segment]) -> None:
    """A segment made for a stream that went meanwhile: closed (its file removed)."""
    if not making.cancelled() and making.exception() is None:
        making.result().close()


def shared_response(state: StreamState) -> tuple[stream_pb2.StreamResponse, list[Slice]]:
    """DELIVERY_FORMAT_ARROW_SHM: the stream's pending slices written into its segment, in
    order, while it has room: the response saying where, and the slices it delivers (the
    rest stay pending). A slice too large for the whole segment goes as a RecordBatch, the
    last of its response."""
    from dsclient.records.arrow_batches import from_slice  # pyarrow: on first use

    segment = state.segment
    assert segment is not None
    batch = stream_pb2.StreamBatch()
    sent = 0
    for piece in state.pending:
        arrow = from_slice(piece)
        try:
            region = segment.write(arrow)
        except ValueError:  # larger than the segment
            batch.batches.append(piece.to_batch())
            sent += 1
            # The response ends here: a client hands out a response's shared runs, then its
            # RecordBatches, so what follows must not share a response with this one (a
            # partition's records stay in offset order).
            break
        if region is None:  # no room until the client releases
            break
        batch.shared.add(
            topic=piece.topic,
            partition=piece.partition,
            lease_epoch=piece.epoch,
            delivery_count=piece.deliveries,
            first_offset=piece.first_offset,
            last_offset=piece.last_offset,
            record_count=len(piece),
            segment=segment.name,
            position=region.position,
            length=region.length,
            region=region.id,
        )
        sent += 1
    done, state.pending = state.pending[:sent], state.pending[sent:]
    return stream_pb2.StreamResponse(batch=batch), done
