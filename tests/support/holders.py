"""Who holds each partition, sampled from the sidecars themselves: the check that no
partition ever has two live holders (a lease with time left on two sidecars at once),
whatever the assigner believes."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import grpc

from tests.support.mesh import ServiceProcess
from tests.support.sidecar_probe import status


class HolderSampler:
    """Every 100 ms: which sidecars hold each partition with time left on the lease."""

    def __init__(self, sidecars: list[ServiceProcess]) -> None:
        self.sidecars = sidecars
        self.samples = 0
        self.double: list[tuple[float, int, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            held: dict[int, list[str]] = defaultdict(list)
            for sidecar in list(self.sidecars):
                try:
                    answer = status(sidecar.grpc_addr, timeout=1)
                except grpc.RpcError:
                    continue
                for p in answer.partitions:
                    if p.lease_deadline_remaining.ToNanoseconds() > 0:
                        held[p.partition].append(sidecar.log.stem)
            self.samples += 1
            for partition, holders in held.items():
                if len(holders) > 1:
                    self.double.append((time.monotonic(), partition, holders))
            self._stop.wait(0.1)

    def __enter__(self) -> HolderSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
