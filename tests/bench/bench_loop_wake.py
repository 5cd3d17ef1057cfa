"""What one hand-off to the sidecar's event loop costs in CPU (issue 34, the twentieth pass of
docs/benchmarks/pod-cost.md).

    python tests/bench/bench_loop_wake.py [--rate 100 --window 10 --rounds 3] [--short]

The sidecar hands each batch between threads: the fetch thread wakes the event loop
(``DataSignal.notify``: ``call_soon_threadsafe``), the loop hands a commit to the commit
thread and the commit's end wakes the loop again (``asyncio.wrap_future`` on the commit
thread's future, ``OffsetCommitter.commit_async``). A sampling profile of the loop at 100
records/s finds it mostly inside ``select()``: its CPU is the wake-ups, not Python. This
measures one of them alone, in one process, at a steady rate:

* ``baseline``: a thread that sleeps until its next tick, ``--rate`` times a second, and
  does nothing else (the loop idles in ``select()`` beside it);
* ``notify``: the same thread wakes the loop at each tick (``call_soon_threadsafe`` of an
  empty callback), as the fetch thread does for each batch;
* ``future``: the loop, on its own timer, submits an empty job to a one-thread executor at
  each tick and awaits its future (``wrap_future``), as a commit goes to the commit thread
  and back: two hand-offs a tick, and none of Kafka's work;
* ``pipe``: the cheapest hand-off between two Python threads, for comparison: the ticking
  thread writes a byte to a pipe at each tick and a plain thread blocked in ``os.read()``
  takes it (the relay of ``tests/support/relay_floor.py`` is woken that way).

Printed per row: the process's CPU in millicores (median and best of ``--rounds``; read as
bench_pod_cost reads it, ``tests/support/proc_usage.py``: its threads' nanoseconds on the
CPU), what a tick adds over the baseline in microseconds of CPU (medians), and for
``notify`` and ``pipe`` the woken side's share of it: the CPU of the thread that was woken
(the loop, over the baseline's loop; the reading thread), per tick. The rest is the waking
side's (the ``write()`` that wakes a thread sleeping on the other core). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from tests.support.proc_usage import read_usage, usage_rate

MODES = ("baseline", "notify", "future", "pipe")
QUIT = b"q"  # ends the pipe's reader


def _ticking(rate: float, stop: threading.Event, tick: Callable[[], None]) -> threading.Thread:
    """A thread calling ``tick`` ``rate`` times a second, sleeping in between."""

    def run() -> None:
        period = 1.0 / rate
        due = time.monotonic()
        while not stop.is_set():
            due += period
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            tick()

    thread = threading.Thread(target=run, name="ticker", daemon=True)
    thread.start()
    return thread


def _pipe_reader(woken: list[float]) -> tuple[threading.Thread, int]:
    """A plain thread blocked in ``os.read()`` on a pipe, a byte at a time; at the byte
    ``QUIT`` it appends its CPU seconds to ``woken`` and ends. Returns it and the pipe's
    write end."""
    read_end, write_end = os.pipe()

    def run() -> None:
        cpu = time.thread_time()
        while os.read(read_end, 1) != QUIT:
            pass
        woken.append(time.thread_time() - cpu)
        os.close(read_end)

    thread = threading.Thread(target=run, name="pipe-reader", daemon=True)
    thread.start()
    return thread, write_end


async def _round(mode: str, rate: float, window: float) -> tuple[float, int, float]:
    """One window of ``mode``: (millicores, hand-offs made, CPU seconds of the woken
    thread: the loop's own for every mode but ``pipe``, the reading thread's for it)."""
    loop = asyncio.get_running_loop()
    stop = threading.Event()
    count = 0
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-commit")
    woken: list[float] = []
    reader: threading.Thread | None = None
    write_end = -1

    def handed() -> None:
        nonlocal count
        count += 1

    ticker: threading.Thread | None = None
    if mode == "baseline":
        ticker = _ticking(rate, stop, handed)
    elif mode == "notify":

        def notify() -> None:
            loop.call_soon_threadsafe(handed)

        ticker = _ticking(rate, stop, notify)
    elif mode == "pipe":
        reader, write_end = _pipe_reader(woken)

        def write() -> None:
            handed()
            os.write(write_end, b"x")

        ticker = _ticking(rate, stop, write)
    loop_cpu = time.thread_time()
    started, before = time.monotonic(), read_usage(os.getpid())
    if mode == "future":
        period = 1.0 / rate
        due = loop.time()
        while loop.time() - started < window:  # loop.time() is time.monotonic()
            due += period
            await asyncio.sleep(max(0.0, due - loop.time()))
            await asyncio.wrap_future(executor.submit(handed))
    else:
        await asyncio.sleep(window)
    # Read while the ticker and the executor's thread still run (a thread that ended
    # takes its nanoseconds with it).
    used = usage_rate(before, read_usage(os.getpid()), time.monotonic() - started)
    loop_cpu = time.thread_time() - loop_cpu
    stop.set()
    if ticker is not None:
        ticker.join()
    if reader is not None:
        os.write(write_end, QUIT)  # after the ticker's last byte
        reader.join()
        os.close(write_end)
    executor.shutdown()
    return 1000 * used.cores, count, woken[0] if woken else loop_cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0, help="hand-offs a second")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", action="store_true", help="3 rounds of 3 s")
    args = parser.parse_args()
    if args.short:
        args.window, args.rounds = 3.0, 3
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    woken: dict[str, list[float]] = {mode: [] for mode in MODES}
    counts: dict[str, int] = {}
    for _ in range(args.rounds):
        for mode in MODES:  # interleaved: a busy moment of the machine hits every row
            mcores, counts[mode], cpu = asyncio.run(_round(mode, args.rate, args.window))
            figures[mode].append(mcores)
            woken[mode].append(cpu / max(1, counts[mode]) * 1e6)  # us a tick
    print(f"load average {os.getloadavg()[0]:.2f}; {args.rate:.0f} a second, {args.rounds} "
          f"rounds of {args.window:.0f} s; millicores median / best")  # fmt: skip
    base = statistics.median(figures["baseline"])
    for mode in MODES:
        median, best = statistics.median(figures[mode]), min(figures[mode])
        extra = (median - base) / args.rate * 1000  # millicores per (1/s) -> us a tick
        added = "" if mode == "baseline" else f"; {extra:.0f} us of CPU a tick over it"
        if mode == "notify":  # the loop's own CPU over what it spends beside the baseline
            side = statistics.median(woken[mode]) - statistics.median(woken["baseline"])
            added += f", the woken loop's {side:.0f} us of it"
        elif mode == "pipe":
            added += f", the woken thread's {statistics.median(woken[mode]):.0f} us of it"
        print(f"  {mode:9s} {median:6.1f} / {best:6.1f}{added}")


if __name__ == "__main__":
    main()
