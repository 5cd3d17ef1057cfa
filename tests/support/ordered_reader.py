"""An application process for the ordering tests (issue 39): reads a group with DsClient,
"processes" each record (a short sleep), writes what it processed, then acks the batch.

    python -m tests.support.ordered_reader --group G --assigner HOST:PORT --client-id ID \\
        --out FILE [--work-ms 1.0]

Each processed record is a line ``P monotonic_ns key seq partition offset delivery_count``
in ``--out``, written and flushed before the batch's ack is sent (so a record processed and
not acked when the process is killed shows, and comes again). CLOCK_MONOTONIC is one clock
for every process of the machine, so the lines of several readers merge into the order the
records were processed in (:func:`processed`). Runs until killed or SIGTERM.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

from dsclient import DsClient


@dataclass(frozen=True)
class Processed:
    at_ns: int
    key: str
    seq: int
    partition: int
    offset: int
    deliveries: int


def processed(paths: list[Path]) -> list[Processed]:
    """Every record the readers processed, in the order they processed them."""
    out = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 7 and parts[0] == "P":
                at, key, seq, partition, offset, deliveries = parts[1:]
                out.append(
                    Processed(int(at), key, int(seq), int(partition), int(offset), int(deliveries))
                )
    return sorted(out, key=lambda p: p.at_ns)


def inversions(events: list[Processed], by: str = "key") -> int:
    """Records processed for the first time after a later record of their key (``by``
    "key") or partition ("partition") was: what an order-keeping consumer never shows.
    A record processed again (redelivered: at least once) is a duplicate, not counted."""
    seen: set[tuple[int, int]] = set()
    highest: dict[object, int] = {}
    count = 0
    for e in events:
        if (e.partition, e.offset) in seen:
            continue
        seen.add((e.partition, e.offset))
        slot: object = e.key if by == "key" else e.partition
        order = e.seq if by == "key" else e.offset
        if order < highest.get(slot, -1):
            count += 1
        highest[slot] = max(highest.get(slot, -1), order)
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--assigner", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--work-ms", type=float, default=1.0)
    args = parser.parse_args()
    work = args.work_ms / 1000
    with (
        open(args.out, "a", buffering=1) as out,
        DsClient(args.group, client_id=args.client_id, assigner=args.assigner) as client,
    ):
        while True:
            try:
                batch = client.fetch(max_records=10, max_wait=0.5)
            except Exception as exc:  # its sidecar killed: the binding moves on
                out.write(f"E {type(exc).__name__}\n")
                time.sleep(0.2)
                continue
            if not batch:
                continue
            for r in batch:
                time.sleep(random.uniform(0, 2 * work))
                key = (r.key or b"-").decode()
                seq = int(r.value or b"-1")
                out.write(
                    f"P {time.monotonic_ns()} {key} {seq} {r.partition} {r.offset} "
                    f"{r.delivery_count}\n"
                )
            try:
                client.ack(batch)
            except Exception as exc:  # refused after a lease move: the record comes again
                out.write(f"E {type(exc).__name__}\n")


if __name__ == "__main__":
    main()
