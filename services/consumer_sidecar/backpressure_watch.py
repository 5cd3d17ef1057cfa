"""CLIENT_BACKPRESSURE: the partitions that are not fetching because the buffer is full.

The fetch thread acts on a full buffer (``fetcher.py``: it holds ``consume()`` back, then
pauses partitions past their cap); this watcher only looks, once a second while any
partition is held back, and hands the partitions held back that way to the fault hooks,
which open and resolve the fault per partition. With none held back it sleeps until the
fetch thread holds back or pauses (``PartitionTable.on_backpressure``): an idle sidecar
does not wake for it (issue 34). A suspended lease is paused too, but for fencing, not
because clients are slow: it is not named.
"""

from __future__ import annotations

import asyncio

from services.consumer_sidecar.fault_emitters import SidecarFaults
from services.consumer_sidecar.partitions import PartitionTable
from services.consumer_sidecar.wakeup import Wakeup
from services.runtime.topic_partition import TP

CHECK_SECONDS = 1.0


def backpressured(table: PartitionTable) -> list[TP]:
    """Paused past their cap, or every ready partition while consumption is held back;
    not the suspended ones."""
    holding = table.holding
    return [
        p.tp
        for p in table.snapshot()
        if (p.paused or (holding and p.ready)) and p.suspended_at is None
    ]


async def watch_backpressure(table: PartitionTable, faults: SidecarFaults) -> None:
    """Until cancelled: report what :func:`backpressured` names, again every
    :data:`CHECK_SECONDS` while it names any, else when the fetch thread holds back."""
    wake = Wakeup()
    wake.bind(asyncio.get_running_loop())
    table.on_backpressure = wake.set
    while True:
        wake.clear()
        held = backpressured(table)
        faults.backpressure(held)
        if held:
            await asyncio.sleep(CHECK_SECONDS)
        else:
            await wake.wait(None)
