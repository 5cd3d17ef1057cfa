"""dsread: the Python client's example and conformance reader (docs/client-protocol.md).

The same program exists for every client (``clients/go/cmd/dsread``, ``clients/java``), with
the same arguments and output, so ``tests/clients/`` can run one scenario against each and
``tests/bench/bench_clients.py`` can time them::

    dsread --assigner HOST:PORT --group G --client-id ID --expect N [--mode fetch|stream]
           [--idle-exit-s S] [--quiet]
           [--ca FILE] [--cert FILE --key FILE] [--server-name NAME] [--token-file FILE]
           [--sidecar-token-file FILE]
    dsread --direct --bootstrap HOST:PORT --topic T --group G --expect N [--quiet]

Through the mesh it prints ``rec <topic> <partition> <offset> <epoch> <delivery_count>`` for
every record of a batch, then acks the batch; after N distinct records it prints
``done distinct=.. received=.. acked=.. seconds=..`` and exits 0. A terminal error prints
``error <CODE> <REASON>`` on stderr and exits 3; S seconds without a new record exits 4.
``--direct`` reads the topic with confluent-kafka instead (the benchmark's baseline).

Against a secured mesh (docs/client-protocol.md §16): ``--ca`` speaks TLS to the assigner
and every sidecar, verifying them with that CA; ``--cert``/``--key`` add a client
certificate (mTLS), both or neither; ``--server-name`` is the name checked in the servers'
certificates; ``--token-file`` sends ``authorization: Bearer <token>`` on every call, the
file read again when it changes, and needs ``--ca`` (a token never goes in the clear);
``--sidecar-token-file`` is the token sent to sidecars instead (audience ``ds-sidecar``: each
service accepts only tokens minted for it). Without any of them the ``DS_TLS__*`` variables
apply, as for any DsClient.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from dsclient.connection import ConnectionSettings

EXIT_ERROR, EXIT_IDLE, EXIT_USAGE = 3, 4, 2


class Counter:
    """Distinct and total records seen, and the time from the first to the last."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int, int]] = set()
        self.received = 0
        self.acked = 0
        self.first = 0.0
        self.last = 0.0
        self.progress = time.monotonic()

    def add(self, topic: str, partition: int, offset: int) -> None:
        now = time.monotonic()
        self.first = self.first or now
        self.last = now
        self.received += 1
        key = (topic, partition, offset)
        if key not in self.seen:
            self.seen.add(key)
            self.progress = now

    def done_line(self) -> str:
        seconds = self.last - self.first if self.first else 0.0
        return (
            f"done distinct={len(self.seen)} received={self.received} "
            f"acked={self.acked} seconds={seconds:.3f}"
        )


def _error_line(error: BaseException) -> str:
    """``error <CODE> <REASON>`` for a gRPC failure (the status, or the one it caused)."""
    from dsclient.reasons import error_info

    cause = error if isinstance(error, grpc.RpcError) else error.__cause__
    if isinstance(cause, grpc.RpcError) and isinstance(cause, grpc.Call):
        info = error_info(cause)
        reason = info.reason if info is not None and info.reason else "-"
        return f"error {cause.code().name} {reason}\n{cause.details()}"
    return f"error UNKNOWN - \n{error}"


def _idle_watch(counter: Counter, idle_s: float) -> None:
    """End the process (exit 4) once no new record came for ``idle_s`` seconds."""
    while True:
        time.sleep(0.5)
        if time.monotonic() - counter.progress > idle_s:
            print("error DEADLINE_EXCEEDED idle", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_IDLE)


TLS_FLAGS = ("ca", "cert", "key", "server_name", "token_file", "sidecar_token_file")


def connection(args: argparse.Namespace) -> ConnectionSettings | None:
    """The connection the TLS flags ask for, every file read once (OSError or ValueError
    naming one that cannot be read); None (the client's default, from the ``DS_TLS__*``
    variables) when no flag is given."""
    from dsclient.connection import DEFAULT_SETTINGS, TlsConfig
    from dsclient.connection.credentials import check_readable

    if not any(getattr(args, flag) for flag in TLS_FLAGS):
        return None
    tls = TlsConfig(
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.key,
        token_file=args.token_file,
        sidecar_token_file=args.sidecar_token_file,
        server_name=args.server_name,
    )
    check_readable(tls)
    return DEFAULT_SETTINGS.with_tls(tls)


