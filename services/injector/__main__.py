"""``ds-injector``: the mutating admission webhook that injects the dataservice sidecar."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

import structlog
from prometheus_client import CollectorRegistry

from services.injector.metrics import InjectorMetrics
from services.injector.server import InjectorServer, ReloadingCertificate
from services.injector.settings import InjectorSettings, parser
from services.injector.template import load_template
from services.runtime.logging import configure
from services.runtime.settings import ConfigError, load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    flags = parser()
    settings = load_or_exit(InjectorSettings, flags, argv)
    configure("ds-injector", fmt=settings.log_format, level=settings.log_level)
    log = structlog.get_logger("services.injector")
    try:
        template = load_template(settings.template_file)
    except ConfigError as exc:
        print(f"{flags.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    registry = CollectorRegistry()
    metrics = InjectorMetrics(registry)
    try:
        certificate = ReloadingCertificate(settings.cert_file, settings.key_file, metrics)
    except ValueError as exc:
        print(f"{flags.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    server = InjectorServer(settings.host, settings.port, certificate, template, metrics, registry)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("listening", https=f"{settings.host}:{server.port}", image=template.image)
    stop.wait()
    log.info("stopping")
    server.stop()
    log.info("stopped")


if __name__ == "__main__":
    main()
