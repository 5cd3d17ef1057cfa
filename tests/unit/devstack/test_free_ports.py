"""Ports for locally started servers: never the same one twice from one process."""

from __future__ import annotations

import socket

import pytest

from services.devstack import ports
from services.devstack.ports import LOOPBACK, free_port, free_ports


def test_a_port_is_never_handed_out_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may give a released port back at once: make it do so every time.
    real = socket.socket
    given: list[int] = []

    class SamePortFirst(real):  # type: ignore[misc,valid-type]
        def bind(self, address: tuple[str, int]) -> None:
            if address[1] == 0 and given:
                try:
                    super().bind((address[0], given[0]))
                    return
                except OSError:
                    pass  # the first port is bound right now: take any
            super().bind(address)
            given.append(int(self.getsockname()[1]))

    monkeypatch.setattr(ports.socket, "socket", SamePortFirst)
    first = free_port()
    again = [free_port() for _ in range(5)]
    assert first not in again and len(set(again)) == 5
    more = free_ports(3)
    assert not set(more) & {first, *again} and len(set(more)) == 3


def test_the_ports_are_free() -> None:
    for port in free_ports(3):
        with socket.socket() as sock:
            sock.bind((LOOPBACK, port))
