"""A Stream's shared-memory segment (``DELIVERY_FORMAT_ARROW_SHM``): a file in the
directory of the sidecar's local socket, mapped by the sidecar and the application.

Each partition run is written once, as an Arrow IPC stream (schema, one record batch, end
marker), straight into a region of the mapping: the only copy of the keys and values on
their way from the sidecar's buffer to the application. The response says where
(``SharedBatch``); the application maps the file, reads the columns in place and releases
the region with its ack; the :class:`~services.consumer_sidecar.shm_ring.Ring` says where
the next stream goes.

The file: ``sidecar-ID.shm-RANDOM`` (the socket's directory is a memory ``emptyDir`` the
pod's containers share; mode 0660, as the socket), its whole capacity allocated when the
stream opens (the memory is the sidecar's, counted in its container's limit). It is
removed as soon as the application has it mapped (its first release) or when the stream
ends, whichever comes first: both mappings keep the memory until they are closed, and a
sidecar that is killed leaves at most its open streams' files, which it removes when it
starts again (:func:`~dsclient.local_socket.sweep_segments`).

pyarrow is imported by this module: the servicer imports it on the first such stream.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from dsclient import local_socket
from dsclient.records.arrow_batches import SCHEMA
from services.consumer_sidecar.shm_ring import Region, Ring

SEGMENT_MODE = 0o660  # as the socket: the pod's containers share a group, not a user
# Given, so pyarrow does not read two environment variables for each stream it writes.
_OPTIONS = pa_ipc.IpcWriteOptions()


def ipc_size(batch: pa.RecordBatch) -> int:
    """The bytes of ``batch`` written as an IPC stream: metadata only, nothing copied."""
    sink = pa.MockOutputStream()
    with pa_ipc.new_stream(sink, SCHEMA, options=_OPTIONS) as writer:
        writer.write_batch(batch)
    size: int = sink.size()
    return size


class Segment:
    """One Stream's segment of ``capacity`` bytes in ``directory`` (see the module doc)."""

    def __init__(self, directory: Path, sidecar_id: str, capacity: int) -> None:
        self.name = f"{local_socket.segment_prefix(sidecar_id)}{secrets.token_hex(8)}"
        self.path = directory / self.name
        self.ring = Ring(capacity)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, SEGMENT_MODE)
        try:
            os.fchmod(fd, SEGMENT_MODE)  # whatever the umask
            # Every page now, not as first written: a full memory volume (tmpfs at its
            # sizeLimit) refuses the stream here (ENOSPC: UNAVAILABLE, the client reads over
            # TCP) instead of killing the sidecar with SIGBUS on a write into the mapping.
            os.posix_fallocate(fd, 0, capacity)
            # pyarrow's own mapping: IPC streams are written straight into it.
            self._map: pa.MemoryMappedFile | None = pa.memory_map(str(self.path), "r+")
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)  # the mapping keeps the file's memory
        self._linked = True

    def write(self, batch: pa.RecordBatch) -> Region | None:
        """Write ``batch`` as an IPC stream into a new region; None while the ring has no
        room for it (the client holds too much: wait for a release). ValueError if it
        can never fit (larger than the segment)."""
        size = ipc_size(batch)
        if not self.ring.fits(size):
            raise ValueError(f"{size} bytes do not fit a segment of {self.ring.capacity}")
        region = self.ring.allocate(size)
        if region is None:
            return None
        assert self._map is not None, "written after close"
        self._map.seek(region.position)
        with pa_ipc.new_stream(
            self._map, SCHEMA, options=_OPTIONS
        ) as writer:  # closing it leaves the map open
            writer.write_batch(batch)
        return region

    def release(self, region_ids: Iterable[int]) -> int:
        """The client is done with these regions (and so has the file mapped: it is
        removed); how many were held."""
        released = sum(map(self.ring.release, region_ids))
        if released:
            self.unlink()
        return released

    def unlink(self) -> None:
        """Remove the file (the mappings keep the memory until they are closed)."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def close(self) -> None:
        """The stream ended: remove the file and unmap it."""
        self.unlink()
        if self._map is not None:
            mapping, self._map = self._map, None
            mapping.close()
