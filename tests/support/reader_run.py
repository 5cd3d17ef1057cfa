"""Run a ``dsread`` and follow what it prints, line by line, with the time each came."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int
    epoch: int
    delivery_count: int
    at: float  # monotonic time the line was read


@dataclass
class ReaderRun:
    """A running ``dsread``: its ``rec`` lines as :class:`Rec`, its final ``done`` line."""

    argv: list[str]
    stderr_path: Path
    records: list[Rec] = field(default_factory=list)
    done: dict[str, float] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)

    def start(self) -> ReaderRun:
        self._err = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._err, text=True, bufsize=1
        )
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow, name="dsread-out", daemon=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            now = time.monotonic()
            with self._lock:
                if parts[:1] == ["rec"] and len(parts) == 6:
                    t, p, o, e, d = parts[1], *map(int, parts[2:])
                    self.records.append(Rec(t, p, o, e, d, now))
                elif parts[:1] == ["done"]:
                    self.done = {k: float(v) for k, v in (kv.split("=") for kv in parts[1:])}
                else:
                    self.other.append(line.rstrip())

    def distinct(self) -> int:
        with self._lock:
            return len({(r.partition, r.offset) for r in self.records})

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._thread.join(timeout=10)
            self._err.close()
        return code

    def stderr(self, lines: int = 30) -> str:
        text = self.stderr_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def copies(records: list[Rec]) -> dict[tuple[int, int], list[Rec]]:
    """Every (partition, offset) printed more than once, with each copy."""
    seen: dict[tuple[int, int], list[Rec]] = defaultdict(list)
    for r in records:
        seen[(r.partition, r.offset)].append(r)
    return {k: v for k, v in seen.items() if len(v) > 1}


def out_of_order(records: list[Rec]) -> list[str]:
    """Per-partition order: within one lease epoch, a partition's first deliveries go up."""
    last: dict[tuple[int, int], int] = {}
    bad = []
    for r in records:
        if r.delivery_count > 1:
            continue  # a redelivery may go back (client-protocol §9); first deliveries may not
        key = (r.partition, r.epoch)
        if key in last and r.offset <= last[key]:
            bad.append(f"p{r.partition} epoch {r.epoch}: {r.offset} after {last[key]}")
        last[key] = r.offset
    return bad
