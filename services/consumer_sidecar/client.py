"""The application's client for the mesh: bind, fetch, ack — and never handle a move.

    with DsClient("demo", client_id="billing-1") as client:
        for batch in client.stream():
            process(batch)
            client.ack(batch)

A client serves one group (given to the constructor), so ``stream()`` takes no group.
``stream()`` long-polls ``Fetch`` by default; ``use_stream_rpc=True`` (constructor or
``stream()`` argument) reads over the credit-based ``Stream`` RPC instead: one stream per
bound sidecar, ``max_records`` of credit each, credit returned as the application takes
each batch, and ``ack()`` sent on the stream that delivered the records (falling back to
the ``Ack`` RPC if that stream broke). ``auto_ack=True`` acks at delivery in both modes.

The client binds through the assigner, keeps a ``WatchBinding`` stream open on a
background thread (new bindings are pushed the moment a sidecar leaves), and retries
``UNAVAILABLE`` on its own (AIP-194: only that code). Acks go back to the sidecar that
delivered the record, tagged with the record's lease epoch.

Assigner failover (ARCHITECTURE §3 "Leaders"): a follower answers ``FAILED_PRECONDITION``
with the leader's address in trailing metadata ``ds-leader``; the client switches to it and
retries at once. Given ``consul=HOST:PORT``, the client also finds the leader in Consul's
KV (instead of trusting ``assigner``) and follows it with blocking queries on a background
thread, so a dead leader is left the moment a standby takes the lock. Sidecars stay up
during a failover: the client keeps fetching from them while it re-binds on the new leader.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

import grpc
import structlog
from google.protobuf import duration_pb2

from dataservice.assigner.v1 import binding_pb2, binding_pb2_grpc, types_pb2
from dataservice.common.v1 import common_pb2
from dataservice.sidecar.v1 import stream_pb2, stream_pb2_grpc
from services.runtime.errors import LEADER_METADATA_KEY, Reason, error_info, trailing_value
from services.runtime.grpcserver import CHANNEL_OPTIONS
from services.runtime.leader_watch import DEFAULT_LEADER_KEY, LeaderWatchThread

log = structlog.get_logger(__name__)

Record = common_pb2.Record
T = TypeVar("T")

# After a leader change, a binding without sidecars is the new leader still gathering its
# sidecars' re-joins: keep using the old ones this long rather than stop fetching.
EMPTY_BINDING_GRACE_SECONDS = 10.0


# How long ack() waits for a Stream's ack_result before falling back to the Ack RPC.
STREAM_ACK_TIMEOUT_SECONDS = 10.0


class ClientError(Exception):
    """A call failed with a status the client must not retry (bad request, unknown group)."""


@dataclass
class _Sidecar:
    address: str
    channel: grpc.Channel
    stub: stream_pb2_grpc.StreamServiceStub
    partitions: set[tuple[str, int]] = field(default_factory=set)


class _SidecarStream:
    """One ``Stream`` call to one sidecar, on its own thread, re-opened while the sidecar is
    bound. Batches go to ``out``; ack results resolve the futures of :meth:`ack` in order."""

    def __init__(
        self,
        client: DsClient,
        sidecar: _Sidecar,
        window: int,
        out: queue.Queue[tuple[_SidecarStream, list[Record] | ClientError]],
    ) -> None:
        self.client = client
        self.sidecar = sidecar
        self.address = sidecar.address
        self.window = window
        self.out = out
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] | None = None
        self._pending: deque[Future[stream_pb2.StreamAckResult]] = deque()
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

    def ack(self, acks: list[stream_pb2.RecordAck], timeout: float) -> int | None:
        """Acks sent on the stream: how many were accepted, or None if the stream could not
        answer (not open, broken, slow) and the caller should use the Ack RPC."""
        future: Future[stream_pb2.StreamAckResult] = Future()
        with self._lock:
            if self._requests is None:
                return None
            self._pending.append(future)
            self._requests.put(stream_pb2.StreamRequest(acks=stream_pb2.StreamAcks(acks=acks)))
        try:
            return future.result(timeout=timeout).acked_count
        except Exception:
            return None

    def _request_iterator(
        self, requests: queue.SimpleQueue[stream_pb2.StreamRequest | None]
    ) -> Iterator[stream_pb2.StreamRequest]:
        yield stream_pb2.StreamRequest(
            open=stream_pb2.StreamOpen(
                client_id=self.client.client_id,
                group=self.client.group,
                auto_ack=self.client.auto_ack,
                initial_credit=stream_pb2.StreamCredit(records=self.window),
            )
        )
        while (request := requests.get()) is not None:
            yield request

    def _run(self) -> None:
        backoff = 0.1
        while not self._stopped.is_set():
            requests: queue.SimpleQueue[stream_pb2.StreamRequest | None] = queue.SimpleQueue()
            try:
                call = self.sidecar.stub.Stream(self._request_iterator(requests))
            except ValueError:  # the channel was closed (unbound, or the client closed)
                return
            with self._lock:
                self._requests, self._call = requests, call
            try:
                for response in call:
                    if response.WhichOneof("kind") == "batch":
                        self.out.put((self, list(response.batch.records)))
                        backoff = 0.1
                    elif response.WhichOneof("kind") == "ack_result":
                        with self._lock:
                            future = self._pending.popleft() if self._pending else None
                        if future is not None:
                            future.set_result(response.ack_result)
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
                requests.put(None)
                for future in pending:
                    future.set_exception(ConnectionError("stream ended"))
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
            # The sidecar is going or the stream broke: re-open while it is still bound.
            self._stopped.wait(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 2.0)


class DsClient:
    def __init__(
        self,
        group: str,
        *,
        client_id: str | None = None,
        assigner: str = "127.0.0.1:7070",
        auto_ack: bool = False,
        max_wait: float = 0.5,
        call_timeout: float = 35.0,
        consul: str | None = None,
        leader_key: str = DEFAULT_LEADER_KEY,
        use_stream_rpc: bool = False,
    ) -> None:
        self.group = group
        self.use_stream_rpc = use_stream_rpc
        self._streams: dict[str, _SidecarStream] = {}  # address → open Stream (stream RPC)
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self._leader_watch: LeaderWatchThread | None = None
        if consul:
            self._leader_watch = LeaderWatchThread(consul, self._on_leader, key=leader_key)
            assigner = self._leader_watch.current() or assigner
        self.assigner = assigner
        self.auto_ack = auto_ack
        self.max_wait = max_wait
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._sidecars: dict[str, _Sidecar] = {}
        self._binding_version = 0
        self._cursor = 0
        self._delivered_by: dict[tuple[str, int], str] = {}  # partition → sidecar address
        self._closed = threading.Event()
        self._changed = threading.Event()
        self._assigner_lock = threading.Lock()
        self._wake_watch = threading.Event()  # close() or a leader change
        self._watch_call: grpc.Call | None = None
        self._leader_changed_at: float | None = None
        self._assigner_channel = grpc.insecure_channel(assigner, options=CHANNEL_OPTIONS)
        self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
        self._watched_assigner = self.assigner
        self._apply_binding(self._call_assigner(self._bind))
        self._watcher = threading.Thread(target=self._watch, name="ds-binding-watch", daemon=True)
        self._watcher.start()
        if self._leader_watch is not None:
            self._leader_watch.start()

    # ---- public API -------------------------------------------------------------------

    def fetch(self, max_records: int = 500, max_wait: float | None = None) -> list[Record]:
        """Records from any sidecar of the group; empty if none arrived within max_wait."""
        wait = self.max_wait if max_wait is None else max_wait
        deadline = time.monotonic() + wait
        first_pass = True
        while not self._closed.is_set():
            sidecars = self._rotation()
            if not sidecars:
                if time.monotonic() >= deadline:
                    return []
                self._changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._changed.clear()
                continue
            for index, sidecar in enumerate(sidecars):
                # Sweep every sidecar without waiting; long-poll only on the last one.
                last = index == len(sidecars) - 1
                remaining = max(0.0, deadline - time.monotonic())
                poll = remaining if (last and not first_pass) or len(sidecars) == 1 else 0.0
                records = self._fetch_from(sidecar, max_records, poll)
                if records:
                    return records
            first_pass = False
            if time.monotonic() >= deadline:
                return []
        return []

    def ack(self, records: Iterable[Record]) -> int:
        """Acknowledge delivered records; returns how many the sidecars accepted."""
        by_address: dict[str, list[stream_pb2.RecordAck]] = {}
        for r in records:
            address = self._delivered_by.get((r.topic, r.partition))
            if address is None:
                continue
            by_address.setdefault(address, []).append(
                stream_pb2.RecordAck(
                    topic=r.topic, partition=r.partition, offset=r.offset, lease_epoch=r.lease_epoch
                )
            )
        accepted = 0
        for address, acks in by_address.items():
            with self._lock:
                sidecar = self._sidecars.get(address)
                stream = self._streams.get(address)
            if stream is not None:
                counted = stream.ack(acks, STREAM_ACK_TIMEOUT_SECONDS)
                if counted is not None:
                    accepted += counted
                    continue
            if sidecar is None:
                continue  # the sidecar left: its new owner redelivers these records
            accepted += self._ack_rpc(sidecar, acks)
        return accepted

    def _ack_rpc(self, sidecar: _Sidecar, acks: list[stream_pb2.RecordAck]) -> int:
        request = stream_pb2.AckRequest(client_id=self.client_id, group=self.group, acks=acks)
        try:
            response = self._retrying(
                lambda s=sidecar, q=request: s.stub.Ack(q, timeout=10)  # type: ignore[misc]
            )
        except ClientError as err:
            info = error_info(err.__cause__) if isinstance(err.__cause__, grpc.RpcError) else None
            if info is not None and info.reason == Reason.LEASE_EPOCH_STALE.value:
                # Every ack named an old epoch: the partition moved; its records come again.
                log.info("acks for a stale lease epoch; records will be redelivered")
            else:
                log.warning("ack failed; records will be redelivered", error=str(err))
            return 0
        except grpc.RpcError as err:
            log.warning("ack failed; records will be redelivered", error=str(err))
            return 0
        except ValueError:
            # Its channel was closed by a binding change meanwhile: the sidecar left, and
            # the partition's next owner redelivers these records.
            log.info("ack to a sidecar that left; records will be redelivered")
            return 0
        return int(response.acked_count)

    def stream(
        self, max_records: int = 500, *, use_stream_rpc: bool | None = None
    ) -> Iterator[list[Record]]:
        """Batches forever (until close); with auto_ack=False, ack each batch yourself.

        The group is the client's own (one client per group). ``use_stream_rpc`` (default:
        the constructor's) reads over the ``Stream`` RPC instead of long-polling ``Fetch``;
        then each bound sidecar may have up to ``max_records`` records on their way."""
        if self.use_stream_rpc if use_stream_rpc is None else use_stream_rpc:
            yield from self._stream_rpc(max_records)
            return
        while not self._closed.is_set():
            batch = self.fetch(max_records)
            if batch:
                yield batch

    def _stream_rpc(self, window: int) -> Iterator[list[Record]]:
        out: queue.Queue[tuple[_SidecarStream, list[Record] | ClientError]] = queue.Queue()
        try:
            while not self._closed.is_set():
                self._sync_streams(out, window)
                try:
                    stream, item = out.get(timeout=0.2)
                except queue.Empty:
                    continue
                if isinstance(item, ClientError):
                    raise item
                for record in item:
                    self._delivered_by[(record.topic, record.partition)] = stream.address
                yield item
                stream.grant(len(item))  # the application took the batch: send more
        finally:
            with self._lock:
                streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                stream.stop()

    def _sync_streams(
        self,
        out: queue.Queue[tuple[_SidecarStream, list[Record] | ClientError]],
        window: int,
    ) -> None:
        """One Stream per bound sidecar: open new ones, end those no longer bound."""
        stopped = []
        with self._lock:
            for address in list(self._streams):
                if address not in self._sidecars:
                    stopped.append(self._streams.pop(address))
            for address, sidecar in self._sidecars.items():
                if address not in self._streams:
                    stream = _SidecarStream(self, sidecar, window, out)
                    self._streams[address] = stream
                    stream.start()
        for stream in stopped:
            stream.stop()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake_watch.set()
        if self._leader_watch is not None:
            self._leader_watch.stop()
        with contextlib.suppress(grpc.RpcError):
            self._binding_stub.Unbind(
                binding_pb2.UnbindRequest(client_id=self.client_id, group=self.group), timeout=2
            )
        self._assigner_channel.close()
        with self._lock:
            for sidecar in self._sidecars.values():
                sidecar.channel.close()
            self._sidecars.clear()

    def __enter__(self) -> DsClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def endpoints(self) -> list[str]:
        with self._lock:
            return sorted(self._sidecars)

    # ---- binding ----------------------------------------------------------------------

    def _bind(self) -> types_pb2.Binding:
        request = binding_pb2.BindRequest(client_id=self.client_id, group=self.group)
        return self._binding_stub.Bind(request, timeout=10).binding

    def _watch(self) -> None:
        backoff = 0.1
        while not self._closed.is_set():
            try:
                if self.assigner != self._watched_assigner:
                    self._rebind()
                request = binding_pb2.WatchBindingRequest(
                    client_id=self.client_id, group=self.group, known_version=self._binding_version
                )
                call = self._binding_stub.WatchBinding(request)
                self._watch_call = call
                if self.assigner != self._watched_assigner:
                    # The leader moved while we were connecting.
                    call.cancel()  # type: ignore[no-untyped-call]
                for response in call:
                    self._apply_binding(response.binding)
                    backoff = 0.1
            except (grpc.RpcError, ClientError, ValueError) as err:
                # ValueError: the channel was closed under us (a leader switch, or close()).
                if self._closed.is_set():
                    return
                if isinstance(err, grpc.RpcError):
                    self._follow_leader(err)
                log.debug("binding watch broken; re-watching", error=str(err))
            finally:
                self._watch_call = None
            if self.assigner != self._watched_assigner:
                continue  # a new leader: re-bind there at once
            self._wake_watch.wait(backoff * (0.5 + random.random()))
            self._wake_watch.clear()
            backoff = min(backoff * 2, 5.0)

    def _rebind(self) -> None:
        """Bind on a new leader. Binding versions of different leaders are not comparable
        (until assigner state is shared), so the new leader's binding replaces ours."""
        assigner = self.assigner
        binding = self._call_assigner(self._bind)
        self._watched_assigner = assigner
        with self._lock:
            self._binding_version = 0
        self._apply_binding(binding)

    def _apply_binding(self, binding: types_pb2.Binding) -> None:
        with self._lock:
            if binding.version and binding.version < self._binding_version:
                return
            moved = self._leader_changed_at
            if (
                not binding.endpoints
                and self._sidecars
                and moved is not None
                and time.monotonic() - moved < EMPTY_BINDING_GRACE_SECONDS
            ):
                # Keep fetching from the sidecars we know; the new leader pushes them
                # again as they re-join. Its version still counts, so the watch goes on.
                self._binding_version = binding.version
                return
            self._binding_version = binding.version
            wanted = {e.address: e for e in binding.endpoints}
            for address in list(self._sidecars):
                if address not in wanted:
                    self._sidecars.pop(address).channel.close()
            for address, endpoint in wanted.items():
                sidecar = self._sidecars.get(address)
                if sidecar is None:
                    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                    sidecar = _Sidecar(address, channel, stream_pb2_grpc.StreamServiceStub(channel))
                    self._sidecars[address] = sidecar
                sidecar.partitions = {(tp.topic, tp.partition) for tp in endpoint.partitions}
        log.debug("binding", version=binding.version, endpoints=sorted(wanted))
        self._changed.set()

    def _follow_leader(self, err: grpc.RpcError) -> bool:
        """Switch to the leader a follower named; True if there was one to switch to."""
        leader = trailing_value(err, LEADER_METADATA_KEY)
        if leader:
            self._switch_assigner(leader)
            return True
        return False

    def _on_leader(self, leader: str | None) -> None:
        """The Consul leader watch saw a new leader (runs on the watch thread)."""
        if leader:
            self._switch_assigner(leader)

    def _switch_assigner(self, leader: str) -> None:
        with self._assigner_lock:
            if leader == self.assigner or self._closed.is_set():
                return
            log.info("following the assigner leader", leader=leader, old=self.assigner)
            old = self._assigner_channel
            self._assigner_channel = grpc.insecure_channel(leader, options=CHANNEL_OPTIONS)
            self._binding_stub = binding_pb2_grpc.BindingServiceStub(self._assigner_channel)
            self.assigner = leader
            self._leader_changed_at = time.monotonic()
            call = self._watch_call
        if call is not None:
            # The watch thread re-binds on the new leader at once.
            call.cancel()  # type: ignore[no-untyped-call]
        self._wake_watch.set()
        old.close()

    def _leader_from_consul(self) -> None:
        """Read the leader key now (after an assigner call failed)."""
        if self._leader_watch is None:
            return
        with contextlib.suppress(Exception):
            if leader := self._leader_watch.current():
                self._switch_assigner(leader)

    # ---- calls ------------------------------------------------------------------------

    def _rotation(self) -> list[_Sidecar]:
        with self._lock:
            sidecars = [self._sidecars[a] for a in sorted(self._sidecars)]
        if not sidecars:
            return []
        self._cursor = (self._cursor + 1) % len(sidecars)
        return sidecars[self._cursor :] + sidecars[: self._cursor]

    def _fetch_from(self, sidecar: _Sidecar, max_records: int, wait: float) -> list[Record]:
        max_wait = duration_pb2.Duration()
        max_wait.FromNanoseconds(int(wait * 1e9))
        request = stream_pb2.FetchRequest(
            client_id=self.client_id,
            group=self.group,
            max_records=max_records,
            max_wait=max_wait,
            auto_ack=self.auto_ack,
        )
        try:
            response = sidecar.stub.Fetch(request, timeout=wait + self.call_timeout)
        except ValueError:
            # A binding change closed this sidecar's channel while we were about to call it
            # (another thread): it is gone; fetch from the others.
            return []
        except grpc.RpcError as err:
            if err.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            ):
                # The sidecar is gone or going: the assigner pushes a new binding.
                log.debug("sidecar unavailable; waiting for a new binding", sidecar=sidecar.address)
                return []
            raise ClientError(
                f"Fetch from {sidecar.address} failed: {err.code().name}: {err.details()}"
            ) from err
        for record in response.records:
            self._delivered_by[(record.topic, record.partition)] = sidecar.address
        return list(response.records)

    def _call_assigner(self, fn: Callable[[], types_pb2.Binding]) -> types_pb2.Binding:
        return self._retrying(fn, assigner=True)

    def _retrying(self, fn: Callable[[], T], attempts: int = 8, *, assigner: bool = False) -> T:
        """Retry UNAVAILABLE with jittered backoff (AIP-194), and a follower's redirect to
        the leader; any other status is the caller's problem and raises ClientError.

        ``fn`` must look the stub up when called (``self._binding_stub``), so a retry after
        a redirect goes to the new leader. For assigner calls, ``NOT_LEADER`` from a
        follower that does not know the leader yet (mid-election) is retried like
        UNAVAILABLE, and with Consul the leader key is read again before each retry."""
        backoff = 0.05
        for attempt in range(attempts):
            try:
                return fn()
            except ValueError:
                # "Cannot invoke RPC on closed channel": a leader switch replaced the
                # channel between looking the stub up and calling it. Retry on the new one.
                if self._closed.is_set() or attempt == attempts - 1:
                    raise
                continue
            except grpc.RpcError as err:
                last = attempt == attempts - 1
                if not last and self._follow_leader(err):
                    continue
                code = err.code()
                info = error_info(err)
                electing = assigner and info is not None and info.reason == Reason.NOT_LEADER.value
                if code != grpc.StatusCode.UNAVAILABLE and not electing:
                    raise ClientError(f"{code.name}: {err.details()}") from err
                if last:
                    if electing:
                        raise ClientError(f"{code.name}: {err.details()}") from err
                    raise
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
                if assigner:
                    self._leader_from_consul()
        raise AssertionError("unreachable")
