"""The client's end of a Stream's frame socket (``StreamOpen.frame_socket``).

Over the sidecar's local socket a stream asks for its messages as frames on a plain Unix
socket instead of gRPC messages (the sidecar's ``frame_socket.py`` says why and how): the
gRPC call opens the stream and carries its end and its error; credit, acks and nacks go
out as frames written by the thread that makes them (one ``send``, no hand-off to gRPC's
threads), and batches and answers come in as frames read by the stream's thread (one
``recv`` each, usually fewer: reads are buffered).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

from dataservice.sidecar.v1 import stream_pb2
from dsclient import local_socket

HEADER = struct.Struct("<I")  # a frame's length, before it (the sidecar's end uses this too)
CONNECT_SECONDS = 5.0
READ_BUFFER_BYTES = 256 * 1024


class FrameSocketError(Exception):
    """The frame socket the sidecar named cannot be used here (not a plain file name,
    not trusted, or it does not accept): the stream is opened again without it."""


class FrameSocket:
    """One stream's connection to the frame socket ``name`` in ``directory`` (the
    directory of the sidecar's local socket), past its ``token``."""

    def __init__(self, directory: Path, name: str, token: bytes) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise FrameSocketError(f"frame socket {name!r} is not a file name")
        path = directory / name
        if reason := local_socket.untrusted(path):
            raise FrameSocketError(f"frame socket not used: {reason}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_SECONDS)
            sock.connect(str(path))
            sock.settimeout(None)
            sock.sendall(HEADER.pack(len(token)) + token)
        except OSError as exc:
            sock.close()
            raise FrameSocketError(f"frame socket {path}: {exc}") from exc
        self._sock = sock
        self._reader = sock.makefile("rb", buffering=READ_BUFFER_BYTES)

    def send(self, request: stream_pb2.StreamRequest) -> None:
        """One request as a frame (OSError once the sidecar closed its end). Callers keep
        the order of their requests themselves (one writer at a time)."""
        data = request.SerializeToString()
        self._sock.sendall(HEADER.pack(len(data)) + data)

    def frames(self) -> Iterator[bytes]:
        """Each response frame's bytes, in order, until the sidecar closes its end (or
        :meth:`close` was called)."""
        read = self._reader.read
        size = HEADER.size
        try:
            while True:
                try:
                    header = read(size)
                    if len(header) < size:
                        return
                    (length,) = HEADER.unpack(header)
                    data = read(length)
                except (OSError, ValueError):  # reset, or closed by close()
                    return
                if len(data) < length:
                    return
                yield data
        finally:
            self._reader.close()

    def close(self) -> None:
        """End the connection (a thread blocked in :meth:`frames` returns)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
