"""The sidecar's metric table: every name it exports, with type, labels, source and help
(:data:`METRIC_TABLE`: the site's metric reference and the end-to-end test are
both checked against it), the Java consumer's metric names mapped to ours
(:data:`OPERATOR_NAMES`), histogram bounds, and :class:`Buckets`, a histogram's state kept
in plain Python and rendered at scrape time. Declarations and pure code only.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUEST_BUCKETS = (*LATENCY_BUCKETS, 30.0, 60.0, 300.0)
AGE_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
# Not-fetching gaps: 1 s is the floor of a gap (fetch_gaps.GAP_FLOOR_SECONDS); a leader
# failover takes about 10-20 s, the alert's threshold is 30 s.
GAP_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
# Mean bytes per Fetch request over a statistics window (fetch_sizes.py): from empty
# long-poll responses up to fetch.max.bytes (50 MiB by default).
SIZE_BUCKETS = tuple(float(1 << k) for k in range(8, 27, 2))  # 256 B .. 64 MiB, x4
RECORD_COUNT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                        5000.0, 10000.0, 50000.0)  # fmt: skip
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
LEASE_KINDS = ("grant", "revoke", "expire")


# ---- the table of every exported metric -----------------------------------------------------


class MetricSpec(NamedTuple):
    name: str  # as exposed (counters with _total)
    type: str  # counter | gauge | histogram | summary
    labels: tuple[str, ...]
    source: str  # where the figure comes from
    help: str


def _spec(name: str, kind: str, labels: str, source: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, tuple(labels.split(",")) if labels else (), source, help_text)


G, GTP, GC = "group", "group,topic,partition", "group,client_id"
STATS = "librdkafka statistics"
OWN = "sidecar timing/counting"
VIEW = "partition table at scrape time"
DLQ = "dead-letter topic's watermarks, read every dead_letter_check_interval_seconds"
CB = "rebalance callbacks"
METRIC_TABLE: tuple[MetricSpec, ...] = (
    _spec("ds_sidecar_records_consumed_total", "counter", "group,topic", OWN,
          "Records returned by the sidecar's consume() calls (counted per partition run)"),
    _spec("ds_sidecar_bytes_consumed_total", "counter", "group,topic", OWN,
          "Key plus value bytes of the records returned by consume()"),
    _spec("ds_sidecar_records_lag", "gauge", GTP, f"{STATS} hi_offset; {VIEW}",
          "Records between the fetch position and the high watermark (hi_offset at the last "
          "statistics; records buffered in the sidecar are not lag)"),
    _spec("ds_sidecar_records_lag_max", "gauge", G, f"{STATS}; {VIEW}",
          "Largest ds_sidecar_records_lag over the partitions this sidecar holds"),
    _spec("ds_sidecar_records_lead", "gauge", GTP, f"{STATS} lo_offset; {VIEW}",
          "Records between the log start offset (lo_offset) and the fetch position"),
    _spec("ds_sidecar_records_lead_min", "gauge", G, f"{STATS}; {VIEW}",
          "Smallest ds_sidecar_records_lead over the partitions this sidecar holds"),
    _spec("ds_sidecar_buffered_records", "gauge", GTP, VIEW,
          "Records fetched and buffered in the sidecar, not yet delivered"),
    _spec("ds_sidecar_inflight_records", "gauge", GTP, VIEW,
          "Records delivered and not acked yet, within their ack deadline"),
    _spec("ds_sidecar_due_records", "gauge", GTP, VIEW,
          "Records delivered and not acked that wait to be delivered again"),
    _spec("ds_sidecar_redeliveries_total", "counter", "group,reason", OWN,
          "Records that came due to be delivered again, by reason: visibility_timeout (ack "
          "deadline passed), nack, stream_end (the Stream that received them ended), "
          "not_sent (the Fetch response never reached the client)"),
    _spec("ds_sidecar_records_given_up_total", "counter", G, OWN,
          "Records that came due again after max_deliveries deliveries without an ack: "
          "given up (each a POISON_RECORD fault), the commit point passes them"),
    _spec("ds_sidecar_records_dead_lettered_total", "counter", G, OWN,
          "Given-up records produced to the group's dead-letter topic and acked by Kafka "
          "before the commit point passed them (dead_letter_topic)"),
    _spec("ds_sidecar_dead_letter_records", "gauge", G, DLQ,
          "Records kept on the group's dead-letter topic (high minus low watermark, every "
          "partition); every sidecar of the group reports the same figure"),
    _spec("ds_sidecar_dead_letter_oldest_age_seconds", "gauge", G, DLQ,
          "Age of the oldest record kept on the group's dead-letter topic, at scrape time "
          "(0: none)"),
    _spec("ds_sidecar_offset_gaps_total", "counter", GTP, OWN,
          "Offsets skipped because a partition's fetch position fell outside its log "
          "(records deleted by retention before they were read); each gap is an OFFSET_GAP "
          "fault"),
    _spec("ds_partition_not_fetching_seconds", "histogram", GTP, f"{OWN}; {STATS}",
          "Completed gaps of at least 1 s in which a held partition that had records to "
          "fetch (position below the high watermark, or its leader out of reach) got none "
          "from Kafka: from its last record fetched until records came again, it was seen "
          "at its end, paused on purpose or released (fetch_gaps.py)"),
    _spec("ds_partition_not_fetching_current_seconds", "gauge", GTP, f"{OWN}; {STATS}",
          "The not-fetching gap of the partition open now (0 while fetching, at its end, "
          "or paused on purpose by backpressure or a suspended lease)"),
    _spec("ds_sidecar_handoff_gap_seconds", "histogram", GTP, OWN,
          "Lease handoff gaps, counted at any length: from a partition's grant (kafka_group: "
          "assignment) until its first records arrived, when the first of them was written "
          "before the grant (it waited for the new owner) and no look meanwhile found the "
          "partition at its end or paused on purpose (fetch_gaps.py HandoffGaps)"),
    _spec("ds_sidecar_partition_fetch_broker", "gauge", GTP, f"{STATS} toppar broker",
          "Node id of the broker librdkafka fetches the partition from: its leader, or the "
          "preferred read replica the leader named (-1 = none yet)"),
    _spec("ds_sidecar_partition_leader", "gauge", GTP, f"{STATS} toppar leader",
          "Node id of the partition's leader as librdkafka knows it (-1 = unknown)"),
    _spec("ds_sidecar_fetch_size_bytes", "histogram", "group,topic",
          f"{STATS} toppar rxbytes, broker req.Fetch",
          "Mean bytes fetched of the topic per Fetch request over one statistics window: "
          "the rxbytes deltas of its partitions over the Fetch requests sent meanwhile to "
          "the brokers they are fetched from (empty long-poll responses included); one "
          "observation per window with Fetch requests. librdkafka reports no per-response "
          "size (fetch_sizes.py)"),
    _spec("ds_sidecar_fetch_records_per_request", "histogram", "group,topic",
          f"{STATS} toppar rxmsgs, broker req.Fetch",
          "Mean records fetched of the topic per Fetch request over one statistics window "
          "(rxmsgs deltas over Fetch requests, as ds_sidecar_fetch_size_bytes)"),
    _spec("ds_sidecar_fetch_size_all_bytes", "histogram", G,
          f"{STATS} toppar rxbytes, broker req.Fetch",
          "Mean bytes fetched per Fetch request over one statistics window, all topics: "
          "the rxbytes deltas of every partition over every broker's Fetch requests"),
    _spec("ds_sidecar_buffer_bytes", "gauge", G, VIEW,
          "Bytes buffered (key, value and per-record bookkeeping)"),
    _spec("ds_sidecar_buffer_limit_bytes", "gauge", G, "settings buffer_max_bytes",
          "Buffer cap; fetching holds back when it is reached"),
    _spec("ds_sidecar_assigned_partitions", "gauge", G, VIEW,
          "Partitions whose lease this sidecar holds (kafka_group mode: assigned by Kafka)"),
    _spec("ds_sidecar_commits_total", "counter", "group,result", OWN,
          "Offset commit requests to Kafka, by result (ok, error)"),
    _spec("ds_sidecar_commit_latency_seconds", "histogram", G, OWN,
          "Duration of one synchronous offset commit request to Kafka"),
    _spec("ds_sidecar_lease_changes_total", "counter", "group,kind", f"session commands; {CB}",
          "Lease changes (grant, revoke incl. fenced, expire = local deadline passed); "
          "kafka_group mode: partitions assigned (grant), revoked (revoke), lost (expire) "
          "by Kafka's rebalance callbacks"),
    _spec("ds_sidecar_lease_change_latency_seconds", "histogram", "group,kind", OWN,
          "grant: grant received until Kafka fetching is set up; revoke: revoke received "
          "until the partition is drained, committed and released; kafka_group mode: "
          "on_assign / on_revoke handling time, per partition"),
    _spec("ds_sidecar_last_lease_change_timestamp_seconds", "gauge", G, OWN,
          "Unix time of the last lease change (0 = none yet)"),
    _spec("ds_sidecar_joins_total", "counter", "group,result", f"{OWN}; {CB}",
          "Group joins by result (ok, error). Leased mode: the assigner session's Join (ok = "
          "SessionAccepted arrived; error = the session ended before it). kafka_group mode: "
          "Kafka rebalance rounds (ok = on_assign called; error = on_lost, or the assigned "
          "partitions' start offsets could not be read)"),
    _spec("ds_sidecar_join_seconds", "histogram", G, f"{OWN}; {CB}",
          "Leased mode: the session's Join sent until SessionAccepted arrived. kafka_group "
          "mode: a rebalance round as the app sees it, from its start (subscribe(), or the "
          "on_revoke / on_lost that ended the previous round) until on_assign; a round whose "
          "start the app cannot see (a rebalance another member began) is counted in "
          "ds_sidecar_joins_total only"),
    _spec("ds_sidecar_sync_seconds", "histogram", G, f"{OWN}; {CB}",
          "Leased mode: joined (SessionAccepted) until the session's first lease grant, the "
          "assignment's arrival. kafka_group mode: librdkafka does not split JoinGroup from "
          "SyncGroup for the app (its SyncGroup ends inside the join above); observed is "
          "on_assign entered until the assignment is in effect (start offsets read, "
          "incremental_assign done), once per on_assign"),
    _spec("ds_sidecar_last_heartbeat_timestamp_seconds", "gauge", G, OWN,
          "Unix time of the last assigner session heartbeat ack (0 = none yet), in both "
          "modes; Kafka's own group heartbeats (kafka_group mode) stay inside librdkafka, "
          "which reports no heartbeat time"),
    _spec("ds_sidecar_partitions_lost_seconds", "histogram", G, f"{OWN}; {CB}",
          "Per partition lost. Leased mode: a lease expiry, from the lease's local deadline "
          "(last renewal's send + TTL - safety margin) until delivery and commits are "
          "suspended and fetching paused (each commit round looks). kafka_group mode: "
          "on_lost handling time (entered until the partitions are dropped)"),
    _spec("ds_sidecar_poll_interval_seconds", "histogram", G, OWN,
          "Time between the starts of successive consume() calls of the fetch loop (half "
          "a second while nobody reads: the loop parks)"),
    _spec("ds_sidecar_poll_wait_seconds_total", "counter", G, OWN,
          "Time the fetch loop spent inside consume() waiting for records, or parked (nobody "
          "reads) waiting for a reader or a command; its rate is the poll idle ratio"),
    _spec("ds_sidecar_last_poll_age_seconds", "gauge", G, OWN,
          "Seconds since the fetch loop's last consume() returned"),
    _spec("ds_sidecar_record_age_seconds", "histogram", G, OWN,
          "Age of each record when handed to a client (delivery time - record timestamp), "
          "observed per delivered slice: buckets exact when a partition's timestamps do not "
          "decrease, _sum estimated within each bucket; records without a timestamp are not "
          "observed"),
    _spec("ds_sidecar_heartbeats_total", "counter", G, OWN,
          "Session heartbeats sent to the assigner"),
    _spec("ds_sidecar_heartbeat_response_seconds", "histogram", G, OWN,
          "Session heartbeat round trip: sent until the assigner's ack arrived"),
    _spec("ds_sidecar_assigner_connected", "gauge", G, OWN,
          "1 while the session with the assigner is joined, else 0"),
    _spec("ds_sidecar_fetch_requests_total", "counter", "group,broker", f"{STATS} req.Fetch",
          "Fetch requests sent to each broker"),
    _spec("ds_sidecar_broker_responses_total", "counter", "group,broker", f"{STATS} rx",
          "Responses received from each broker (all request types)"),
    _spec("ds_sidecar_broker_received_bytes_total", "counter", "group,broker",
          f"{STATS} rxbytes", "Bytes received from each broker (all responses)"),
    _spec("ds_sidecar_broker_requests_total", "counter", "group,broker", f"{STATS} tx",
          "Requests sent to each broker (all request types)"),
    _spec("ds_sidecar_broker_sent_bytes_total", "counter", "group,broker", f"{STATS} txbytes",
          "Bytes sent to each broker (all requests)"),
    _spec("ds_sidecar_broker_connects_total", "counter", "group,broker", f"{STATS} connects",
          "Connections made to each broker"),
    _spec("ds_sidecar_broker_disconnects_total", "counter", "group,broker",
          f"{STATS} disconnects", "Connections to each broker that were lost or closed"),
    _spec("ds_sidecar_broker_connected", "gauge", "group,broker", f"{STATS} state",
          "1 while the connection to the broker is up (state UP), else 0"),
    _spec("ds_sidecar_broker_rtt_seconds", "summary", "group,broker", f"{STATS} rtt",
          "Broker request round trip (mostly Fetch, which waits up to fetch.wait.max.ms); "
          "quantiles over the last statistics window, _count/_sum cumulative"),
    _spec("ds_sidecar_broker_rtt_max_seconds", "gauge", "group,broker", f"{STATS} rtt.max",
          "Longest broker round trip in the last statistics window"),
    _spec("ds_sidecar_broker_throttle_seconds", "summary", "group,broker",
          f"{STATS} throttle", "Broker throttle time; quantiles over the last statistics "
          "window, _count/_sum cumulative"),
    _spec("ds_sidecar_broker_throttle_max_seconds", "gauge", "group,broker",
          f"{STATS} throttle.max", "Longest broker throttle time in the last statistics window"),
    _spec("ds_sidecar_kafka_errors_total", "counter", "kind,code", "librdkafka error_cb",
          "librdkafka errors by class (fatal, retriable, informational) and code"),
    _spec("ds_client_requests_total", "counter", "group,client_id,method,code", OWN,
          "StreamService calls by client, method and gRPC status code"),
    _spec("ds_client_transport_requests_total", "counter", "group,client_id,transport", OWN,
          "StreamService calls by client and transport: unix (the pod's Unix domain "
          "socket) or tcp"),
    _spec("ds_client_request_duration_seconds", "histogram", "group,client_id,method", OWN,
          "StreamService call duration by client and method (a Stream: its lifetime)"),
    _spec("ds_client_records_served_total", "counter", GC, OWN,
          "Records handed to the client (Fetch, Stream and ReadRange)"),
    _spec("ds_client_bytes_served_total", "counter", GC, OWN,
          "Key plus value bytes handed to the client"),
    _spec("ds_client_active_streams", "gauge", GC, OWN, "Open Stream calls of the client"),
    _spec("ds_client_shared_memory_bytes", "gauge", GC, OWN,
          "Shared-memory segments of the client's open Streams (DELIVERY_FORMAT_ARROW_SHM: "
          "zero copy over the pod's socket), in bytes"),
    _spec("ds_client_frame_streams", "gauge", GC, OWN,
          "Open Streams of the client on the sidecar's frame socket (StreamOpen.frame_socket: "
          "over the pod's socket, no gRPC message per batch, ack or answer)"),
    _spec("ds_client_acks_total", "counter", GC, OWN,
          "Records acknowledged by the client (a range ack counts its offset span; "
          "auto_ack deliveries count as acked)"),
    _spec("ds_client_redeliveries_total", "counter", GC, OWN,
          "Records delivered again below the highest offset this sidecar process had "
          "already delivered of their partition (after a lease came back)"),
    _spec("ds_client_last_seen_timestamp_seconds", "gauge", GC, OWN,
          "Unix time of the client's last call or delivery"),
)  # fmt: skip
SPECS = {spec.name: spec for spec in METRIC_TABLE}


def help_of(name: str) -> str:
    return SPECS[name].help


def base_name(name: str) -> str:
    """prometheus_client appends ``_total`` to a counter's name itself."""
    return name.removesuffix("_total")


