"""The dev stack's sample producer: a steady trickle of JSON events into ``ds.demo``.

python -m services.dsctl.producer --bootstrap 127.0.0.1:9092 --topic ds.demo --rate 20
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import time
from collections.abc import Sequence

from confluent_kafka import Producer


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ds-demo-producer")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="ds.demo")
    parser.add_argument("--rate", type=float, default=20.0, help="records per second")
    parser.add_argument("--users", type=int, default=50, help="distinct keys")
    args = parser.parse_args(argv)

    producer = Producer(
        {"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    running = True

    def stop(_signum: int, _frame: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    interval = 1.0 / args.rate if args.rate > 0 else 1.0
    seq = 0
    next_at = time.monotonic()
    try:
        while running:
            user = f"user-{random.randrange(args.users)}"
            event = {
                "id": seq,
                "user": user,
                "amount": round(random.uniform(1, 500), 2),
                "ts_ms": int(time.time() * 1000),
            }
            producer.produce(args.topic, key=user.encode(), value=json.dumps(event).encode())
            producer.poll(0)
            seq += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        producer.flush(10)


if __name__ == "__main__":
    main()
