"""A service's process loads only what it uses (issue 34): the dev console's ``rich``
only when the console format is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from services.runtime.lean import DEV_CONSOLE_MODULES, forgo_dev_console, wants_console


@pytest.mark.parametrize(
    ("argv", "env", "console"),
    [
        ([], {}, False),  # the default: JSON lines
        (["--log-format", "console"], {}, True),
        (["--log-format=console"], {}, True),
        (["--log-format", "console", "--log-format", "json"], {}, False),  # the last wins
        (["--log-format", "json"], {"DS_LOG_FORMAT": "console"}, False),  # flags win
        ([], {"DS_LOG_FORMAT": "Console"}, True),
        (["--group", "console"], {}, False),
        (["--log-format"], {}, False),  # argparse refuses it later
    ],
)
def test_wants_console(argv: list[str], env: dict[str, str], console: bool) -> None:
    assert wants_console(argv, env) is console


def test_forgo_blocks_the_dev_console_modules_unless_asked_for() -> None:
    modules: dict[str, Any] = {}
    assert forgo_dev_console([], {}, modules)
    assert modules == dict.fromkeys(DEV_CONSOLE_MODULES)
    already: dict[str, Any] = {"rich": sys}  # imported before: left alone
    forgo_dev_console([], {}, already)
    assert already["rich"] is sys
    asked: dict[str, Any] = {}
    assert not forgo_dev_console(["--log-format", "console"], {}, asked)
    assert asked == {}


def test_a_production_sidecar_process_never_imports_rich_and_logs_json() -> None:
    """The sidecar's entry point, up to its settings and logging, in a process of its own."""
    code = (
        "import sys\n"
        "from services.consumer_sidecar import __main__ as m\n"
        "try:\n"
        "    m.main(['--group', 'g', '--log-level', 'nonsense'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('rich' in sys.modules and sys.modules['rich'] is not None)\n"
        "import structlog\n"
        "print(type(structlog.dev).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DS_LOG_FORMAT": "json"},
        check=True,
    ).stdout.split()
    assert out[-2:] == ["False", "module"]


# The client's own modules: what only an application runs (binding, reading, acking).
CLIENT_ONLY = (
    "dsclient.client",
    "dsclient.binding",
    "dsclient.stream",
    "dsclient.acker",
    "dsclient.columns",
    "dsclient.shared",
    "dsclient.sidecar",
    "dsclient.batch",
)


@pytest.mark.parametrize("service", ["services.consumer_sidecar.app", "services.assigner.app"])
def test_a_server_loads_only_the_client_modules_it_shares(service: str) -> None:
    """The servers import what they share with the client (reasons, records, the local
    socket, connection); importing any of those must not load the client itself."""
    code = f"import sys, {service}\nprint(sorted(m for m in sys.modules if m in {CLIENT_ONLY!r}))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "[]"
    assert (
        "dsclient.reasons"
        in subprocess.run(
            [sys.executable, "-c", f"import sys, {service}; print(sorted(sys.modules))"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )


def test_the_client_public_names_resolve_on_first_use() -> None:
    import dsclient

    for name in dsclient.__all__:
        assert getattr(dsclient, name) is not None
        assert name in dir(dsclient)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        dsclient.nope  # noqa: B018
