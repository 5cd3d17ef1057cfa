"""Per-client views of a group (``AdminService.ListClients``, ``/ui/clients``): pure.

Each sidecar sends its client-access totals (records served, acks, errors, requests, last
seen) per client id in every heartbeat. :class:`ClientActivity` keeps, per (sidecar, client),
the samples of the last :data:`RATE_WINDOW_SECONDS` and turns them into rates: the counter's
rise over the window's span, as Prometheus' ``rate()`` does, so a 1 s heartbeat does not
make the figures jump. A total lower than the one before is a sidecar restart: the counter
counts from 0 again. :func:`client_rows` joins the rates with the group's bindings.
Observability only: nothing here is read by a decision.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RATE_WINDOW_SECONDS = 10.0


@dataclass(frozen=True)
class Totals:
    """One client's counters at one sidecar, as a heartbeat reported them."""

    records: int = 0
    acks: int = 0
    errors: int = 0
    requests: int = 0
    last_seen: float = 0.0  # wall-clock seconds; 0 = never
    active_streams: int = 0


@dataclass(frozen=True)
class Rates:
    """Per second over the window."""

    records: float = 0.0
    acks: float = 0.0
    errors: float = 0.0
    requests: float = 0.0


@dataclass(frozen=True)
class AtSidecar:
    """What one client does at one sidecar."""

    sidecar_id: str
    endpoint: str
    rates: Rates
    last_seen: float
    active_streams: int


@dataclass(frozen=True)
class ClientRow:
    """One client of a group, over its sidecars."""

    client_id: str
    group: str
    sidecars: tuple[AtSidecar, ...]
    rates: Rates
    error_ratio: float  # failed requests / requests over the window; 0 without requests
    last_seen: float  # 0 = not seen
    bound: bool
    bound_since: float  # 0 = not bound, or bound before this leader


def increase(samples: Iterable[tuple[float, int]]) -> float:
    """How much a counter rose over ``samples`` (time, value), oldest first; a drop is a
    restart from 0, so the value after it counts whole."""
    rise = 0
    previous: int | None = None
    for _at, value in samples:
        if previous is not None:
            rise += value - previous if value >= previous else value
        previous = value
    return float(rise)


def rate(samples: Iterable[tuple[float, int]]) -> float:
    """Per-second rise over the samples' span; 0 with fewer than two samples."""
    points = list(samples)
    if len(points) < 2:
        return 0.0
    span = points[-1][0] - points[0][0]
    return increase(points) / span if span > 0 else 0.0


class _Series:
    """The recent samples of one client at one sidecar."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, Totals]] = deque()

    def add(self, at: float, totals: Totals, window: float) -> None:
        self.samples.append((at, totals))
        # Keep one sample at or before the window's start, so the span covers the window.
        while len(self.samples) > 2 and self.samples[1][0] <= at - window:
            self.samples.popleft()

    def rates(self) -> Rates:
        s = self.samples
        return Rates(
            records=rate((at, t.records) for at, t in s),
            acks=rate((at, t.acks) for at, t in s),
            errors=rate((at, t.errors) for at, t in s),
            requests=rate((at, t.requests) for at, t in s),
        )

    def latest(self) -> Totals:
        return self.samples[-1][1]


class ClientActivity:
    """The clients' recent totals in one group, per sidecar (fed from heartbeats)."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS) -> None:
        self.window = window
        self._series: dict[str, dict[str, _Series]] = {}  # sidecar → client → samples

    def observe(self, sidecar_id: str, totals: Mapping[str, Totals], now: float) -> None:
        """A heartbeat's report: the sidecar's clients as of ``now`` (monotonic). A client
        it no longer reports (its sidecar forgot an idle id) is dropped."""
        known = self._series.setdefault(sidecar_id, {})
        for gone in set(known) - set(totals):
            del known[gone]
        for client_id, t in totals.items():
            series = known.get(client_id)
            if series is None:
                series = known[client_id] = _Series()
            series.add(now, t, self.window)

    def latest(self, sidecar_id: str, client_id: str) -> Totals | None:
        """What ``sidecar_id`` last reported of ``client_id``; None if nothing."""
        series = self._series.get(sidecar_id, {}).get(client_id)
        return series.latest() if series is not None else None

    def retain(self, sidecars: Iterable[str]) -> None:
        """Forget the sidecars that are no longer members."""
        keep = set(sidecars)
        for gone in set(self._series) - keep:
            del self._series[gone]

    def by_client(self) -> dict[str, dict[str, tuple[Totals, Rates]]]:
        """client → sidecar → (latest totals, rates)."""
        out: dict[str, dict[str, tuple[Totals, Rates]]] = {}
        for sidecar_id, clients in self._series.items():
            for client_id, series in clients.items():
                out.setdefault(client_id, {})[sidecar_id] = (series.latest(), series.rates())
        return out


def client_rows(
    group: str,
    activity: ClientActivity,
    bound: Mapping[str, float],
    endpoints: Mapping[str, str],
) -> list[ClientRow]:
    """The group's clients, by id: every bound client (``bound``: id → bound-since wall
    time, 0 = unknown) and every client a sidecar reported, with rates summed over its
    sidecars (``endpoints``: sidecar id → its StreamService address)."""
    seen = activity.by_client()
    rows = []
    for client_id in sorted(set(bound) | set(seen)):
        at = seen.get(client_id, {})
        sidecars = tuple(
            AtSidecar(
                sidecar_id=sidecar_id,
                endpoint=endpoints.get(sidecar_id, ""),
                rates=rates,
                last_seen=totals.last_seen,
                active_streams=totals.active_streams,
            )
            for sidecar_id, (totals, rates) in sorted(at.items())
        )
        total = Rates(
            records=sum(s.rates.records for s in sidecars),
            acks=sum(s.rates.acks for s in sidecars),
            errors=sum(s.rates.errors for s in sidecars),
            requests=sum(s.rates.requests for s in sidecars),
        )
        rows.append(
            ClientRow(
                client_id=client_id,
                group=group,
                sidecars=sidecars,
                rates=total,
                error_ratio=min(1.0, total.errors / total.requests) if total.requests else 0.0,
                last_seen=max((s.last_seen for s in sidecars), default=0.0),
                bound=client_id in bound,
                bound_since=bound.get(client_id, 0.0),
            )
        )
    return rows
