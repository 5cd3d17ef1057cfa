"""``ds-sidecar``: the per-pod data plane (ARCHITECTURE §2)."""

from __future__ import annotations

from collections.abc import Sequence

from services.consumer_sidecar.settings import SidecarSettings
from services.runtime import lifecycle
from services.runtime.discovery import make_discovery
from services.runtime.logging import configure
from services.runtime.settings import base_parser, load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(
        "ds-sidecar", "Consumes leased Kafka partitions and serves them over gRPC."
    )
    parser.add_argument("--id", help="stable sidecar id, default: the hostname (DS_ID)")
    parser.add_argument("--group", help="consumer group to serve (DS_GROUP)")
    parser.add_argument("--assigner", help="assigner HOST:PORT (DS_ASSIGNER)")
    parser.add_argument("--zone", help="zone / failure domain (DS_ZONE)")
    settings = load_or_exit(SidecarSettings, parser, argv)
    configure("ds-sidecar", fmt=settings.log_format, level=settings.log_level)
    from services.consumer_sidecar.app import SidecarApp  # after logging is configured

    lifecycle.run(SidecarApp(settings), settings, make_discovery(settings.consul))


if __name__ == "__main__":
    main()
