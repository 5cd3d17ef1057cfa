"""The injector's metrics, declared against an injected registry (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from services.injector.patch import Action


class InjectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reviews = Counter(
            "ds_injector_reviews_total",
            "AdmissionReviews answered, by what was done to the pod "
            "(injected, updated, unchanged, skipped, failed = admitted without the sidecar)",
            ["action"],
            registry=registry,
        )
        self.bad_requests = Counter(
            "ds_injector_bad_requests_total",
            "Requests refused with HTTP 4xx (not an AdmissionReview, too large, wrong path)",
            registry=registry,
        )
        self.review_seconds = Histogram(
            "ds_injector_review_duration_seconds",
            "Time to answer one AdmissionReview (parse, patch, encode)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.certificate_loads = Counter(
            "ds_injector_certificate_loads_total",
            "Serving certificate (re)loads from its files, by result (ok, error)",
            ["result"],
            registry=registry,
        )
        for action in Action:
            self.reviews.labels(action=action.value)
        for result in ("ok", "error"):
            self.certificate_loads.labels(result=result)
