"""Where the devstack keeps downloaded and built artefacts (Kafka jars, consul binary), and
the one way jars are fetched from Maven Central into it."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
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


_MARKER = ".fetched"  # written into the jars folder after a complete fetch; the pom's sha256


def ensure_maven_jars(pom: Path, dest: Path, expect_glob: str, what: str) -> Path:
    """``dest`` holding the runtime dependencies of ``pom`` (``mvn dependency:copy-
    dependencies``), fetched once and again only when the pom changes: the marker file
    stores the pom's hash, so a version bump re-fetches instead of mixing old and new jars
    in one classpath. Concurrent callers wait on a lock; ``expect_glob`` names a jar a
    complete fetch must contain."""
    want = hashlib.sha256(pom.read_bytes()).hexdigest()
    if _fetched_hash(dest) == want:
        return dest
    with file_lock(dest.parent / "fetch.lock"):
        # Another process may have finished the fetch while we waited for the lock.
        if _fetched_hash(dest) != want:
            _fetch(pom, dest, expect_glob, what)
            (dest / _MARKER).write_text(want + "\n")
    return dest


def _fetched_hash(dest: Path) -> str | None:
    try:
        return (dest / _MARKER).read_text().strip()
    except OSError:
        return None


def _fetch(pom: Path, dest: Path, expect_glob: str, what: str) -> None:
    # Fetch into a fresh sibling and swap it in, so a stale jar (e.g. an old slf4j-api)
    # never survives next to its replacement and a failed fetch leaves nothing half-done.
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [
        "mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={partial}",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not any(partial.glob(expect_glob)):
        raise RuntimeError(
            f"fetching {what} failed ({' '.join(argv)}), exit {result.returncode}:\n"
            f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)
