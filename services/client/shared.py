"""Reading ``DELIVERY_FORMAT_ARROW_SHM`` batches in place: the segments of one stream,
mapped read-only.

The sidecar writes each partition run once, as an Arrow IPC stream, into a segment file
in the directory of its local socket (a memory volume the pod's containers share) and
sends only where it lies (``SharedBatch``). The client maps each segment at its first
mention and keeps the mapping for the stream's life: the sidecar may remove the file once a
region of it was released, and a mapping outlives its file. ``pa.ipc.open_stream`` on a
slice of the mapping reads the columns in place (no copy); they stay valid until the
region is released, when the sidecar may write over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dataservice.sidecar.v1 import stream_pb2

if TYPE_CHECKING:
    import pyarrow as pa


class SharedBatchError(Exception):
    """A SharedBatch could not be read: its segment is missing, or its bytes are not the
    IPC stream it says."""


class Segments:
    """The segments one stream generation named, each mapped once (by file name)."""

    def __init__(self, directory: Path) -> None:
        """``directory``: the directory of the socket file the stream runs on."""
        self.directory = directory
        self._mapped: dict[str, pa.Buffer] = {}

    def __len__(self) -> int:
        return len(self._mapped)

    def read(self, shared: stream_pb2.SharedBatch) -> pa.RecordBatch:
        """The run ``shared`` describes, its columns read in place from the mapping.

        Raises:
            SharedBatchError: The segment name is not a plain file name, the file cannot
                be mapped, the region lies outside it, or it does not hold one record
                batch of ``record_count`` rows in the expected schema.
        """
        # Arrow only in an application that reads shared runs (stream_columns over the
        # socket): importing it costs ~40 MiB of RSS (issue 34).
        import pyarrow as pa
        import pyarrow.ipc as pa_ipc

        from services.records.arrow_batches import SCHEMA

        whole = self._segment(shared.segment)
        if (
            shared.position < 0
            or shared.length <= 0
            or shared.position + shared.length > whole.size
        ):
            raise SharedBatchError(
                f"region {shared.region} [{shared.position}, +{shared.length}) lies outside "
                f"segment {shared.segment!r} of {whole.size} B"
            )
        try:
            reader = pa_ipc.open_stream(whole.slice(shared.position, shared.length))
            batch = reader.read_next_batch()
        except (pa.ArrowException, StopIteration) as exc:
            raise SharedBatchError(
                f"region {shared.region}: not an Arrow IPC stream: {exc}"
            ) from exc
        if not batch.schema.equals(SCHEMA) or batch.num_rows != shared.record_count:
            raise SharedBatchError(
                f"region {shared.region}: {batch.num_rows} rows of {batch.schema}, expected "
                f"{shared.record_count} rows of the ARROW_IPC schema"
            )
        return batch

    def _segment(self, name: str) -> pa.Buffer:
        whole = self._mapped.get(name)
        if whole is not None:
            return whole
        if not name or "/" in name or name in (".", ".."):
            raise SharedBatchError(f"segment {name!r} is not a file name")
        import pyarrow as pa

        try:
            mapped = pa.memory_map(str(self.directory / name), "r")
            whole = mapped.read_buffer(mapped.size())  # the mapping itself: no copy
        except (OSError, pa.ArrowException) as exc:
            raise SharedBatchError(f"segment {name!r} cannot be mapped: {exc}") from exc
        self._mapped[name] = whole
        return whole
