"""``ds-notifier``: fault events to Kafka (ARCHITECTURE §5.4)."""

from __future__ import annotations

from collections.abc import Sequence

from services.notifier.settings import NotifierSettings
from services.runtime import lifecycle
from services.runtime.discovery import make_discovery
from services.runtime.logging import configure
from services.runtime.settings import base_parser, load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser("ds-notifier", "Publishes fault events to Kafka.")
    parser.add_argument(
        "--outbox-path", dest="outbox_path", help="SQLite outbox file (DS_OUTBOX_PATH)"
    )
    settings = load_or_exit(NotifierSettings, parser, argv)
    configure("ds-notifier", fmt=settings.log_format, level=settings.log_level)
    from services.notifier.app import NotifierApp  # after logging is configured

    lifecycle.run(NotifierApp(settings), settings, make_discovery(settings.consul))


if __name__ == "__main__":
    main()
