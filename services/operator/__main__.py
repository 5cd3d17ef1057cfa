"""``ds-operator``: reconciles DsGroup resources through the assigner's admin API."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

from services.operator.app import run
from services.operator.settings import OperatorSettings, parser
from services.runtime.logging import configure
from services.runtime.settings import load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    settings = load_or_exit(OperatorSettings, parser(), argv)
    configure("ds-operator", fmt=settings.log_format, level=settings.log_level)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(settings, stop)

    asyncio.run(serve())


if __name__ == "__main__":
    main()
