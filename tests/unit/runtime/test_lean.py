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
