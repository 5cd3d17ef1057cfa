"""Process helpers shared by the devstack servers (Kafka, Consul).

Each server runs in its own session (and so its own process group), so signals reach the
JVM or agent and any children it forks, and a Ctrl-C in the parent's terminal does not
hit them before we stop them in order.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1


class StartupError(RuntimeError):
    """A dev server did not come up; the message carries the tail of its log."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec, only where setpriv is missing (see spawn).
    # Linux only: asks the kernel to SIGKILL the child when the parent dies, so a crashed
    # pytest run does not leave JVMs eating the (shared, small) CPU budget. Failure is
    # ignored: it is a safety net, not a contract.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _with_pdeathsig(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """``argv`` made to die with its parent: run under util-linux's ``setpriv --pdeathsig``
    (the prctl happens after exec, in setpriv), else with a ``preexec_fn``.

    A ``preexec_fn`` runs Python in the forked child of a process that has threads, which
    Python's docs call unsafe: a broker restarted from a test that had gRPC clients running
    printed nothing for 3.5 minutes (never reached exec; gRPC logged "Other threads are
    currently calling into gRPC, skipping fork() handlers" and an abseil mutex check failed
    at that fork). Without ``preexec_fn`` subprocess forks and execs in C, nothing between.
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return list(argv), _die_with_parent
    return [setpriv, "--pdeathsig", "KILL", "--", *argv], None


def spawn(
    argv: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # The exact command heads each run's output: the first thing one wants when a
        # server would not start, and a restart's output stays tellable from the last.
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        command, preexec = _with_pdeathsig(argv) if die_with_parent else (list(argv), None)
        # The child keeps its own copy of the fd; ours can close right away.
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else dict(env),
            start_new_session=True,
            preexec_fn=preexec,
        )


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send ``sig`` to the process group of ``proc``; a no-op once it has been reaped."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def terminate(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    """SIGTERM the group, wait up to ``timeout`` s, then SIGKILL it. Returns the exit code.

    Safe to call on an already exited or stopped (SIGSTOP) process: SIGCONT is sent after
    SIGTERM, because a stopped process only acts on SIGTERM once it runs again.
    """
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        signal_group(proc, signal.SIGCONT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    return kill(proc)


def kill(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGKILL the group and reap the leader. Returns the exit code."""
    signal_group(proc, signal.SIGKILL)
    return proc.wait(timeout=timeout)


def wait_until(
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.25,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Poll ``ready()`` until it is true or ``timeout`` seconds pass.

    ``alive()`` returns None while the servers are running, or a description of the one
    that died: waiting on a dead process is pointless, so that fails at once.
    Raises ``StartupError`` naming ``what`` on failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        if alive is not None and (dead := alive()) is not None:
            raise StartupError(f"{what}: {dead}")
        if time.monotonic() >= deadline:
            raise StartupError(f"{what}: not ready after {timeout:.0f}s")
        time.sleep(interval)


def is_stopped(pid: int) -> bool:
    """True if ``pid`` is stopped by a signal (or gone, which counts as not running)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.NoSuchProcess:
        return True


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` (decoded leniently), or a note if it is missing."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    tail = data.decode("utf-8", errors="replace").splitlines()[-lines:]
    return "\n".join(tail)


def serve_until_signal(
    stop: Callable[[], None],
    dead: Callable[[], str | None],
    poll_interval: float = 1.0,
) -> int:
    """Block until SIGINT/SIGTERM (then ``stop()``, return 0) or a server dies (return 1).

    For the small foreground CLIs of the devstack modules.
    """
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not received:
            if (what := dead()) is not None:
                print(f"exited unexpectedly: {what}", flush=True)
                stop()
                return 1
            time.sleep(poll_interval)
        stop()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
