"""A Stream's messages as frames on a plain Unix socket (``StreamOpen.frame_socket``).

Over the pod's local socket, each gRPC message of a Stream costs a few hundred microseconds
of Python on each side (grpc.aio's callbacks on the sidecar's event loop, the synchronous
channel's thread hand-offs in the application; issue 34), and at the rates services run a
batch is three such messages: the batch, its acks, their answer. A stream opened with
``frame_socket`` keeps its gRPC call to open (authenticated and authorized as any call),
to end and to fail, and moves everything else to a socket file beside the gRPC socket,
``sidecar-ID.frames``, in the same directory (mode 0660, the directory only the sidecar
writes): the first response names it and gives the stream a random token; the client
connects, sends the token as its first frame, and from then on both sides write
serialized ``StreamRequest`` / ``StreamResponse`` messages, each behind its length (4
bytes, little-endian). A frame costs one ``send`` and one ``recv``; the records of an
``ARROW_SHM`` stream still lie in its segment, the frame only says where.

The socket's end is the other side's end (a killed application included): the stream
ends as when its gRPC call ends, and what it delivered without an ack comes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
from google.protobuf.message import DecodeError, Message

from dataservice.sidecar.v1 import stream_pb2
from dsclient import local_socket
from dsclient.frame_socket import HEADER  # the wire format, one place for both ends
from dsclient.reasons import invalid

log = structlog.get_logger(__name__)

TOKEN_BYTES = 16
# A frame from the client holds one StreamRequest: credit, acks or nacks. gRPC's default
# limit on a received message, as the same request on the call would have.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
# A stream's socket not connected this long after its first response: the stream fails
# (INVALID_ARGUMENT on open.frame_socket: the client opens without it).
ATTACH_SECONDS = 10.0
# How long a new connection has to send its token.
TOKEN_SECONDS = 5.0
FRAMES_LOCAL_ONLY = "frame_socket is served on Stream over the local socket only"


class FrameConnection:
    """One stream's socket, connected and past its token."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def requests(self) -> AsyncIterator[stream_pb2.StreamRequest]:
        """The client's requests, in order, until it closes the socket. A frame that is not
        a StreamRequest, or larger than MAX_REQUEST_BYTES, fails the stream
        (INVALID_ARGUMENT)."""
        reader = self._reader
        while True:
            try:
                header = await reader.readexactly(HEADER.size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            (size,) = HEADER.unpack(header)
            if size > MAX_REQUEST_BYTES:
                raise invalid("frame", f"{size} bytes: at most {MAX_REQUEST_BYTES} per frame")
            try:
                body = await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            try:
                yield stream_pb2.StreamRequest.FromString(body)
            except DecodeError as err:
                raise invalid("frame", f"not a StreamRequest: {err}") from err

    async def send(self, message: Message | bytes) -> None:
        """One response as a frame; waits while the socket's buffer is full (the client
        does not read), as a gRPC write waits for flow control."""
        data = message if isinstance(message, bytes) else message.SerializeToString()
        self._writer.writelines((HEADER.pack(len(data)), data))
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


class FrameListener:
    """The sidecar's frame socket, ``sidecar-ID.frames`` in ``directory``: served from the
    first stream that asks for it until :meth:`close`."""

    def __init__(self, directory: Path, sidecar_id: str) -> None:
        self.path = directory / local_socket.frame_socket_name(sidecar_id)
        self._server: asyncio.Server | None = None
        self._starting = asyncio.Lock()
        self._waiting: dict[bytes, asyncio.Future[FrameConnection]] = {}

    async def _start(self) -> None:
        async with self._starting:
            if self._server is not None:
                return
            # A killed run's file is stale; one a live process serves is an error.
            await asyncio.to_thread(local_socket.claim, self.path)
            server = await asyncio.start_unix_server(self._accepted, path=str(self.path))
            os.chmod(self.path, local_socket.SOCKET_MODE)
            self._server = server
            log.info("frame socket listening", path=str(self.path))

    async def open(self) -> bytes:
        """A new stream's token: its connection is :meth:`attached` once the client sent it.
        INVALID_ARGUMENT on ``open.frame_socket`` when the socket cannot be served (its
        path too long, say: the client then opens without it, never an internal error it
        would hand to the application)."""
        try:
            await self._start()
        except OSError as err:
            log.warning("frame socket not served", path=str(self.path), error=str(err))
            raise invalid("open.frame_socket", f"the frame socket cannot be served: {err}") from err
        token = secrets.token_bytes(TOKEN_BYTES)
        self._waiting[token] = asyncio.get_running_loop().create_future()
        return token

    async def attached(self, token: bytes, timeout: float | None = None) -> FrameConnection:
        """The connection that sent ``token``; INVALID_ARGUMENT on ``open.frame_socket``
        if none did within ``timeout`` (default ATTACH_SECONDS)."""
        timeout = ATTACH_SECONDS if timeout is None else timeout
        waiting = self._waiting[token]
        try:
            async with asyncio.timeout(timeout):
                return await waiting
        except TimeoutError:
            if waiting.done() and not waiting.cancelled():
                waiting.result().close()
            raise invalid(
                "open.frame_socket",
                f"the frame socket {self.path.name} was not connected within {timeout:g} s",
            ) from None
        except BaseException:
            # Cancelled (the call went) just as the client connected: nobody takes it.
            if waiting.done() and not waiting.cancelled():
                waiting.result().close()
            raise
        finally:
            self._waiting.pop(token, None)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(TOKEN_SECONDS):
                (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                token = await reader.readexactly(size) if size == TOKEN_BYTES else b""
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            token = b""
        waiting = self._waiting.get(token) if token else None
        if waiting is None or waiting.done():
            log.warning("frame socket: a connection without a waiting stream's token")
            writer.close()
            return
        waiting.set_result(FrameConnection(reader, writer))

    def close(self) -> None:
        """Stop listening and remove the file (connected streams end with their calls)."""
        for waiting in self._waiting.values():
            waiting.cancel()
        self._waiting.clear()
        if self._server is not None:
            self._server.close()
            self._server = None
            with contextlib.suppress(OSError):
                local_socket.release(self.path)


def check_open(listener: FrameListener | None, peer: str) -> None:
    """A Stream's ``open.frame_socket`` is served over the local socket only."""
    if listener is None or not peer.startswith("unix:"):
        raise invalid("open.frame_socket", FRAMES_LOCAL_ONLY)
