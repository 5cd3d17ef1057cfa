"""``ds-sidecar``: the per-pod data plane (ARCHITECTURE §2)."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Sequence

from services.runtime.lean import forgo_dev_console

GEN0_THRESHOLD = 50_000
# glibc mallopt parameters (malloc.h) and the values the sidecar runs with.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's maximum
TRIM_THRESHOLD = 64 * 1024 * 1024


def tune_malloc() -> bool:
    """Keep the multi-MiB buffers of each Fetch/Stream response on the heap.

    A response of 10,000 1-KiB records is ~10 MiB, copied a few times on its way out
    (slice, protobuf arena, serialization, gRPC). glibc mmap()s blocks that large and
    returns them (and any free heap top above 2x that) to the kernel when freed, so every
    response page-faulted ~40 MiB of fresh zeroed memory: sending 10 MiB messages took
    ~7 ms of CPU per MiB, 2.4 ms with these thresholds, which keep the blocks for reuse
    (at most TRIM_THRESHOLD of free heap). False where mallopt is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def main(argv: Sequence[str] | None = None) -> None:
    # Before anything imports structlog (the settings do): no dev console in production.
    forgo_dev_console(sys.argv[1:] if argv is None else argv, os.environ)
    from services.consumer_sidecar.settings import SidecarSettings
    from services.runtime import lifecycle
    from services.runtime.discovery import make_discovery
    from services.runtime.logging import configure
    from services.runtime.settings import base_parser, load_or_exit

    parser = base_parser(
        "ds-sidecar", "Consumes leased Kafka partitions and serves them over gRPC."
    )
    parser.add_argument("--id", help="stable sidecar id, default: the hostname (DS_ID)")
    parser.add_argument("--group", help="consumer group to serve (DS_GROUP)")
    parser.add_argument("--assigner", help="assigner HOST:PORT (DS_ASSIGNER)")
    parser.add_argument("--zone", help="zone / failure domain (DS_ZONE)")
    parser.add_argument(
        "--uds-dir", help="also serve on a Unix domain socket in this directory (DS_UDS_DIR)"
    )
    settings = load_or_exit(SidecarSettings, parser, argv)
    configure("ds-sidecar", fmt=settings.log_format, level=settings.log_level)
    from services.consumer_sidecar.app import SidecarApp  # after logging is configured

    app = SidecarApp(settings)
    # Every consume() batch is thousands of confluent-kafka Messages, GC-tracked objects
    # that live for one batch: at the default gen0 threshold (700) each batch ran
    # collections, and consume() took about twice as long. Start-up objects (modules,
    # gRPC, protobuf) are frozen out of the collector, and gen0 collects after
    # GEN0_THRESHOLD net allocations.
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, *gc.get_threshold()[1:])
    tune_malloc()
    lifecycle.run(app, settings, make_discovery(settings.consul))


if __name__ == "__main__":
    main()
