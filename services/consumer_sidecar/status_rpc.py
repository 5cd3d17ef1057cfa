"""Status: what this sidecar holds and serves, as the StatusResponse shows it (each held
partition's lease, position and buffer; the buffer, config and redelivery policy)."""

from __future__ import annotations

import time

from google.protobuf import duration_pb2

from dataservice.sidecar.v1 import stream_pb2
from services.consumer_sidecar.serving import Serving


def status_response(serving: Serving) -> stream_pb2.StatusResponse:
    now = time.monotonic()
    partitions = []
    for part in sorted(serving.partitions(), key=lambda p: p.tp):
        remaining = duration_pb2.Duration()
        remaining.FromNanoseconds(int(max(0.0, part.deadline - now) * 1e9))
        partitions.append(
            stream_pb2.PartitionStatus(
                topic=part.tp.topic,
                partition=part.tp.partition,
                lease_epoch=part.epoch,
                lease_deadline_remaining=remaining,
                position=part.position,
                committed_offset=part.committed,
                high_watermark=part.high_watermark,
                buffered_records=part.buffered_records,
                buffered_bytes=part.buffered_bytes,
                paused=part.paused,
                inflight=part.acks.inflight,
                due=part.acks.due,
            )
        )
    policy = serving.redelivery
    visibility = duration_pb2.Duration()
    visibility.FromNanoseconds(int(policy.visibility * 1e9))
    return stream_pb2.StatusResponse(
        sidecar_id=serving.sidecar_id,
        group=serving.group,
        partitions=partitions,
        buffer_bytes=serving.buffered_bytes,
        buffer_cap_bytes=serving.buffer_cap_bytes,
        consumer_config=serving.consumer_config(),
        config_version=serving.config_version(),
        assigner_connected=serving.connected(),
        visibility_timeout=visibility,
        max_deliveries=policy.max_deliveries,
    )
