"""The floor of any sidecar written in Python (``bench_pod_cost --floor``, path ``dr``).

Two processes doing the least a relay with the sidecar's guarantee can do: the **relay**
reads with confluent-kafka as the direct consumer that commits per batch does (``poll``
then what is already fetched), sends each batch to its **reader** as one frame on a Unix
socket, waits for the reader's ack and commits the batch synchronously before it reads
on. No gRPC, no event loop, no leases, no second consumer, no redelivery, no metrics: what
is left of a sidecar's cost when everything that is not the records' hand-off is gone.
Its CPU over the direct consumer's is the least any Python sidecar can reach.

A frame: a 4-byte little-endian length, then per record a 4-byte length and the value. An
ack: the 4-byte count of the records acked. Light imports only (see ``pod_readers``).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

LENGTH = struct.Struct("<I")
CONNECT_SECONDS = 60.0
STOP_CHECK_SECONDS = 1.0  # a blocked read looks at the stop event this often
MAX_RECORDS = 1_000  # per batch, as the other readers


def encode(values: list[bytes]) -> bytes:
    """One frame's payload: each value after its 4-byte length."""
    return b"".join(LENGTH.pack(len(v)) + v for v in values)


def decode(payload: bytes) -> list[bytes]:
    """The values of a frame's payload (the inverse of :func:`encode`)."""
    values, at, end = [], 0, len(payload)
    while at < end:
        (n,) = LENGTH.unpack_from(payload, at)
        at += LENGTH.size
        values.append(payload[at : at + n])
        at += n
    if at != end:
        raise ValueError("a frame's last record runs past its end")
    return values


def read_exactly(sock: socket.socket, n: int, stop: Any) -> bytes | None:
    """``n`` bytes from ``sock``; None when the peer closed it or ``stop`` is set."""
    chunks, left = [], n
    while left:
        try:
            chunk = sock.recv(left)
        except TimeoutError:
            if stop.is_set():
                return None
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def relay(bootstrap: str, topic: str, partitions: int, path: str, stop: Any) -> None:
    """The relay process: serves one reader at ``path`` until it closes or ``stop``."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(STOP_CHECK_SECONDS)
        while not stop.is_set():  # the reader starts after the mesh's, which may take minutes
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(STOP_CHECK_SECONDS)
                _serve(conn, bootstrap, topic, partitions, stop)
            return
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)


def _serve(conn: socket.socket, bootstrap: str, topic: str, partitions: int, stop: Any) -> None:
    """Each batch read as ``dc`` reads it, sent as a frame, acked, committed synchronously."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-pod-dr-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
        while not stop.is_set():
            m = consumer.poll(1.0)
            if m is None:
                continue
            batch = [m, *consumer.consume(MAX_RECORDS - 1, 0)]
            payload = encode([msg.value() or b"" for msg in batch if msg.error() is None])
            conn.sendall(LENGTH.pack(len(payload)) + payload)
            if read_exactly(conn, LENGTH.size, stop) is None:
                return
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def connect(path: str, stop: Any) -> socket.socket:
    """The reader's connection to the relay at ``path`` (it may not be listening yet)."""
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            sock.settimeout(STOP_CHECK_SECONDS)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if stop.is_set() or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
