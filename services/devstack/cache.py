"""Where the devstack keeps downloaded and built artefacts (Kafka jars, consul binary)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """``$DS_CACHE_DIR`` or ``~/.cache/dataservice``."""
    return Path(os.environ.get("DS_CACHE_DIR", "~/.cache/dataservice")).expanduser()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` so only one process fetches or builds at once.

    The kernel drops the lock if the holder dies, so a killed fetch never wedges the next.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
