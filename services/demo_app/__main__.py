"""``ds-demo-app``: the compose stack's sample application (see the package docstring)."""

from __future__ import annotations

import signal
from collections.abc import Sequence

from services.demo_app.settings import DemoAppSettings
from services.runtime.logging import configure
from services.runtime.settings import base_parser, load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser("ds-demo-app", "Binds a group, fetches, acks, and logs what it received.")
    parser.add_argument("--group", help="group to read (DS_GROUP)")
    parser.add_argument("--assigner", help="assigner HOST:PORT (DS_ASSIGNER)")
    parser.add_argument("--client-id", dest="client_id", help="(DS_CLIENT_ID)")
    settings = load_or_exit(DemoAppSettings, parser, argv)
    configure("ds-demo-app", fmt=settings.log_format, level=settings.log_level)
    from services.demo_app.app import DemoApp  # after logging is configured

    app = DemoApp(settings)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: app.request_stop())
    app.run()


if __name__ == "__main__":
    main()
