"""An application container for failure tests: a real process reading a group with DsClient,
that a test kills (SIGKILL) while it holds records delivered and not acked.

    python -m tests.support.app_process --group G --assigner HOST:PORT --client-id ID \\
        --out FILE [--ack-for SECONDS] [--stream]

It fetches (or reads the Stream RPC with ``--stream``) and acks every batch for
``--ack-for`` seconds, then keeps reading without acking, until killed. Every record it
receives is a line ``D seq partition offset epoch delivery_count`` in ``--out`` (written and
flushed before the ack is sent); before each ack, a line ``T seq ... .`` for the seqs of the
batch, and once the sidecar answered, ``A seq ... .`` when it accepted the whole batch
(``P`` when only part of it). So after the kill the file says exactly what it had
delivered and which of those acks were accepted; an ack sent and not answered when it died
counts as partly accepted (it may have been); the rest were in flight when it died.

:class:`AppContainer` is how a test runs one: started in its own session, killed with
SIGKILL, its file read back as an :class:`AppLog`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dsclient import DsClient

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AppLog:
    """What an app process wrote: each delivery (seq, partition, offset, epoch, delivery
    count) in order, the seqs whose ack the sidecar accepted, and those whose ack may or may
    not have been (batches only partly accepted, or acks unanswered at the kill)."""

    deliveries: list[tuple[int, int, int, int, int]]
    acked: set[int]
    partly: set[int]
    # seq -> when it last reached the application (time.monotonic(): CLOCK_MONOTONIC is
    # the same clock in every process on the host, so the test can compare it with its own)
    delivered_at: dict[int, float] = field(default_factory=dict)

    @property
    def unacked(self) -> set[int]:
        """Delivered, and certainly not acked: in flight when the process died."""
        return {d[0] for d in self.deliveries} - self.acked - self.partly

    @classmethod
    def read(cls, path: Path) -> AppLog:
        deliveries: list[tuple[int, int, int, int, int]] = []
        delivered_at: dict[int, float] = {}
        acked: set[int] = set()
        partly: set[int] = set()
        sent: set[int] = set()
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["D"] and len(parts) == 7:
                seq, partition, offset, epoch, count = map(int, parts[1:6])
                deliveries.append((seq, partition, offset, epoch, count))
                delivered_at[seq] = float(parts[6])
            elif parts[:1] in (["A"], ["P"], ["T"]) and parts[-1] == ".":  # not cut by the kill
                seqs = {int(x) for x in parts[1:-1]}
                {"A": acked, "P": partly, "T": sent}[parts[0]].update(seqs)
        # An ack sent and not answered before the kill may have been accepted: not known.
        return cls(deliveries, acked, partly | (sent - acked - partly), delivered_at)


class AppContainer:
    """One application container: this module as a process reading ``group`` as
    ``client_id``, acking for ``ack_for`` seconds, then holding what it reads until
    :meth:`kill`. Its deliveries and acks go to ``out``, its output to ``log``."""

    def __init__(
        self,
        group: str,
        assigner: str,
        client_id: str,
        out: Path,
        log: Path,
        *,
        ack_for: float,
        stream: bool = False,
    ) -> None:
        self.client_id = client_id
        self.out = out
        argv = [
            sys.executable, "-m", "tests.support.app_process", "--group", group,
            "--assigner", assigner, "--client-id", client_id, "--out", str(out),
            "--ack-for", str(ack_for), *(["--stream"] if stream else []),
        ]  # fmt: skip
        with log.open("ab") as output:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )

    def read(self) -> AppLog:
        """What it has written so far (an empty log before its first line)."""
        if not self.out.exists():
            return AppLog([], set(), set())
        return AppLog.read(self.out)

    def kill(self) -> AppLog:
        """SIGKILL (a container killed, nothing flushed, nothing given back), and what it
        had delivered and acked. Idempotent."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        return self.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--assigner", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ack-for", type=float, default=5.0)
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    stop_acking = time.monotonic() + args.ack_for
    with (
        open(args.out, "a", buffering=1) as out,
        DsClient(
            args.group,
            client_id=args.client_id,
            assigner=args.assigner,
            use_stream_rpc=args.stream,
        ) as client,
    ):
        out.write("S started\n")
        for batch in client.stream(max_records=100):
            now = time.monotonic()
            out.write(
                "".join(
                    f"D {int(r.key or b'-1')} {r.partition} {r.offset} {r.lease_epoch} "
                    f"{r.delivery_count} {now:.6f}\n"
                    for r in batch
                )
            )
            if time.monotonic() < stop_acking:
                seqs = " ".join(str(int(r.key or b"-1")) for r in batch)
                out.write(f"T {seqs} .\n")  # the ack is on its way: its outcome unknown
                accepted = client.ack(batch)
                out.write(f"{'A' if accepted == len(batch) else 'P'} {seqs} .\n")


if __name__ == "__main__":
    main()
