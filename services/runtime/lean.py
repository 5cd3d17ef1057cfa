"""What a service's process loads: only what it uses (issue 34).

Every sidecar pod pays for the modules its process imports. structlog's ``dev`` module
(imported with structlog itself) loads ``rich`` for pretty tracebacks when it is installed,
about 5 MiB, although production logs are JSON lines. An entry point calls
:func:`forgo_dev_console` before anything imports structlog: unless the console format is
asked for on the command line or in ``DS_LOG_FORMAT``, ``rich`` is made unimportable in
this process (``sys.modules[name] = None``, the import system's own way to say "not
here"), and structlog falls back to its plain renderer. A console format set only in a
``--config`` file still works, with plain tracebacks.

Never called by a library (DsClient runs in the application's process, whose modules are
its own).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

DEV_CONSOLE_MODULES = ("rich",)


def wants_console(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether ``--log-format console`` (the last one wins, as argparse reads it) or
    ``DS_LOG_FORMAT=console`` asks for the console format; flags win over the environment."""
    chosen: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--log-format" and i + 1 < len(argv):
            chosen = argv[i + 1]
        elif arg.startswith("--log-format="):
            chosen = arg.partition("=")[2]
    if chosen is None:
        chosen = environ.get("DS_LOG_FORMAT", "")
    return chosen.strip().lower() == "console"


def forgo_dev_console(
    argv: Sequence[str], environ: Mapping[str, str], modules: dict[str, Any] | None = None
) -> bool:
    """Make :data:`DEV_CONSOLE_MODULES` unimportable unless the console format is asked
    for; True if they were. ``modules``: ``sys.modules`` (a test passes its own)."""
    if wants_console(argv, environ):
        return False
    target: dict[str, Any] = sys.modules if modules is None else modules
    for name in DEV_CONSOLE_MODULES:
        if name not in target:  # already imported: too late, and harmless to keep
            target[name] = None
    return True
