"""A file whose parsed contents are kept and read again when the file changes.

Certificates, keys, tokens and the policy are files an operator (or cert-manager, or a
Kubernetes secret mount) replaces while the services run; every reader of such a file goes
through :class:`WatchedFile`, so "reloaded on change" means one thing everywhere: at most
once per ``min_interval`` the file's identity (inode, size, mtime) is compared with the one
last parsed, and a change is parsed again. A file that cannot be read or parsed after a
change keeps the last good value (and raises only if there never was one), so a half-written
secret never takes a running service down.

Plain Python (no structlog, no pydantic): the connection module, which Spark workers import,
reads its token and certificate files through it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")
Stamp = tuple[int, int, int]


def _stamp(path: Path) -> Stamp:
    info = os.stat(path)
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class WatchedFile(Generic[T]):
    """``parse(bytes)`` of the file at ``path``, re-parsed when the file changes."""

    def __init__(
        self,
        path: Path | str,
        parse: Callable[[bytes], T],
        *,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._parse = parse
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: Stamp | None = None
        self._value: T | None = None
        self._checked = float("-inf")
        self.reloads = 0  # how many times a changed file was parsed (tests, metrics)

    def get(self) -> T:
        """The current value; OSError or the parser's error only while none was ever read."""
        with self._lock:
            now = self._clock()
            if self._value is not None and now - self._checked < self._min_interval:
                return self._value
            self._checked = now
            try:
                stamp = _stamp(self.path)
                if stamp != self._stamp or self._value is None:
                    value = self._parse(self.path.read_bytes())
                    self._value, self._stamp = value, stamp
                    self.reloads += 1
            except Exception:
                if self._value is None:
                    raise
            assert self._value is not None
            return self._value

    def changed(self) -> bool:
        """Whether the file differs from the one last parsed (a cheap stat)."""
        try:
            return _stamp(self.path) != self._stamp
        except OSError:
            return False
