"""``ds-assigner``: the control plane (ARCHITECTURE §2)."""

from __future__ import annotations

import gc
from collections.abc import Sequence

from services.assigner.settings import AssignerSettings
from services.runtime import lifecycle
from services.runtime.discovery import make_discovery
from services.runtime.logging import configure
from services.runtime.settings import base_parser, load_or_exit

# gen0 collects after this many net allocations (CPython's default: 700).
GEN0_THRESHOLD = 50_000


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser("ds-assigner", "Leases Kafka partitions to consumer sidecars.")
    settings = load_or_exit(AssignerSettings, parser, argv)
    configure("ds-assigner", fmt=settings.log_format, level=settings.log_level)
    from services.assigner.app import AssignerApp  # after logging is configured

    app = AssignerApp(settings)
    # Every heartbeat allocates a few dozen short-lived GC-tracked objects (protobuf
    # messages, coroutine frames, futures, dataclasses): at the default threshold a
    # thousand sidecars' heartbeats ran a collection many times a second, each walking
    # every session's long-lived objects that had not reached the oldest generation yet
    # (py-spy: 15-35 % of the assigner's CPU at 1,000 sidecars). Start-up objects are
    # frozen out of the collector, and gen0 collects after GEN0_THRESHOLD allocations.
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    lifecycle.run(app, settings, make_discovery(settings.consul))


if __name__ == "__main__":
    main()
