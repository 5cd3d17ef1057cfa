"""Helpers of the notifier's end-to-end tests: start a notifier process,
talk to it, and read what it published on Kafka."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from dataservice.common.v1 import common_pb2
from dataservice.notifier.v1 import notifier_pb2_grpc
from services.notifier.event_codec import decode_event
from tests.support.mesh import Mesh, ServiceProcess
from tests.support.waiting import wait_for

T = TypeVar("T")
FAULTS_TOPIC = "ds.faults"


def notifier_config(path: Path, **settings: object) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def start_notifier(
    mesh: Mesh, outbox: Path, config: Path | None = None, *, name: str = "notifier"
) -> ServiceProcess:
    args = ["--outbox-path", str(outbox)]
    if config is not None:
        args += ["--config", str(config)]
    return mesh.service("notifier", *args, name=name)


def wait_listening(svc: ServiceProcess, timeout: float = 60) -> None:
    """The gRPC server answers (SERVING or not: reports are accepted either way)."""
    wait_for(lambda: svc.grpc_health() is not None, timeout, f"{svc.kind} gRPC server")


@contextlib.contextmanager
def notifier_stub(address: str) -> Iterator[notifier_pb2_grpc.NotifierServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield notifier_pb2_grpc.NotifierServiceStub(channel)


def fault(
    fault_type: common_pb2.FaultType.ValueType,
    group: str,
    *,
    state: common_pb2.FaultState.ValueType = common_pb2.FAULT_STATE_OPEN,
    severity: common_pb2.Severity.ValueType = common_pb2.SEVERITY_ERROR,
    **fields: object,
) -> common_pb2.FaultEvent:
    event = common_pb2.FaultEvent(
        type=fault_type, state=state, severity=severity, source_service="test", group=group
    )
    for key, value in fields.items():
        setattr(event, key, value)
    return event


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one series of a Prometheus text exposition (labels in any order)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            return float(value)
    return None


class TopicReader:
    """Reads a topic from the beginning (or from its end at creation) and keeps what it
    read, in partition order; ``wait`` reads until a predicate holds."""

    def __init__(self, bootstrap: str, topic: str, *, from_end: bool = False) -> None:
        self.topic = topic
        self.messages: list[Message] = []
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "ds-test-notifier-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }
        )
        self._from_end = from_end
        self._assigned = False
        if from_end:
            # Where the topic ends *now*: what is published from here on is read.
            wait_for(self._assign, 30, f"{topic} to exist")

    def _assign(self) -> bool:
        metadata = self._consumer.list_topics(self.topic, timeout=10)
        info = metadata.topics.get(self.topic)
        if info is None or info.error is not None or not info.partitions:
            return False
        assignment = []
        for p in sorted(info.partitions):
            start = OFFSET_BEGINNING
            if self._from_end:
                _low, start = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10
                )
            assignment.append(TopicPartition(self.topic, p, start))
        self._consumer.assign(assignment)
        self._assigned = True
        return True

    def poll(self, seconds: float = 0.5) -> None:
        if not self._assigned and not self._assign():
            time.sleep(seconds)
            return
        for msg in self._consumer.consume(500, seconds):
            error = msg.error()
            if error is None:
                self.messages.append(msg)
            elif error.code() != KafkaError._PARTITION_EOF:
                raise AssertionError(f"reading {self.topic}: {error}")

    def wait(self, predicate: Callable[[list[Message]], T | None], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            result = predicate(self.messages)
            if result:
                return result
        raise AssertionError(f"timed out after {timeout}s waiting for {what} on {self.topic}")

    def close(self) -> None:
        self._consumer.close()


def events(messages: list[Message]) -> list[common_pb2.FaultEvent]:
    out = []
    for msg in messages:
        headers = dict(msg.headers() or [])
        raw_type = headers.get("content-type", b"")
        content_type = raw_type.decode() if isinstance(raw_type, bytes) else str(raw_type)
        value = msg.value()
        assert isinstance(value, bytes)
        out.append(decode_event(value, content_type))
    return out


def header(msg: Message, key: str) -> str | None:
    for k, v in msg.headers() or []:  # type: ignore[str-unpack]
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None
