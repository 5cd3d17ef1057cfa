"""Sidecar metrics, pure parts: client_id cardinality, batch histograms, ack counting, the
client-access rendering, and the site's metric reference kept equal to METRIC_TABLE."""

from __future__ import annotations

import re
from array import array
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dataservice.common.v1 import common_pb2
from dsclient.records.batches import Slice, chunk_from_records
from services.consumer_sidecar.client_access import (
    OTHER_CLIENT,
    ClientIdLimiter,
    ClientMetrics,
    acked_records,
)
from services.consumer_sidecar.metric_table import (
    AGE_BUCKETS,
    METRIC_TABLE,
    OPERATOR_NAMES,
    Buckets,
)

METRICS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference" / "metrics.md"
PAGE_HEADING = "## Sidecar"


# ---- client_id cardinality ----------------------------------------------------------------


def test_past_the_limit_new_client_ids_are_other() -> None:
    limiter = ClientIdLimiter(limit=2, idle_seconds=60)
    assert limiter.resolve("a", 0.0) == ("a", None)
    assert limiter.resolve("b", 1.0) == ("b", None)
    assert limiter.resolve("c", 2.0) == (OTHER_CLIENT, None)
    assert limiter.resolve("a", 3.0) == ("a", None)  # known ids keep their label
    assert len(limiter) == 2


def test_the_least_recently_seen_idle_client_gives_its_place_up() -> None:
    limiter = ClientIdLimiter(limit=2, idle_seconds=60)
    limiter.resolve("a", 0.0)
    limiter.resolve("b", 10.0)
    limiter.resolve("a", 20.0)  # b is now the least recently seen
    assert limiter.resolve("c", 69.0) == (OTHER_CLIENT, None)  # b idle 59 s: keeps it
    assert limiter.resolve("c", 70.0) == ("c", "b")
    assert limiter.resolve("b", 71.0) == (OTHER_CLIENT, None)


def test_a_client_with_an_open_stream_is_never_evicted() -> None:
    limiter = ClientIdLimiter(limit=1, idle_seconds=1)
    limiter.resolve("streamer", 0.0)
    limiter.pin("streamer")
    assert limiter.resolve("x", 100.0) == (OTHER_CLIENT, None)
    limiter.unpin("streamer")
    assert limiter.resolve("x", 100.0) == ("x", "streamer")


def test_client_metrics_render_other_and_drop_evicted_series() -> None:
    clock = [0.0]
    registry = CollectorRegistry()
    clients = ClientMetrics(
        "g", ClientIdLimiter(limit=2, idle_seconds=30), wall=lambda: 1000.0 + clock[0],
        monotonic=lambda: clock[0],
    )  # fmt: skip
    registry.register(clients)
    clients.request("a", "Fetch", "OK", 0.01)
    clients.request("b", "Ack", "OK", 0.002)
    clients.request("c", "Fetch", "INVALID_ARGUMENT", 0.001)
    clients.request("d", "Fetch", "OK", 0.001)
    samples = _samples(registry, "ds_client_requests_total")
    assert samples == {
        ("a", "Fetch", "OK"): 1,
        ("b", "Ack", "OK"): 1,
        (OTHER_CLIENT, "Fetch", "INVALID_ARGUMENT"): 1,
        (OTHER_CLIENT, "Fetch", "OK"): 1,
    }
    clock[0] = 40.0
    clients.request("e", "Fetch", "OK", 0.001)  # a (least recently seen, idle) gives way
    assert {k[0] for k in _samples(registry, "ds_client_requests_total")} == {
        "b", "e", OTHER_CLIENT,
    }  # fmt: skip


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[(s.labels["client_id"], s.labels["method"], s.labels["code"])] = s.value
    return out


# ---- deliveries: records, bytes, age, redeliveries ----------------------------------------


def _slice(offsets: list[int], stamps: list[int], lo: int = 0, hi: int | None = None) -> Slice:
    records = []
    for offset, ms in zip(offsets, stamps, strict=True):
        record = common_pb2.Record(offset=offset, key=b"k%d" % offset, value=b"v" * 10)
        record.timestamp.FromMilliseconds(ms)
        records.append(record)
    chunk = chunk_from_records(records)
    hi = len(offsets) if hi is None else hi
    vlo, klo = 10 * lo, sum(len(b"k%d" % o) for o in offsets[:lo])
    vhi, khi = 10 * hi, sum(len(b"k%d" % o) for o in offsets[:hi])
    return Slice("t", 0, 1, chunk, lo, hi, vlo, vhi, klo, khi)


