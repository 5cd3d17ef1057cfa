"""The ``Stream`` RPC reader: one credit-based stream per bound sidecar, on its own thread.

The application's thread only takes what the streams put on a queue and grants credit
back as it takes it; acks may go on the stream that delivered the records and are answered
in order, so a stream that breaks fails its pending acks and the caller falls back to the
``Ack`` RPC.
"""

from __future__ import annotations

import queue
import random
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future

import grpc

from dataservice.sidecar.v1 import stream_pb2
from services.client.batch import Batch, Span, accepted_spans, received
from services.client.errors import ClientError
from services.client.sidecar import Sidecar


class SidecarStream:
    """One ``Stream`` call to one sidecar, on its own thread, re-opened while the sidecar is
    bound. Batches go to ``out``; ack results resolve the futures of :meth:`ack` in order."""

    def __init__(
        self,
        sidecar: Sidecar,
        opening: stream_pb2.StreamOpen,
        out: queue.Queue[tuple[SidecarStream, Batch | ClientError]],
    ) -> None:
        """``opening`` is sent first on every (re-)opened stream: the client, its group,
        ``auto_ack`` and the initial credit (the window)."""
        self.sidecar = sidecar
        self.address = sidecar.address
        self.opening = opening
        self.out = out
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] | None = None
        self._pending: deque[Future[stream_pb2.StreamAckResult]] = deque()
        self._pending_nacks: deque[Future[stream_pb2.StreamNackResult]] = deque()
        self._call: grpc.Call | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-stream", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            requests, call = self._requests, self._call
        if requests is not None:
            requests.put(None)
        if call is not None:
            call.cancel()  # type: ignore[no-untyped-call]

    def grant(self, records: int) -> None:
        with self._lock:
            if self._requests is not None:
                credit = stream_pb2.StreamCredit(records=records)
                self._requests.put(stream_pb2.StreamRequest(credit=credit))

    def ack(self, spans: list[Span], timeout: float) -> list[bool] | None:
        """Range acks sent on the stream: whether each was accepted, or None if the stream
        could not answer (not open, broken, slow) and the caller should use the Ack RPC."""
        future: Future[stream_pb2.StreamAckResult] = Future()
        acks = stream_pb2.StreamAcks(ranges=[s.range_ack() for s in spans])
        with self._lock:
            if self._requests is None:
                return None
            self._pending.append(future)
            self._requests.put(stream_pb2.StreamRequest(acks=acks))
        try:
            result = future.result(timeout=timeout)
        except Exception:
            return None
        return accepted_spans(spans, result.rejected_ranges)

    def nack(self, spans: list[Span], delay: float, timeout: float) -> list[bool] | None:
        """Range nacks sent on the stream (records to deliver again after ``delay`` s):
        whether each was accepted, or None if the stream could not answer."""
        future: Future[stream_pb2.StreamNackResult] = Future()
        nacks = stream_pb2.StreamNacks(ranges=[s.range_ack() for s in spans])
        if delay:
            nacks.delay.FromNanoseconds(int(delay * 1e9))
        with self._lock:
            if self._requests is None:
                return None
            self._pending_nacks.append(future)
            self._requests.put(stream_pb2.StreamRequest(nacks=nacks))
        try:
            result = future.result(timeout=timeout)
        except Exception:
            return None
        return accepted_spans(spans, result.rejected_ranges)

    def _request_iterator(
        self, requests: queue.SimpleQueue[stream_pb2.StreamRequest | None]
    ) -> Iterator[stream_pb2.StreamRequest]:
        yield stream_pb2.StreamRequest(open=self.opening)
        while (request := requests.get()) is not None:
            yield request

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopped.is_set():
            requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()
            try:
                call = self.sidecar.stream(self._request_iterator(requests))
            except ValueError:  # the channel was closed (unbound, or the client closed)
                return
            with self._lock:
                self._requests, self._call = requests, call
            try:
                for response in call:
                    if isinstance(response, Batch):
                        self.out.put((self, response))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "batch":
                        self.out.put((self, received(response.batch)))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "ack_result":
                        with self._lock:
                            future = self._pending.popleft() if self._pending else None
                        if future is not None:
                            future.set_result(response.ack_result)
                    elif response.WhichOneof("kind") == "nack_result":
                        with self._lock:
                            nacked = self._pending_nacks.popleft() if self._pending_nacks else None
                        if nacked is not None:
                            nacked.set_result(response.nack_result)
                error: grpc.RpcError | None = None
            except grpc.RpcError as err:
                error = err
            except ValueError:  # the channel was closed (unbound, or the client closed)
                error = None
                self._stopped.set()
            finally:
                with self._lock:
                    self._requests, self._call = None, None
                    pending, self._pending = self._pending, deque()
                    pending_nacks, self._pending_nacks = self._pending_nacks, deque()
                requests.put(None)
                for future in pending:
                    future.set_exception(ConnectionError("stream ended"))
                for nack_future in pending_nacks:
                    nack_future.set_exception(ConnectionError("stream ended"))
            if self._stopped.is_set():
                return
            if error is not None and error.code() not in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                self.out.put(
                    (
                        self,
                        ClientError(
                            f"Stream from {self.address}: {error.code().name}: {error.details()}"
                        ),
                    )
                )
                return
            # The sidecar is going or the stream broke: re-open while it is still bound
            # (over TCP if its socket failed).
            if error is not None and error.code() is grpc.StatusCode.UNAVAILABLE:
                self.sidecar.fall_back()
            self._stopped.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 2.0)
