"""What the external-reset e2e tests share: Kafka's own offset reset tool run against a group,
and a watch of the commits the sidecars make."""

from __future__ import annotations

import threading
import time

from tests.support.kafka_tools import kafka_consumer_groups
from tests.support.offsets_reset import (
    Stack,
    committed,
)


class CommitWatch:
    """Samples Kafka's committed offsets (and their commit's lease epoch) every 50 ms."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.samples: list[tuple[float, dict[int, tuple[int, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommitWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), committed(self.stack)))
            self._stop.wait(0.05)


def tool_reset(stack: Stack, *args: str) -> dict[int, int]:
    """``kafka-consumer-groups --reset-offsets ... --execute``: partition -> NEW-OFFSET."""
    out = kafka_consumer_groups(
        stack.bootstrap, "--reset-offsets", "--group", stack.group, *args, "--execute"
    )
    print(out)
    new = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == stack.group:
            new[int(fields[2])] = int(fields[3])
    assert new, out
    return new
