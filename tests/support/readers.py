"""The clients under conformance test, each by its ``dsread`` command line.

Every client ships the same example program (``clients/python/dsread.py``,
``clients/go/cmd/dsread``, ``clients/java``), with the same arguments and output lines
(its module docstring in ``clients/python/dsread.py`` is the contract). A client's row names
the command that starts it and the ``make`` target that builds it; a missing build fails the
test with that target named, it is never skipped.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Reader:
    name: str
    argv: tuple[str, ...]
    built_by: str | None = None  # the make target; None: nothing to build
    artifact: Path | None = None  # must exist before the reader can run

    def command(self, *args: str) -> list[str]:
        if self.artifact is not None and not self.artifact.exists():
            raise AssertionError(f"{self.artifact} is missing: run `make {self.built_by}` first")
        return [*self.argv, *args]


READERS = {
    "python": Reader("python", (sys.executable, str(REPO / "clients/python/dsread.py"))),
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
