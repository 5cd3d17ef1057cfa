"""What a process costs, read from ``/proc`` (Linux): CPU seconds, resident memory and
context switches (wake-ups) over all its threads.

The parsers take the files' text, so they are tested without a process; :func:`read_usage`
reads them for a pid. A thread that ended between two readings takes its switches with it
(``/proc/PID/task`` lists live threads only): the services measured keep their threads.

CPU comes two ways. ``/proc/PID/stat`` counts the whole process, threads that ended
included, in clock ticks (10 ms): over a 5 s window that is 0.2 % of a core either way,
as much as an idle sidecar's target leaves (issue 34). Each thread's ``schedstat`` counts
nanoseconds on the CPU, of the live threads only. :func:`usage_rate` takes the
nanoseconds unless they fall short of the ticks by more than the ticks' rounding (a
thread that ended took its time with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    """One reading: CPU seconds used so far, resident bytes now, and the context switches
    of the process's live threads so far (voluntary: the thread slept and was woken)."""

    cpu: float
    rss: int
    voluntary: int
    involuntary: int
    # Seconds on the CPU of the live threads (schedstat, nanoseconds); None without it.
    ran: float | None = None


@dataclass(frozen=True)
class UsageRate:
    """Between two readings: cores kept busy, wake-ups per second, resident bytes at the end."""

    cores: float
    wakeups: float
    rss: int


def stat_cpu_ticks(stat: str) -> int:
    """User + system clock ticks from ``/proc/PID/stat``. The command name in parentheses
    may hold spaces and parentheses: the fields follow its last ')'."""
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of proc(5) (utime, stime) are the 12th and 13th after the name.
    return int(fields[11]) + int(fields[12])


def schedstat_seconds(schedstat: str) -> float:
    """Seconds on the CPU from a task's ``/proc/PID/task/TID/schedstat`` (its first field,
    nanoseconds; the others are the time spent waiting to run and the timeslices)."""
    return int(schedstat.split()[0]) / 1e9


def _ran(task: Path) -> float | None:
    try:
        return schedstat_seconds((task / "schedstat").read_text())
    except (OSError, IndexError, ValueError):
        return None  # no schedstats in this kernel, or the thread ended meanwhile


def _plus_ran(total: float | None, task: Path) -> float | None:
    """``total`` plus the task's time on the CPU; None once any task's is unknown."""
    seconds = _ran(task)
    return None if total is None or seconds is None else total + seconds


def status_fields(status: str) -> dict[str, int]:
    """The numeric fields of ``/proc/PID/status`` (or a task's): ``kB`` values in bytes."""
    out: dict[str, int] = {}
    for line in status.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 1 and parts[0].isdigit():
            out[name] = int(parts[0])
        elif len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
            out[name] = int(parts[0]) * 1024
    return out


def read_usage(pid: int) -> Usage:
    """A :class:`Usage` of ``pid`` now."""
    proc = Path(f"/proc/{pid}")
    cpu = stat_cpu_ticks((proc / "stat").read_text()) / TICKS_PER_SECOND
    rss = status_fields((proc / "status").read_text()).get("VmRSS", 0)
    voluntary = involuntary = 0
    ran: float | None = 0.0
    for task in proc.glob("task/*"):
        try:
            fields = status_fields((task / "status").read_text())
        except OSError:
            continue  # the thread ended meanwhile
        voluntary += fields.get("voluntary_ctxt_switches", 0)
        involuntary += fields.get("nonvoluntary_ctxt_switches", 0)
        ran = _plus_ran(ran, task)
    return Usage(cpu, rss, voluntary, involuntary, ran)


def thread_name(stat: str) -> str:
    """The thread's name (``comm``) from its ``/proc/PID/task/TID/stat``, with a trailing
    ``_N``/digits cut so a pool's threads (``event_engine``, ``rdk:broker3``) add up."""
    name = stat.split("(", 1)[1].rsplit(")", 1)[0]
    return name.rstrip("0123456789").rstrip("_") or name


def read_threads(pid: int) -> dict[str, Usage]:
    """Where ``pid``'s CPU and wake-ups go: the :class:`Usage` (``rss`` 0) of its live
    threads now, those that named themselves (librdkafka's, gRPC's) added up per name (see
    :func:`thread_name`), the others, which keep the process's name (Python < 3.14 does not
    name its threads), each on its own as ``main`` (the first) or ``tid <n>``."""
    out: dict[str, Usage] = {}
    own = thread_name((Path(f"/proc/{pid}") / "stat").read_text())
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            fields = status_fields((task / "status").read_text())
        except OSError:
            continue  # the thread ended meanwhile
        name = thread_name(stat)
        if name == own:
            name = "main" if task.name == str(pid) else f"tid {task.name}"
        prev = out.get(name, Usage(0.0, 0, 0, 0, 0.0))
        out[name] = Usage(
            prev.cpu + stat_cpu_ticks(stat) / TICKS_PER_SECOND,
            0,
            prev.voluntary + fields.get("voluntary_ctxt_switches", 0),
            prev.involuntary + fields.get("nonvoluntary_ctxt_switches", 0),
            _plus_ran(prev.ran, task),
        )
    return out


def usage_rate(before: Usage, after: Usage, seconds: float) -> UsageRate:
    """What the process used per second between two readings ``seconds`` apart."""
    if seconds <= 0:
        raise ValueError("a window of no time")
    cpu = after.cpu - before.cpu
    if before.ran is not None and after.ran is not None:
        ran = after.ran - before.ran
        if ran >= cpu - 2 / TICKS_PER_SECOND:  # none lost with a thread that ended
            cpu = ran
    return UsageRate(
        cores=cpu / seconds,
        wakeups=max(0, after.voluntary - before.voluntary) / seconds,
        rss=after.rss,
    )