# ---- pure parts ---------------------------------------------------------------------------


class Buckets:
    """A histogram's state (non-cumulative bucket counts, the last one +Inf), cheap to
    update from one thread and rendered by a collector."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def observe_timestamps(self, stamps: array[int], lo: int, hi: int, now_ms: int) -> None:
        """Ages (``now_ms`` - timestamp, seconds) of ``stamps[lo:hi]`` without a pass over
        the records: a few bisections, exact when the timestamps do not decrease (then the
        records of one bucket are a contiguous run). The sum is estimated per bucket from
        the ages at both ends of its run."""
        if hi <= lo:
            return
        first, last = stamps[lo], stamps[hi - 1]
        newest, oldest = sorted(((now_ms - last) / 1000, (now_ms - first) / 1000))
        k_lo = bisect_left(self.bounds, newest)
        k_hi = bisect_left(self.bounds, oldest)
        if k_lo == k_hi:
            self.counts[k_lo] += hi - lo
            self.total += (hi - lo) * (newest + oldest) / 2
            return
        upper = hi  # records [upper, hi) are counted (youngest first)
        for k in range(k_lo, k_hi):
            pos = bisect_left(stamps, now_ms - self.bounds[k] * 1000, lo, hi)
            pos = min(max(pos, lo), upper)
            self._add_run(k, stamps, pos, upper, now_ms)
            upper = pos
        self._add_run(k_hi, stamps, lo, upper, now_ms)

    def _add_run(self, k: int, stamps: array[int], lo: int, hi: int, now_ms: int) -> None:
        if hi > lo:
            self.counts[k] += hi - lo
            self.total += (hi - lo) * ((now_ms - stamps[lo]) + (now_ms - stamps[hi - 1])) / 2000

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else _float(bound), float(running)))
        return out


def _float(value: float) -> str:
    return repr(float(value))


# ---- the operators' names (Java consumer MBeans) → ours -----------------------------------


class OperatorName(NamedTuple):
    java: str  # the Java consumer's metric (kafka.consumer:type=consumer-fetch-manager-metrics…)
    ours: str  # our metric, or "—" when it cannot exist here
    promql: str  # how to get the figure (or why it does not exist)


OPERATOR_NAMES: tuple[OperatorName, ...] = (
    OperatorName("records-lag-max", "ds_sidecar_records_lag_max",
                 "`max_over_time(ds_sidecar_records_lag_max[1m])`"),
    OperatorName("records-lag (per partition)", "ds_sidecar_records_lag",
                 "`ds_sidecar_records_lag`"),
    OperatorName("records-lag-avg (per partition)", "ds_sidecar_records_lag",
                 "`avg_over_time(ds_sidecar_records_lag[1m])`"),
    OperatorName("records-lag-max (per partition)", "ds_sidecar_records_lag",
                 "`max_over_time(ds_sidecar_records_lag[1m])`"),
    OperatorName("records-lead (per partition)", "ds_sidecar_records_lead",
                 "`ds_sidecar_records_lead`"),
    OperatorName("records-lead-min", "ds_sidecar_records_lead_min",
                 "`min_over_time(ds_sidecar_records_lead_min[1m])`"),
    OperatorName("records-lead-avg (per partition)", "ds_sidecar_records_lead",
                 "`avg_over_time(ds_sidecar_records_lead[1m])`"),
    OperatorName("records-lead-min (per partition)", "ds_sidecar_records_lead",
                 "`min_over_time(ds_sidecar_records_lead[1m])`"),
    OperatorName("records-consumed-rate", "ds_sidecar_records_consumed_total",
                 "`rate(ds_sidecar_records_consumed_total[1m])`"),
    OperatorName("records-consumed-total", "ds_sidecar_records_consumed_total",
                 "`ds_sidecar_records_consumed_total`"),
    OperatorName("bytes-consumed-rate", "ds_sidecar_bytes_consumed_total",
                 "`rate(ds_sidecar_bytes_consumed_total[1m])`"),
    OperatorName("bytes-consumed-total", "ds_sidecar_bytes_consumed_total",
                 "`ds_sidecar_bytes_consumed_total`"),
    OperatorName("records-per-request-avg", "ds_sidecar_records_consumed_total",
                 "`sum(rate(ds_sidecar_records_consumed_total[1m])) / "
                 "sum(rate(ds_sidecar_fetch_requests_total[1m]))`"),
    OperatorName("records-per-request-avg (per topic)", "ds_sidecar_fetch_records_per_request",
                 "`rate(ds_sidecar_fetch_records_per_request_sum[1m]) / "
                 "rate(ds_sidecar_fetch_records_per_request_count[1m])` (mean of the "
                 "statistics windows' means)"),
    OperatorName("fetch-latency-avg", "ds_sidecar_broker_rtt_seconds",
                 "closest figure, not fetch-only: `rate(ds_sidecar_broker_rtt_seconds_sum[1m]) / "
                 "rate(ds_sidecar_broker_rtt_seconds_count[1m])`. librdkafka keeps no latency "
                 "per request type: its broker `rtt` window times every request to the broker "
                 "(Fetch, and ListOffsets, Metadata, OffsetCommit/OffsetFetch where the broker "
                 "is the coordinator); `outbuf_latency` is the wait before sending, "
                 "`int_latency` the producer queue. A sidecar's requests are nearly all Fetch "
                 "(`ds_sidecar_fetch_requests_total` against `ds_sidecar_broker_responses_total`)"),
    OperatorName("fetch-latency-max", "ds_sidecar_broker_rtt_max_seconds",
                 "closest figure, not fetch-only (as fetch-latency-avg): "
                 "`max_over_time(ds_sidecar_broker_rtt_max_seconds[1m])`"),
    OperatorName("fetch-rate", "ds_sidecar_fetch_requests_total",
                 "`rate(ds_sidecar_fetch_requests_total[1m])`"),
    OperatorName("fetch-total", "ds_sidecar_fetch_requests_total",
                 "`sum by (group) (ds_sidecar_fetch_requests_total)`"),
    OperatorName("records-consumed-rate / -total (per topic)", "ds_sidecar_records_consumed_total",
                 "`rate(ds_sidecar_records_consumed_total[1m])` (labelled by topic)"),
    OperatorName("bytes-consumed-rate / -total (per topic)", "ds_sidecar_bytes_consumed_total",
                 "`rate(ds_sidecar_bytes_consumed_total[1m])` (labelled by topic)"),
    OperatorName("fetch-size-avg", "ds_sidecar_bytes_consumed_total",
                 "`sum(rate(ds_sidecar_bytes_consumed_total[1m])) / "
                 "sum(rate(ds_sidecar_fetch_requests_total[1m]))`"),
    OperatorName("fetch-size-max", "ds_sidecar_fetch_size_all_bytes",
                 "`histogram_quantile(1, rate(ds_sidecar_fetch_size_all_bytes_bucket[1m]))` "
                 "(bucket bound): the largest statistics window's mean bytes per Fetch request; "
                 "librdkafka reports no per-response size"),
    OperatorName("fetch-size-avg (per topic)", "ds_sidecar_fetch_size_bytes",
                 "`rate(ds_sidecar_fetch_size_bytes_sum[1m]) / "
                 "rate(ds_sidecar_fetch_size_bytes_count[1m])` (mean of the statistics "
                 "windows' means)"),
    OperatorName("fetch-size-max (per topic)", "ds_sidecar_fetch_size_bytes",
                 "`histogram_quantile(1, rate(ds_sidecar_fetch_size_bytes_bucket[1m]))` "
                 "(bucket bound): the largest window mean"),
    OperatorName("preferred-read-replica (per partition)", "ds_sidecar_partition_fetch_broker",
                 "`ds_sidecar_partition_fetch_broker` (the broker fetched from; a preferred "
                 "read replica when it differs from `ds_sidecar_partition_leader`; Java shows "
                 "-1 when fetching from the leader)"),
    OperatorName("fetch-throttle-time-avg / -max", "ds_sidecar_broker_throttle_seconds",
                 "avg: `rate(…_sum[1m]) / rate(…_count[1m])`; max: "
                 "`ds_sidecar_broker_throttle_max_seconds`"),
    OperatorName("commit-latency-avg", "ds_sidecar_commit_latency_seconds",
                 "`rate(ds_sidecar_commit_latency_seconds_sum[1m]) / "
                 "rate(ds_sidecar_commit_latency_seconds_count[1m])`"),
    OperatorName("commit-latency-max", "ds_sidecar_commit_latency_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_commit_latency_seconds_bucket[1m]))` "
                 "(bucket bound)"),
    OperatorName("commit-rate", "ds_sidecar_commits_total", "`rate(ds_sidecar_commits_total[1m])`"),
    OperatorName("commit-total", "ds_sidecar_commits_total", "`ds_sidecar_commits_total`"),
    OperatorName("assigned-partitions", "ds_sidecar_assigned_partitions",
                 "`ds_sidecar_assigned_partitions`"),
    OperatorName("partition-assigned-latency-avg / -max", "ds_sidecar_lease_change_latency_seconds",
                 "`{kind=\"grant\"}`: avg `rate(…_sum[5m]) / rate(…_count[5m])`, max "
                 "`histogram_quantile(1, rate(…_bucket[5m]))` (kafka_group: on_assign's handling)"),
    OperatorName("partition-revoked-latency-avg / -max", "ds_sidecar_lease_change_latency_seconds",
                 "`{kind=\"revoke\"}`, as above (kafka_group: on_revoke's handling)"),
    OperatorName("rebalance-latency-total", "ds_sidecar_lease_change_latency_seconds",
                 "`sum by (group) (ds_sidecar_lease_change_latency_seconds_sum)` (seconds)"),
    OperatorName("rebalance-total (here: lease changes)", "ds_sidecar_lease_changes_total",
                 "`sum by (group) (ds_sidecar_lease_changes_total)` (kafka_group mode: "
                 "partitions moved; rebalance rounds are `ds_sidecar_joins_total`)"),
    OperatorName("rebalance-rate-per-hour", "ds_sidecar_lease_changes_total",
                 "`sum by (group) (increase(ds_sidecar_lease_changes_total[1h]))`"),
    OperatorName("rebalance-latency-avg / -max", "ds_sidecar_lease_change_latency_seconds",
                 "avg: `rate(…_sum[5m]) / rate(…_count[5m])`; max: "
                 "`histogram_quantile(1, rate(…_bucket[5m]))`"),
    OperatorName("last-rebalance-seconds-ago", "ds_sidecar_last_lease_change_timestamp_seconds",
                 "`time() - ds_sidecar_last_lease_change_timestamp_seconds`"),
    OperatorName("time-between-poll-avg", "ds_sidecar_poll_interval_seconds",
                 "`rate(ds_sidecar_poll_interval_seconds_sum[1m]) / "
                 "rate(ds_sidecar_poll_interval_seconds_count[1m])`"),
    OperatorName("time-between-poll-max", "ds_sidecar_poll_interval_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_poll_interval_seconds_bucket[1m]))`"),
    OperatorName("last-poll-seconds-ago", "ds_sidecar_last_poll_age_seconds",
                 "`ds_sidecar_last_poll_age_seconds`"),
    OperatorName("poll-idle-ratio-avg", "ds_sidecar_poll_wait_seconds_total",
                 "`rate(ds_sidecar_poll_wait_seconds_total[1m])`"),
    OperatorName("heartbeat-rate (here: session heartbeats)", "ds_sidecar_heartbeats_total",
                 "`rate(ds_sidecar_heartbeats_total[1m])`"),
    OperatorName("heartbeat-response-time-max", "ds_sidecar_heartbeat_response_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_heartbeat_response_seconds_bucket[1m]))`"),
    OperatorName("heartbeat-total (here: session heartbeats)", "ds_sidecar_heartbeats_total",
                 "`ds_sidecar_heartbeats_total`"),
    OperatorName("last-heartbeat-seconds-ago", "ds_sidecar_last_heartbeat_timestamp_seconds",
                 "`time() - ds_sidecar_last_heartbeat_timestamp_seconds` (the assigner "
                 "session's heartbeats; kafka_group mode's Kafka heartbeats are not reported "
                 "by librdkafka)"),
    OperatorName("join-time-avg", "ds_sidecar_join_seconds",
                 "`rate(ds_sidecar_join_seconds_sum[5m]) / "
                 "rate(ds_sidecar_join_seconds_count[5m])`"),
    OperatorName("join-time-max", "ds_sidecar_join_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_join_seconds_bucket[5m]))` "
                 "(bucket bound)"),
    OperatorName("join-rate", "ds_sidecar_joins_total",
                 "`rate(ds_sidecar_joins_total{result=\"ok\"}[5m])`"),
    OperatorName("join-total", "ds_sidecar_joins_total",
                 "`ds_sidecar_joins_total{result=\"ok\"}`"),
    OperatorName("sync-time-avg", "ds_sidecar_sync_seconds",
                 "`rate(ds_sidecar_sync_seconds_sum[5m]) / "
                 "rate(ds_sidecar_sync_seconds_count[5m])` (leased: joined until the first "
                 "grant; kafka_group: the assignment's application, see the table)"),
    OperatorName("sync-time-max", "ds_sidecar_sync_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_sync_seconds_bucket[5m]))` "
                 "(bucket bound)"),
    OperatorName("sync-rate", "ds_sidecar_sync_seconds",
                 "`rate(ds_sidecar_sync_seconds_count[5m])`"),
    OperatorName("sync-total", "ds_sidecar_sync_seconds", "`ds_sidecar_sync_seconds_count`"),
    OperatorName("failed-rebalance-total", "ds_sidecar_joins_total",
                 "`ds_sidecar_joins_total{result=\"error\"}`"),
    OperatorName("failed-rebalance-rate-per-hour", "ds_sidecar_joins_total",
                 "`increase(ds_sidecar_joins_total{result=\"error\"}[1h])`"),
    OperatorName("partitions-lost-latency-avg", "ds_sidecar_partitions_lost_seconds",
                 "`rate(ds_sidecar_partitions_lost_seconds_sum[1h]) / "
                 "rate(ds_sidecar_partitions_lost_seconds_count[1h])`"),
    OperatorName("partitions-lost-latency-max", "ds_sidecar_partitions_lost_seconds",
                 "`histogram_quantile(1, rate(ds_sidecar_partitions_lost_seconds_bucket[1h]))` "
                 "(bucket bound)"),
    # consumer-metrics: the consumer's own calls
    OperatorName("commit-sync-time-ns-total", "ds_sidecar_commit_latency_seconds",
                 "`ds_sidecar_commit_latency_seconds_sum * 1e9` (every commit the sidecar makes "
                 "is synchronous)"),
    OperatorName("committed-time-ns-total", "—",
                 "not timed on its own: committed() runs once per batch of granted partitions "
                 "(inside `ds_sidecar_lease_change_latency_seconds{kind=\"grant\"}`) and in the "
                 "periodic check for external offset changes"),
    # the client's connections to the brokers (consumer-metrics / consumer-node-metrics)
    OperatorName("connection-count", "ds_sidecar_broker_connected",
                 "`sum by (group) (ds_sidecar_broker_connected)`"),
    OperatorName("connection-creation-rate / -total", "ds_sidecar_broker_connects_total",
                 "`rate(ds_sidecar_broker_connects_total[5m])`"),
    OperatorName("connection-close-rate / -total", "ds_sidecar_broker_disconnects_total",
                 "`rate(ds_sidecar_broker_disconnects_total[5m])`"),
    OperatorName("request-rate / -total", "ds_sidecar_broker_requests_total",
                 "`rate(ds_sidecar_broker_requests_total[1m])`"),
    OperatorName("request-size-avg", "ds_sidecar_broker_sent_bytes_total",
                 "`rate(ds_sidecar_broker_sent_bytes_total[1m]) / "
                 "rate(ds_sidecar_broker_requests_total[1m])`"),
    OperatorName("request-size-max", "—",
                 "cannot exist: librdkafka reports no per-request size; request-size-avg is "
                 "the figure"),
    OperatorName("outgoing-byte-rate / -total", "ds_sidecar_broker_sent_bytes_total",
                 "`rate(ds_sidecar_broker_sent_bytes_total[1m])`"),
    OperatorName("incoming-byte-rate / -total", "ds_sidecar_broker_received_bytes_total",
                 "`rate(ds_sidecar_broker_received_bytes_total[1m])`"),
    OperatorName("response-rate / -total", "ds_sidecar_broker_responses_total",
                 "`rate(ds_sidecar_broker_responses_total[1m])`"),
    OperatorName("request-latency-avg / -max (per node)", "ds_sidecar_broker_rtt_seconds",
                 "avg `rate(…_sum[1m]) / rate(…_count[1m])`; max "
                 "`ds_sidecar_broker_rtt_max_seconds`"),
    OperatorName("failed-authentication-rate / -total", "ds_sidecar_kafka_errors_total",
                 "`rate(ds_sidecar_kafka_errors_total{code=\"_AUTHENTICATION\"}[5m])` "
                 "(librdkafka reports a failed authentication through error_cb)"),
    OperatorName("successful-authentication-rate, reauthentication-*", "—",
                 "cannot exist: librdkafka does not report successful authentications; "
                 "`ds_sidecar_broker_connects_total` counts the connections made"),
    OperatorName("network-io-rate, select-rate, io-ratio, io-wait-ratio, io-time-ns-avg, "
                 "io-wait-time-ns-avg", "—",
                 "cannot exist: they time the Java client's selector loop, which librdkafka "
                 "does not have; the poll loop's wait is `ds_sidecar_poll_wait_seconds_total`"),
)  # fmt: skip
