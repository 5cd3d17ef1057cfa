"""Stand-ins for confluent-kafka ``Message`` objects in unit tests of pure logic: a record
(:class:`Msg`) and the end of a partition's log (:class:`Eof`)."""

from __future__ import annotations

from confluent_kafka import KafkaError


class Msg:
    """The parts of a confluent-kafka Message the sidecar's readers and encoders read."""

    def __init__(
        self,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        stamp: tuple[int, int],
        headers: list[tuple[str, bytes | None]] | None,
        partition: int = 3,
        topic: str = "orders",
    ) -> None:
        self._offset, self._key, self._value = offset, key, value
        self._stamp, self._headers, self._partition = stamp, headers, partition
        self._topic = topic

    def error(self) -> None:
        return None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return self._stamp

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers


class Eof:
    """The end of the partition's log, at ``offset``."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._PARTITION_EOF)

    def offset(self) -> int:
        return self._offset
