"""``ds-assigner``: the control plane (ARCHITECTURE §2)."""

from __future__ import annotations

from collections.abc import Sequence

from services.assigner.settings import AssignerSettings
from services.runtime import lifecycle
from services.runtime.discovery import make_discovery
from services.runtime.logging import configure
from services.runtime.settings import base_parser, load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser("ds-assigner", "Leases Kafka partitions to consumer sidecars.")
    settings = load_or_exit(AssignerSettings, parser, argv)
    configure("ds-assigner", fmt=settings.log_format, level=settings.log_level)
    from services.assigner.app import AssignerApp  # after logging is configured

    lifecycle.run(AssignerApp(settings), settings, make_discovery(settings.consul))


if __name__ == "__main__":
    main()
