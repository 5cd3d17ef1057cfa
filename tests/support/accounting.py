"""Record-accounting summary lines of the failure tests, printed at the end of the run.

A failure test prints one line per fault (produced, received, lost, duplicates and why);
pytest captures the output of a passing test, so the line would only be seen when the test
fails. :func:`report` prints it and keeps it; the root conftest's terminal summary prints
every kept line under "record accounting", so CI's output carries the figures too."""

from __future__ import annotations

LINES: list[str] = []


def report(line: str) -> None:
    """Print ``line`` (seen with ``-s``) and keep it for the end-of-run summary."""
    print(f"\n{line}", flush=True)
    LINES.append(line)
