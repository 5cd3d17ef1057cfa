"""What the operations' e2e tests share: ``dsctl`` as a subprocess against a mesh, waiting,
and the record accounting of at-least-once (a record delivered again must have had its
earlier delivery's ack refused or failed)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support import cli
from tests.support.mesh import ServiceProcess
from tests.support.records import Tally


def dsctl(assigner: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """dsctl against the assigner at ``assigner``."""
    return cli.dsctl(*args, env=cli.cli_env(DS_ASSIGNER=assigner), timeout=timeout)


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return json.loads(result.stdout)


def metrics(svc: ServiceProcess) -> str:
    """A running service's /metrics exposition (raises OSError if it does not answer)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.http_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def metric_samples(service: ServiceProcess, name: str) -> list[Sample]:
    """The samples of one metric on a running service's /metrics (none if it does not
    answer: a scenario may have killed it)."""
    try:
        text = metrics(service)
    except OSError:
        return []
    return samples_in(text, name)


def samples_in(text: str, name: str) -> list[Sample]:
    """The samples of one metric in a /metrics exposition already read."""
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def unexplained_duplicates(tally: Tally) -> dict[int, list[Any]]:
    """Records delivered again although an earlier delivery's ack was accepted: a delivery
    whose fetch was sent after another delivery's ack had been answered accepted (the
    sidecar must never hand out a record it was told was processed).

    Compared by time, not by the order deliveries reached the tally: each loop adds a
    batch once its ack is answered, so with two clients a redelivery acked quickly can
    be tallied before the first delivery whose ack was slow and refused (the order the
    CI run of 27 Nov read as unexplained)."""
    return {
        seq: deliveries
        for seq, deliveries in tally.duplicates().items()
        if any(
            first.acked and first.acked_at < again.requested_at
            for first in deliveries
            for again in deliveries
            if again is not first
            and (again.partition, again.offset) == (first.partition, first.offset)
        )
    }


def producer_copies(tally: Tally) -> dict[int, list[tuple[int, int]]]:
    """Records Kafka holds more than once: one sequence at several (partition, offset)s.
    An idempotent producer can still write a batch twice when every broker went away with
    the batch in flight (CI, 2 Dec: seq 326 at p2@54 and p2@55 after a 20 s outage). To the
    mesh those are two records, each delivered on its own; the accounting counts them
    apart from redeliveries, and ``unexplained_duplicates`` compares one offset's
    deliveries only."""
    return {
        seq: places
        for seq, deliveries in tally.duplicates().items()
        if len(places := sorted({(d.partition, d.offset) for d in deliveries})) > 1
    }


def describe_deliveries(deliveries: list[Any], origin: float) -> str:
    """One line per delivery of a record, times in seconds from ``origin``."""
    return "; ".join(
        f"{d.client} via {d.sidecar} p{d.partition}@{d.offset} epoch {d.epoch}: asked "
        f"{d.requested_at - origin:.2f}, got {d.fetched_at - origin:.2f}, "
        f"ack {'accepted' if d.acked else 'not accepted'} {d.acked_at - origin:.2f}"
        for d in sorted(deliveries, key=lambda d: d.requested_at)
    )


def table_problems(service: ServiceProcess, event_only: set[str]) -> list[str]:
    """What a running sidecar's /metrics lacks of its metric table
    (``services/consumer_sidecar/metric_table.py``): a family missing or of another type, a
    family without series unless it is in ``event_only`` (metrics of events a healthy run
    has none of), a series without the table's labels. Empty when all is there."""
    from services.consumer_sidecar.metric_table import METRIC_TABLE

    families = {f.name: f for f in text_string_to_metric_families(metrics(service))}
    problems = []
    for spec in METRIC_TABLE:
        family = families.get(
            spec.name.removesuffix("_total") if spec.type == "counter" else spec.name
        )
        if family is None or family.type != spec.type:
            problems.append(f"{spec.name}: {'missing' if family is None else family.type}")
        elif not family.samples and spec.name not in event_only:
            problems.append(f"{spec.name}: no series")
        else:
            problems += [
                f"{spec.name}: {sample} lacks {spec.labels}"
                for sample in family.samples
                if not set(spec.labels) <= set(sample.labels)
            ]
    return problems
