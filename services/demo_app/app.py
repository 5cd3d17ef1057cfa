"""The demo application's loop: bind (retrying until the mesh answers), fetch, log, ack."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from dsclient import ClientError, DsClient
from services.demo_app.received import ReceivedLog
from services.demo_app.settings import DemoAppSettings
from services.runtime.http import HttpEndpoint, HttpResponse, Route, json_response

log = structlog.get_logger(__name__)

RETRY_SECONDS = 1.0
PAGE_LIMIT = 50_000


class DemoApp:
    def __init__(self, settings: DemoAppSettings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.received = ReceivedLog(settings.max_log_records)
        self._acked = Counter(
            "ds_demo_records_acked",
            "Records fetched and acked (ack accepted)",
            registry=self.registry,
        )
        self._errors = Counter(
            "ds_demo_errors", "Failed binds, fetches and acks", registry=self.registry
        )
        self._bound = Gauge("ds_demo_bound", "1 while bound to the group", registry=self.registry)
        self._client: DsClient | None = None
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def health(self) -> tuple[bool, Mapping[str, Any]]:
        client = self._client
        return client is not None, {
            "service": "ds-demo-app",
            "group": self.settings.group,
            "client_id": self.settings.client_id,
            "sidecars": client.endpoints if client is not None else [],
            "received": self.received.total,
        }

    def routes(self) -> Mapping[str, Route]:
        def received(query: Mapping[str, list[str]]) -> HttpResponse:
            try:
                since = int(query.get("since", ["0"])[0])
                limit = min(PAGE_LIMIT, int(query.get("limit", [str(PAGE_LIMIT)])[0]))
            except ValueError:
                return json_response({"error": "since and limit are integers"}, 400)
            return json_response(
                {"client_id": self.settings.client_id, **self.received.page(since, limit)}
            )

        return {"/received": received}

    def run(self) -> None:
        """Serve HTTP, then read and ack until :meth:`request_stop`."""
        tls = self.settings.tls
        http = HttpEndpoint(
            self.settings.host,
            self.settings.http_port,
            self.registry,
            self.health,
            self.routes(),
            tls=tls if tls.server_enabled else None,  # HTTPS (mTLS) beside a secure mesh
        )
        http.start()
        log.info("listening", http=f"{self.settings.host}:{http.port}")
        try:
            while not self._stop.is_set():
                client = self._connect()
                if client is None:
                    continue
                try:
                    self._consume(client)
                finally:
                    self._client = None
                    self._bound.set(0)
                    client.close()
        finally:
            http.stop()
            log.info("stopped", received=self.received.total)

    def _connect(self) -> DsClient | None:
        try:
            client = DsClient(
                self.settings.group,
                client_id=self.settings.client_id,
                assigner=self.settings.assigner,
                consul=self.settings.consul,
                max_wait=self.settings.fetch_wait_seconds,
                connection=self.settings.connection,  # DS_TLS__*: mTLS and its tokens
            )
        except (grpc.RpcError, ClientError) as exc:
            self._errors.inc()
            log.warning("bind failed; retrying", error=str(exc), assigner=self.settings.assigner)
            self._stop.wait(RETRY_SECONDS)
            return None
        self._client = client
        self._bound.set(1)
        log.info("bound", group=self.settings.group, sidecars=client.endpoints)
        return client

    def _consume(self, client: DsClient) -> None:
        while not self._stop.is_set():
            try:
                batch = client.fetch(max_records=self.settings.max_records)
            except grpc.RpcError as exc:
                self._failed("fetch", exc)
                continue
            if not batch:
                continue
            received_ms = int(time.time() * 1000)  # the ack below may take long (failover)
            acked = False
            try:
                accepted = client.ack(batch)
                acked = accepted == len(batch)
                self._acked.inc(accepted)
            except grpc.RpcError as exc:
                # A record whose ack failed is delivered again (at least once): nothing is
                # lost, and the log says which deliveries may come twice.
                self._failed("ack", exc)
            finally:
                self.received.add(batch, acked=acked, received_ms=received_ms)

    def _failed(self, what: str, exc: grpc.RpcError) -> None:
        # The client retried UNAVAILABLE itself; anything else: log, back off, go on.
        self._errors.inc()
        log.warning(f"{what} failed", error=str(exc))
        self._stop.wait(RETRY_SECONDS)