def test_a_delivery_counts_records_bytes_age_and_redeliveries() -> None:
    now_ms = 1_000_000
    clients = ClientMetrics("g", ClientIdLimiter(10, 60), wall=lambda: now_ms / 1000)
    first = _slice([0, 1, 2, 3], [now_ms - 2000, now_ms - 2000, now_ms - 40, now_ms - 5])
    clients.delivered("app", [first], acked=False)
    _label, state = clients.client("app")
    assert (state.records, state.acks, state.redeliveries) == (4, 0, 0)
    assert state.bytes == 4 * 10 + len(b"k0k1k2k3")
    assert clients.record_age.count == 4
    # le=0.01: the 5 ms one; le=0.05: + the 40 ms one; le=2.5: all four.
    cumulative = dict(clients.record_age.cumulative())
    assert (cumulative["0.01"], cumulative["0.05"], cumulative["2.5"]) == (1, 2, 4)
    # Offsets 2..5 after the lease came back at 2: 2 and 3 are redelivered.
    again = _slice([2, 3, 4, 5], [now_ms] * 4)
    clients.delivered("app", [again], acked=True)
    assert (state.records, state.acks, state.redeliveries) == (8, 4, 2)


@given(
    st.lists(st.integers(min_value=-5_000, max_value=4_000_000), min_size=1, max_size=200),
    st.integers(min_value=0, max_value=199),
)
def test_batch_age_buckets_equal_per_record_ones_for_ordered_timestamps(
    ages_ms: list[int], cut: int
) -> None:
    now_ms = 10_000_000
    stamps = array("q", sorted(now_ms - a for a in ages_ms))
    lo = min(cut, len(stamps) - 1)
    batch, single = Buckets(AGE_BUCKETS), Buckets(AGE_BUCKETS)
    batch.observe_timestamps(stamps, lo, len(stamps), now_ms)
    for ms in stamps[lo:]:
        single.observe((now_ms - ms) / 1000)
    assert batch.counts == single.counts
    # The sum is estimated within each bucket: off by less than the widest bucket used.
    widest = max(b - a for a, b in zip((0.0, *AGE_BUCKETS), AGE_BUCKETS, strict=False))
    assert abs(batch.total - single.total) <= widest * len(stamps) + 1e-6


def test_unordered_timestamps_still_count_every_record_once() -> None:
    now_ms = 100_000
    stamps = array("q", [now_ms - 3000, now_ms - 1, now_ms - 60_000, now_ms - 20])
    buckets = Buckets(AGE_BUCKETS)
    buckets.observe_timestamps(stamps, 0, 4, now_ms)
    assert buckets.count == 4


def test_acked_records_count_ranges_by_span_minus_rejected() -> None:
    def rng(lo: int, hi: int) -> SimpleNamespace:
        return SimpleNamespace(from_offset=lo, to_offset=hi)

    acks, ranges = [object(), object()], [rng(0, 100), rng(200, 250)]
    rejected, rejected_ranges = [object()], [SimpleNamespace(ack=rng(200, 250))]
    assert acked_records(acks, ranges, rejected, rejected_ranges) == 1 + 100


# ---- the metric reference page --------------------------------------------------------------


def reference_section() -> str:
    """The sidecar's tables as METRIC_TABLE and OPERATOR_NAMES render them (what
    docs/reference/metrics.md must carry; scripts/gen_docs.py writes it, and
    tests/e2e/test_sidecar_metrics.py checks the same table against a live sidecar)."""
    from scripts import gen_docs

    return gen_docs.sidecar_metric_tables()


def test_every_metric_the_operators_know_maps_to_a_table_metric() -> None:
    names = {spec.name for spec in METRIC_TABLE}
    for operator in OPERATOR_NAMES:
        assert operator.ours == "—" or operator.ours in names, operator
        for quoted in re.findall(r"ds_[a-z_]+", operator.promql):
            base = re.sub(r"_(bucket|sum|count)$", "", quoted)
            assert quoted in names or base in names, (operator.java, quoted)


def test_metric_reference_page_carries_the_metric_table() -> None:
    text = METRICS_PAGE.read_text()
    assert PAGE_HEADING + "\n" in text, f"{METRICS_PAGE.name} has no {PAGE_HEADING!r} section"
    section = text.split(PAGE_HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    assert reference_section() in section, (
        "docs/reference/metrics.md's sidecar tables differ from METRIC_TABLE: "
        "run python scripts/gen_docs.py"
    )
