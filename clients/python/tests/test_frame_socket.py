"""The client's end of a Stream's frame socket (dsclient.frame_socket), against a plain
listening Unix socket standing in for the sidecar's: the token goes first, requests go as
length-prefixed frames, responses come back whole until the other end closes, and a
socket the client must not trust (or cannot reach) is refused before any token is sent."""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from dataservice.sidecar.v1 import stream_pb2
from dsclient.frame_socket import FrameSocket, FrameSocketError

HEADER = struct.Struct("<I")
TOKEN = bytes(range(16))


def listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


def read_frame(conn: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            assert chunk, "the client closed before a whole frame"
            data += chunk
        return data

    (size,) = HEADER.unpack(exactly(HEADER.size))
    return exactly(size)


def test_the_token_goes_first_then_requests_and_responses_are_whole_frames(
    short_dir: Path,
) -> None:
    server = listening(short_dir / "sidecar-x.frames")
    client = FrameSocket(short_dir, "sidecar-x.frames", TOKEN)
    conn, _ = server.accept()
    assert read_frame(conn) == TOKEN
    acks = stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(released=[3, 4]))
    client.send(acks)
    assert stream_pb2.StreamRequest.FromString(read_frame(conn)) == acks
    answer = stream_pb2.StreamResponse(ack_result=stream_pb2.StreamAckResult(acked_count=2))
    big = stream_pb2.StreamResponse(
        batch=stream_pb2.StreamBatch(records=[{"value": b"v" * 300_000}])  # many recv()s
    )
    payloads = [answer.SerializeToString(), big.SerializeToString(), b""]

    def write() -> None:
        # In two parts around each header: the reader reassembles them.
        for payload in payloads:
            frame = HEADER.pack(len(payload)) + payload
            conn.sendall(frame[:3])
            conn.sendall(frame[3:])
        conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    assert list(client.frames()) == payloads  # then the end: the sidecar closed its end
    writer.join(10)
    client.close()
    server.close()


def test_close_from_another_thread_ends_a_blocked_read(short_dir: Path) -> None:
    server = listening(short_dir / "f")
    client = FrameSocket(short_dir, "f", TOKEN)
    conn, _ = server.accept()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.extend(client.frames()))
    reader.start()
    client.close()
    reader.join(10)
    assert not reader.is_alive() and got == []
    with pytest.raises(OSError):
        client.send(stream_pb2.StreamRequest(credit=stream_pb2.StreamCredit(records=1)))
    conn.close()
    server.close()


def test_a_frame_cut_short_by_the_sidecar_is_the_end_not_a_frame(short_dir: Path) -> None:
    server = listening(short_dir / "f")
    client = FrameSocket(short_dir, "f", TOKEN)
    conn, _ = server.accept()
    conn.sendall(HEADER.pack(100) + b"only part of it")
    conn.close()
    assert list(client.frames()) == []
    client.close()
    server.close()


@pytest.mark.parametrize("name", ["", ".", "..", "../sidecar-x.frames", "a/b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(short_dir: Path, name: str) -> None:
    with pytest.raises(FrameSocketError, match="not a file name"):
        FrameSocket(short_dir, name, TOKEN)


def test_a_socket_in_a_directory_others_may_write_gets_no_token(short_dir: Path) -> None:
    server = listening(short_dir / "f")
    os.chmod(short_dir, 0o777)
    with pytest.raises(FrameSocketError, match="not used"):
        FrameSocket(short_dir, "f", TOKEN)
    server.settimeout(0.2)
    with pytest.raises(TimeoutError):
        server.accept()  # never connected: no token went out
    server.close()


def test_a_socket_nobody_listens_on_is_refused(short_dir: Path) -> None:
    listening(short_dir / "f").close()  # the file stays, nobody listens
    with pytest.raises(FrameSocketError, match="refused"):
        FrameSocket(short_dir, "f", TOKEN)