def read_mesh(args: argparse.Namespace) -> int:
    from dsclient import ClientError, DsClient

    try:
        settings = connection(args)
    except (OSError, ValueError) as error:
        print(f"dsread: {error}", file=sys.stderr)
        return EXIT_USAGE
    counter = Counter()
    out = sys.stdout
    if args.mode == "stream":  # a Stream blocks until a batch comes: watch for idleness aside
        threading.Thread(target=_idle_watch, args=(counter, args.idle_exit_s), daemon=True).start()
    try:
        with DsClient(
            args.group,
            client_id=args.client_id,
            assigner=args.assigner,
            use_stream_rpc=args.mode == "stream",
            connection=settings,
        ) as client:
            batches = client.stream(500)  # a generator: closed below, ending its streams
            while len(counter.seen) < args.expect:
                if time.monotonic() - counter.progress > args.idle_exit_s:
                    print("error DEADLINE_EXCEEDED idle", file=sys.stderr)
                    return EXIT_IDLE
                batch = client.fetch(500, max_wait=0.5) if args.mode == "fetch" else next(batches)
                if not batch:
                    continue
                for r in batch:
                    counter.add(r.topic, r.partition, r.offset)
                    if not args.quiet:
                        out.write(
                            f"rec {r.topic} {r.partition} {r.offset} {r.lease_epoch} "
                            f"{r.delivery_count}\n"
                        )
                out.flush()
                counter.acked += client.ack(batch)
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    except (ClientError, grpc.RpcError) as error:
        print(_error_line(error), file=sys.stderr)
        return EXIT_ERROR
    print(counter.done_line(), flush=True)
    return 0


def read_direct(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer

    counter = Counter()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([args.topic])
    try:
        while len(counter.seen) < args.expect:
            if time.monotonic() - counter.progress > args.idle_exit_s:
                print("error DEADLINE_EXCEEDED idle", file=sys.stderr)
                return EXIT_IDLE
            messages = consumer.consume(500, timeout=0.5)
            for m in messages:
                if m.error():
                    continue
                topic, partition, offset = (
                    str(m.topic()),
                    int(m.partition() or 0),
                    int(m.offset() or 0),
                )
                counter.add(topic, partition, offset)
                if not args.quiet:
                    sys.stdout.write(f"rec {topic} {partition} {offset} 0 1\n")
            if messages:
                consumer.commit(asynchronous=False)
                counter.acked += len(messages)
    finally:
        consumer.close()
    print(counter.done_line(), flush=True)
    return 0


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dsread", description=__doc__.split("\n")[0])
    parser.add_argument("--assigner", default="127.0.0.1:7070")
    parser.add_argument("--group", required=True)
    parser.add_argument("--client-id", default=None)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--mode", choices=("fetch", "stream"), default="fetch")
    parser.add_argument("--idle-exit-s", type=float, default=60.0)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--bootstrap")
    parser.add_argument("--topic")
    parser.add_argument("--ca", type=Path, help="TLS: the CA the servers are verified with")
    parser.add_argument("--cert", type=Path, help="mTLS: the client certificate (with --key)")
    parser.add_argument("--key", type=Path, help="mTLS: the client key (with --cert)")
    parser.add_argument("--server-name", help="the name checked in the servers' certificates")
    parser.add_argument("--token-file", type=Path, help="a bearer token sent on every call")
    parser.add_argument(
        "--sidecar-token-file",
        type=Path,
        help="the bearer token sent to sidecars instead (audience ds-sidecar)",
    )
    args = parser.parse_args(argv)
    if args.expect < 1:
        parser.error("--expect must be at least 1")
    if args.direct and not (args.bootstrap and args.topic):
        parser.error("--direct needs --bootstrap and --topic")
    if args.direct and any(getattr(args, flag) for flag in TLS_FLAGS):
        parser.error("TLS flags are for the mesh: --direct takes none")
    if (args.cert is None) != (args.key is None):
        parser.error("--cert and --key go together")
    if (args.token_file or args.sidecar_token_file) is not None and args.ca is None:
        parser.error("--token-file needs --ca: a token is never sent over plaintext")
    if (args.cert or args.server_name) and args.ca is None:
        # Without --ca the channel is plaintext: a certificate or a server name would be
        # ignored silently (as Go's and Java's dsread refuse it too).
        parser.error("--cert, --key and --server-name need --ca: without it there is no TLS")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    return read_direct(args) if args.direct else read_mesh(args)


if __name__ == "__main__":
    sys.exit(main())
