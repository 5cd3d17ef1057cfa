"""The clients under conformance test, each by its ``dsread`` command line.

Every client ships the same example program (``clients/python/dsread.py``,
``clients/go/cmd/dsread``, ``clients/java``), with the same arguments and output lines
(its module docstring in ``clients/python/dsread.py`` is the contract). A client's row names
the command that starts it and the ``make`` target that builds it; a missing build fails the
test with that target named, it is never skipped.

The Python reader runs as an application would: with the Python of a virtual environment
that holds the client's wheel and nothing else of the project (``make client-python``),
in isolated mode (``-I``: no ``PYTHONPATH``, no script directory on the path), so it reads
through the installed ``dsclient``, never the sources. Its ``--direct`` baseline (the
benchmark's, confluent-kafka) runs with the project's Python instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# make client-python: the wheel installed into a fresh virtual environment.
CLIENT_PYTHON = REPO / "build/client-python/venv/bin/python"
DSREAD_PY = str(REPO / "clients/python/dsread.py")


@dataclass(frozen=True)
class Reader:
    name: str
    argv: tuple[str, ...]
    built_by: str | None = None  # the make target; None: nothing to build
    artifact: Path | None = None  # must exist before the reader can run
    direct_argv: tuple[str, ...] | None = None  # for --direct, when argv cannot run it

    def command(self, *args: str) -> list[str]:
        if self.direct_argv is not None and "--direct" in args:
            return [*self.direct_argv, *args]
        if self.artifact is not None and not self.artifact.exists():
            raise AssertionError(f"{self.artifact} is missing: run `make {self.built_by}` first")
        return [*self.argv, *args]


READERS = {
    "python": Reader(
        "python",
        (str(CLIENT_PYTHON), "-I", DSREAD_PY),
        built_by="client-python",
        artifact=CLIENT_PYTHON,
        direct_argv=(sys.executable, DSREAD_PY),
    ),
    "go": Reader(
        "go",
        (str(REPO / "clients/go/bin/dsread"),),
        built_by="client-go",
        artifact=REPO / "clients/go/bin/dsread",
    ),
    "java": Reader(
        "java",
        ("java", "-jar", str(REPO / "clients/java/target/dsread.jar")),
        built_by="client-java",
        artifact=REPO / "clients/java/target/dsread.jar",
    ),
}
