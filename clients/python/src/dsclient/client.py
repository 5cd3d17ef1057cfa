"""DsClient: read a group's records from its sidecars and ack them.

Reading (``Fetch`` long-polls over the bound sidecars in turn, or one ``Stream`` per
sidecar) and acking (each ack to the sidecar that delivered the records) live here; which
sidecars are bound, and following the assigner's leader, is :mod:`binding`'s job.

One job, why whole (about 780 lines): the client's public read-and-ack API (DsClient).
Fetch, Stream and the acks share the per-sidecar routing and the delivery bookkeeping that
makes an ack go back where its records came from; the connection, binding, long-poll, stream
and codec parts are already modules of their own (connection.py, binding.py, long_poll.py,
stream.py, records/).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError, wait
from functools import partial
from types import TracebackType
from typing import Any, cast

import grpc
from google.protobuf import duration_pb2

from dataservice.sidecar.v1 import stream_pb2
from dsclient.acker import CARRY_WAIT_SECONDS, Acker, Pending
from dsclient.batch import Batch, Span, accepted_spans, counted, joined, spans_of
from dsclient.binding import BindingKeeper
from dsclient.columns import ColumnBatch, Release, by_stream, joined_columns
from dsclient.connection import (
    DEFAULT_SETTINGS,
    CallPolicy,
    ConnectionSettings,
    TlsConfig,
    retry_call,
)
from dsclient.errors import ClientError
from dsclient.leader_watch import DEFAULT_LEADER_KEY
from dsclient.mesh_env import MeshEnv
from dsclient.reasons import Reason, error_info
from dsclient.records.batches import DsRecord
from dsclient.sidecar import Fetched, Sidecar
from dsclient.stream import SidecarStream

log = logging.getLogger(__name__)

# How long ack() waits for a Stream's ack_result before falling back to the Ack RPC.
STREAM_ACK_TIMEOUT_SECONDS = 10.0
# An Ack RPC: UNAVAILABLE retried, 8 attempts backing off from 50 ms to 2 s (AIP-194).
ACK_CALLS = CallPolicy(attempts=8, retry_electing=False)
# Acks of a partition's older epochs still go to the sidecar that delivered them (it may be
# draining the partition for a handoff); this many epochs per partition are remembered.
EPOCHS_REMEMBERED = 4
MAX_NACK_DELAY_SECONDS = 12 * 3600.0


class DsClient:
    """Reads one consumer group's records through the sidecars that serve it, and acks them.

    The client is bound to its group's sidecars by the assigner and keeps that binding
    current by itself: a sidecar that leaves is dropped and the partitions' new owners are
    read from the moment the assigner pushes the new binding; an assigner failover is
    followed without the application noticing. Use it as a context manager, or call
    :meth:`close`.

    Guarantees (ARCHITECTURE §3 "Delivery"):

    * At least once. A record is committed to the Kafka consumer group only once it is
      acked (with ``auto_ack``, once the sidecar has written it to this client). An ack
      counted as accepted is committed in Kafka. Duplicates are possible, loss is not.
    * Nothing stays in flight forever. A record delivered and not acked holds its
      partition's commit point back until it is delivered again — to whichever client of
      the group reads next — when its ack deadline (the group's visibility timeout, 30 s by
      default) passes, when this client gives it back (:meth:`nack`, or :meth:`close`),
      when the ``Stream`` that carried it ends, or when the partition changes hands.
      Each record says how often it was delivered (``DsRecord.delivery_count``); one
      delivered too often without an ack (the group's ``max_deliveries``, 10 by default)
      is given up and reported as a ``POISON_RECORD`` fault with its partition and offset.
    * Within a partition, records are handed out in offset order, and a record due again
      goes out before any record after it is delivered for the first time. A client may
      therefore see a partition go back: records it (or another client) received and did
      not ack come again, in order, after later ones. Records acked meanwhile, and records
      in flight to another client, are not repeated. Across partitions there is no order.
    * Every record carries the epoch of the lease it was delivered under, and its ack goes
      to the sidecar that delivered it under that epoch: an ack for a partition that moved
      since is refused (not counted), and the partition's new owner delivers the record
      again.

    Threads: the binding watch (and with ``consul`` the leader watch) runs in the
    background, ``ack_nowait`` sends from a thread of its own, and ``use_stream_rpc`` reads
    each sidecar's stream on a thread of its own; all are daemon threads, ended by
    :meth:`close`. Read (``fetch``/``stream``) from one thread at a time; acks may be sent
    while the next batch is read.

    Attributes:
        group: The consumer group this client reads.
        client_id: The client's identity towards the assigner and the sidecars (bindings,
            per-client metrics).
        auto_ack: Whether sidecars ack records at delivery.
        max_wait: The default long-poll wait of :meth:`fetch`, in seconds.
        call_timeout: Added to the long-poll wait as each ``Fetch`` call's deadline.
        use_stream_rpc: Whether :meth:`stream` reads over the ``Stream`` RPC by default.
    """

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
        connection: ConnectionSettings | None = None,
    ) -> None:
        """Bind to the group's sidecars through the assigner and start following the binding.

        Returns once the assigner has answered the bind; the sidecars it names are reached
        on first use.

        Args:
            group: The consumer group to read; one client reads one group.
            client_id: A stable identity for this application instance; default a random
                ``client-<hex>`` (fine for one-off readers, but per-client metrics then
                change name at every start).
            assigner: ``HOST:PORT`` of an assigner. Any replica will do: a follower's
                answer names the leader (``ds-leader``) and the client switches to it.
            auto_ack: Let the sidecars count records as acked once they have written them
                to this client: no :meth:`ack` calls, but a crash of the application loses
                what it had received and not processed.
            max_wait: The default long-poll wait of :meth:`fetch`, in seconds.
            call_timeout: Added to the long-poll wait as each ``Fetch`` call's deadline.
            consul: ``HOST:PORT`` of Consul: the leader is read from ``leader_key`` at
                start (instead of trusting ``assigner``) and followed with blocking
                queries from then on.
            leader_key: The Consul KV key the assigner leader holds.
            use_stream_rpc: Read over the credit-based ``Stream`` RPC in :meth:`stream`
                by default, instead of long-polling ``Fetch``.
            connection: How to reach the mesh (channel options, TLS, mTLS, the bearer
                token). Default: the runtime's defaults with the TLS settings of the
                ``DS_TLS__*`` variables (``DS_TLS__CA_FILE``, ``DS_TLS__TOKEN_FILE``, ...;
                none set: plaintext).

        Raises:
            ClientError: The assigner refused the bind (an unknown group:
                ``NOT_FOUND``/``GROUP_NOT_FOUND``; with authorization on,
                ``UNAUTHENTICATED`` or ``PERMISSION_DENIED``), or no leader emerged while
                retrying (``NOT_LEADER``).
            ValueError: A ``DS_TLS__*`` variable is malformed.
            grpc.RpcError: No assigner answered (``UNAVAILABLE``) through the retries
                (8 attempts with jittered backoff, a few seconds).
            Exception: What py-consul raises (``consul.ConsulException``, a connection
                error) when ``consul`` is given and cannot be read at start.
        """
        self.group = group
        self.use_stream_rpc = use_stream_rpc
        self._streams: dict[str, SidecarStream] = {}  # address → open Stream (stream RPC)
        self.client_id = client_id or f"client-{uuid.uuid4().hex[:12]}"
        self.auto_ack = auto_ack
        self.max_wait = max_wait
        self.call_timeout = call_timeout
        self._lock = threading.Lock()  # the binding's sidecars and our streams
        self._cursor = 0
        # address → when a Fetch from it last returned records (where fetch long-polls)
        self._delivered_at: dict[str, float] = {}
        # (topic, partition) → {lease epoch → address of the sidecar that delivered under it}
        self._delivered_by: dict[tuple[str, int], dict[int, str]] = {}
        # ack_nowait(): one thread, so a client's acks reach the sidecars in the order given;
        # started on first use, drained by close().
        self._acker: Acker | None = None
        self._acker_lock = threading.Lock()
        self._fetching = False  # fetch() was called: queued acks wait for one to carry them
        self._ack_seq = 0  # the last FetchRequest.ack_seq
        self._acks_closed = False
        # ack_nowait() calls sent on their stream from the caller's thread (no ack thread
        # while it has nothing of theirs to keep order with), until answered; close() waits.
        self._stream_acks: set[Future[int]] = set()
        self._stream_acks_lock = threading.Lock()  # never held while resolving a future
        self.connection = (
            connection
            if connection is not None
            else DEFAULT_SETTINGS.with_tls(TlsConfig.from_env())
        )
        self._binding = BindingKeeper(
            group,
            self.client_id,
            assigner=assigner,
            consul=consul,
            leader_key=leader_key,
            lock=self._lock,
            settings=self.connection,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> DsClient:
        """A client configured the way an injected pod describes the mesh.

        The sidecar injector (``dsctl inject``, the admission webhook) gives every
        application container ``DS_GROUP``, ``DS_ASSIGNER`` and ``DS_SIDECAR``
        (clients/python/src/dsclient/mesh_env.py); this reads them, so an application needs no
        configuration of its own to find the mesh.

        Args:
            environ: The variables to read; default ``os.environ``.
            **options: Any other constructor argument (``auto_ack``, ``use_stream_rpc``,
                ...); ``client_id``, ``assigner`` and ``consul`` given here win over the
                environment.

        Returns:
            A client of group ``DS_GROUP``, bound through ``DS_ASSIGNER`` (default
            ``127.0.0.1:7070``), with client id ``DS_CLIENT_ID`` or else the hostname (in
            Kubernetes: the pod name), following the leader in Consul if ``DS_CONSUL`` is
            set.

        Raises:
            KeyError: ``DS_GROUP`` is not set (the pod was not injected).
            ClientError, grpc.RpcError: As the constructor.
        """
        env = MeshEnv.read(environ)
        options.setdefault("client_id", env.client_id)
        options.setdefault("assigner", env.assigner)
        if env.consul is not None:
            options.setdefault("consul", env.consul)
        return cls(env.group, **options)

    # ---- public API -------------------------------------------------------------------

    def fetch(
        self, max_records: int = 500, max_wait: float | None = None, max_bytes: int = 0
    ) -> Batch:
        """Records from any sidecar of the group; empty if none arrived within ``max_wait``.

        The bound sidecars are asked in turn without waiting, then one long-polls for what
        is left of ``max_wait``: of those the binding gives partitions to, the one that
        returned records last (:func:`long_poll_target`); the records come from one sidecar.
        A sidecar
        that is unavailable is skipped (the assigner pushes a new binding). Unless the
        client was made with ``auto_ack``, ack what you processed (:meth:`ack`,
        :meth:`ack_nowait`).

        Args:
            max_records: At most this many records.
            max_wait: How long to wait for records, in seconds; default the client's.
            max_bytes: Bound on the batch's keys and values; 0 = the sidecar's default.
                A record larger than the bound still comes, alone.

        Returns:
            The records, as one :class:`Batch`; empty when none arrived in time or the
            client is closed.

        Raises:
            ClientError: A sidecar refused the request with a status other than
                ``UNAVAILABLE``, ``DEADLINE_EXCEEDED`` or ``CANCELLED`` (an invalid
                ``max_records``, a sidecar that does not serve the group); or the
                binding watch stopped on ``NOT_FOUND``, ``INVALID_ARGUMENT``,
                ``PERMISSION_DENIED`` or ``UNAUTHENTICATED`` (the group was deleted, the
                client's role revoked), raised by this read and every one after it.
        """
        wait = self.max_wait if max_wait is None else max_wait
        deadline = time.monotonic() + wait
        first_pass = True
        while not self._binding.closed.is_set():
            self._binding.check()
            sidecars = self._rotation()
            if not sidecars:
                if time.monotonic() >= deadline:
                    return Batch()
                self._binding.changed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._binding.changed.clear()
                continue
            if not first_pass:
                # Sweep the others without waiting, then long-poll where records come from.
                bound = {s.address for s in sidecars}
                self._delivered_at = {a: t for a, t in self._delivered_at.items() if a in bound}
                target = long_poll_target(sidecars, self._delivered_at)
                sidecars = [s for s in sidecars if s is not target] + [target]
            for index, sidecar in enumerate(sidecars):
                # Sweep every sidecar without waiting; long-poll only on the last one.
                last = index == len(sidecars) - 1
                remaining = max(0.0, deadline - time.monotonic())
                poll = remaining if (last and not first_pass) or len(sidecars) == 1 else 0.0
                records = self._fetch_from(sidecar, max_records, poll, max_bytes)
                if records:
                    return records
            first_pass = False
            if time.monotonic() >= deadline:
                return Batch()
        return Batch()

    def ack(self, records: Iterable[DsRecord] | ColumnBatch) -> int:
        """Acknowledge delivered records, and wait until their sidecars have committed them.

        A whole :class:`Batch` as returned goes as one range ack per partition run; any
        other collection of records (a subset, several batches) is cut into runs of
        consecutive offsets, and no range ever covers a record not given. Each run goes to
        the sidecar that delivered it (on its stream, with ``use_stream_rpc``); the
        partition's commit point advances to its lowest offset not acked yet, and the
        sidecar answers once that is committed to Kafka (a broker round trip: see
        :meth:`ack_nowait` to overlap it with the next fetch).

        A :class:`ColumnBatch` (:meth:`stream_columns`) is acked one range per run, and
        the shared-memory regions its columns lie in are released with the acks, on the
        stream that delivered them: its columns are not valid after this call.

        Args:
            records: Records as this client delivered them, or a ColumnBatch whole.

        Returns:
            How many of the records the sidecars accepted. The others were not committed
            and are delivered again: their partition moved to another sidecar (a stale
            lease epoch, a sidecar that left) or the ack failed; each case is logged.
            Failures never raise: ``UNAVAILABLE`` is retried a few times, then counted.
        """
        spans, releases = _spans_and_releases(records)
        return counted(spans, self._ack_spans(spans, releases))

    def _ack_spans(
        self, spans: list[Span], releases: Sequence[Release] = (), *, answer_now: bool = True
    ) -> list[bool]:
        """Send range acks, each to the sidecar that delivered its records (on its stream
        if one is open, else with the Ack RPC): whether each was accepted. ``releases``
        go on the streams that delivered them, with those acks or alone. ``answer_now``
        False (``ack_nowait``): a stream's sidecar may answer with its next batch."""
        accepted = [False] * len(spans)
        unreleased = by_stream(releases)
        for address, indices in self._by_sidecar(spans).items():
            sent = [spans[i] for i in indices]
            with self._lock:
                sidecar = self._binding.sidecars.get(address)
                stream = self._streams.get(address)
            answers = (
                stream.ack(
                    sent,
                    STREAM_ACK_TIMEOUT_SECONDS,
                    unreleased.pop(stream, None),
                    answer_now=answer_now,
                )
                if stream is not None
                else None
            )
            if answers is None:
                if sidecar is None:
                    continue  # the sidecar left: its new owner redelivers these records
                answers = self._ack_rpc(sidecar, sent)
            for index, ok in zip(indices, answers, strict=True):
                accepted[index] = ok
        self._release(unreleased)
        return accepted

    def _release(self, released: Mapping[Hashable, Mapping[int, Sequence[int]]]) -> None:
        """Regions no ack carried, each stream's on its own (only a stream still open:
        one that was stopped took its ring with it)."""
        for stream in released:
            if isinstance(stream, SidecarStream):
                stream.release(released[stream])

    def _by_sidecar(self, spans: list[Span]) -> dict[str, list[int]]:
        """The indexes of ``spans`` by the address of the sidecar that delivered each (the
        one that delivered its partition under its lease epoch); spans whose sidecar is not
        known are left out."""
        by_address: dict[str, list[int]] = {}
        for index, span in enumerate(spans):
            address = self._sidecar_of(span.topic, span.partition, span.lease_epoch)
            if address is not None:
                by_address.setdefault(address, []).append(index)
        return by_address

    def _sidecar_of(self, topic: str, partition: int, epoch: int) -> str | None:
        """The address of the sidecar that delivered records of a partition under ``epoch``."""
        return self._delivered_by.get((topic, partition), {}).get(epoch)

    def _delivered(self, spans: Iterable[Span], address: str) -> None:
        """Remember who delivered these spans (the last few epochs of each partition:
        acks of an older epoch still go to its sidecar, which may be handing it off)."""
        for span in spans:
            epochs = self._delivered_by.setdefault((span.topic, span.partition), {})
            if epochs.get(span.lease_epoch) == address:
                continue
            epochs[span.lease_epoch] = address
            while len(epochs) > EPOCHS_REMEMBERED:
                del epochs[min(epochs)]

    def nack(self, records: Iterable[DsRecord] | ColumnBatch, delay: float = 0.0) -> int:
        """Give delivered records back, to be delivered again now or after ``delay``.

        For records this client cannot process now (a dependency is down, it is shutting
        down) but that must not wait for their ack deadline: each goes back to the sidecar
        that delivered it, which delivers it again — to whichever client of the group reads
        next, in offset order, with its delivery count one higher — after ``delay``
        seconds. Until then the record stays in flight to this client (an ack still
        counts). A record nacked after its group's ``max_deliveries`` is given up (a
        ``POISON_RECORD`` fault names it) instead.

        A :class:`ColumnBatch` releases its shared-memory regions too: its columns are
        not valid after this call.

        Args:
            records: Records as this client delivered them, or a ColumnBatch whole.
            delay: Seconds before they are delivered again (0 to 12 hours).

        Returns:
            How many of the records the sidecars accepted back. The others were acked
            already, are due again already, or moved with their partition (which delivers
            them again anyway). Failures never raise: ``UNAVAILABLE`` is retried a few
            times, then counted as not accepted.

        Raises:
            ValueError: ``delay`` is negative or over 12 hours.
        """
        if not 0 <= delay <= MAX_NACK_DELAY_SECONDS:
            raise ValueError(f"delay must be between 0 and {MAX_NACK_DELAY_SECONDS:.0f} s")
        spans, releases = _spans_and_releases(records)
        accepted = [False] * len(spans)
        for address, indices in self._by_sidecar(spans).items():
            sent = [spans[i] for i in indices]
            with self._lock:
                sidecar = self._binding.sidecars.get(address)
                stream = self._streams.get(address)
            answers = (
                stream.nack(sent, delay, STREAM_ACK_TIMEOUT_SECONDS) if stream is not None else None
            )
            if answers is None:
                if sidecar is None:
                    continue
                answers = self._nack_rpc(sidecar, sent, delay)
            for index, ok in zip(indices, answers, strict=True):
                accepted[index] = ok
        self._release(by_stream(releases))
        return counted(spans, accepted)

    def _nack_rpc(self, sidecar: Sidecar, spans: list[Span], delay: float) -> list[bool]:
        request = stream_pb2.NackRequest(
            client_id=self.client_id, group=self.group, ranges=[s.range_ack() for s in spans]
        )
        if delay:
            request.delay.FromNanoseconds(int(delay * 1e9))
        try:
            response = retry_call(lambda: sidecar.stub.Nack(request, timeout=10), ACK_CALLS)
        except (grpc.RpcError, ValueError) as err:
            log.info("nack not delivered; the records come again after their deadline: %s", err)
            return [False] * len(spans)
        return accepted_spans(spans, response.rejected_ranges)

    def _give_back(self) -> None:
        """close(): every bound sidecar delivers again what it delivered to this client and
        was not acked (best effort, 2 s each), so the next reader need not wait for the
        records' ack deadlines."""
        with self._lock:
            sidecars = list(self._binding.sidecars.values())
        request = stream_pb2.NackRequest(client_id=self.client_id, group=self.group, all=True)
        for sidecar in sidecars:
            try:
                sidecar.stub.Nack(request, timeout=2)
            except (grpc.RpcError, ValueError) as err:
                log.debug("records in flight not given back to %s: %s", sidecar.address, err)

    def ack_nowait(self, records: Iterable[DsRecord] | ColumnBatch) -> Future[int]:
        """Acknowledge like :meth:`ack` without waiting for the answer.

        The acks are sent in the order of the calls, by one background thread, so the next
        :meth:`fetch` travels while the sidecar commits this batch (commit on ack costs a
        broker round trip); the acks that queue up while one is committed go together in
        the next (one commit). Nothing is weaker than with :meth:`ack`: a record counts as
        processed once the future says it was accepted, and an ack that fails only means
        redelivery. :meth:`close` waits for the acks still on their way. On a ``Stream``
        (``use_stream_rpc``, :meth:`stream_columns`) the sidecar may send the answer with
        its next batch, up to 100 ms after the commit, instead of a message of its own
        (``StreamOpen.answers_with_batches``); the commit is not delayed. In a
        :meth:`fetch` loop the acks ride in the next fetch to the sidecar that delivered
        them (``FetchRequest.ack_ranges``: one call less per batch), applied before it
        takes records; the future resolves when a later response brings their answer (once
        committed). A batch of more than 1,000 records, acks no fetch carries within 20 ms,
        and acks whose answer does not come within 2 s go on their own.

        A :class:`ColumnBatch`'s shared-memory regions are released with its acks: its
        columns are not valid after this call.

        Args:
            records: Records as this client delivered them, or a ColumnBatch whole.

        Returns:
            A future of how many of the records the sidecars accepted (as :meth:`ack`
            returns it), resolved on the ack thread, or on the stream's thread when
            the acks went on the stream that delivered the records (no ack of the
            thread's queued before them).

        Raises:
            ClientError: The client is closed.
        """
        spans, releases = _spans_and_releases(records)
        with self._acker_lock:
            if self._acks_closed:
                raise ClientError("the client is closed")
            if self._acker is None or self._acker.idle:
                on_stream = self._ack_on_stream(spans, releases)
                if on_stream is not None:
                    return on_stream
            if self._acker is None:
                self._acker = Acker(partial(self._ack_spans, answer_now=False))
                if self._fetching:
                    self._acker.carry_wait = CARRY_WAIT_SECONDS
            return self._acker.submit(spans, releases)

    def _ack_on_stream(self, spans: list[Span], releases: Sequence[Release]) -> Future[int] | None:
        """``ack_nowait`` without the ack thread (called holding the acker lock, the thread
        idle): when every span (and region) was delivered by one open stream, the acks are
        written on it from this thread and the future is resolved by the stream's thread
        when their answer comes, which saves two thread hand-offs per batch. None: the
        ack thread sends them. An opening that ends before answering hands them to
        :meth:`_ack_again`."""
        by_address = self._by_sidecar(spans)
        if len(by_address) != 1:
            return None
        ((address, indices),) = by_address.items()
        with self._lock:
            stream = self._streams.get(address)
        unreleased = by_stream(releases)
        if stream is None or len(indices) != len(spans) or unreleased.keys() - {stream}:
            return None
        sent = stream.ack_async(spans, unreleased.get(stream), answer_now=False)
        if sent is None:
            return None
        done: Future[int] = Future()
        with self._stream_acks_lock:
            self._stream_acks.add(done)

        def settled(_: Future[int]) -> None:
            with self._stream_acks_lock:
                self._stream_acks.discard(done)

        def answered(answer: Future[stream_pb2.StreamAckResult]) -> None:
            try:
                result = answer.result()
            except Exception:
                threading.Thread(
                    target=self._ack_again, args=(spans, done), name="ds-ack-again", daemon=True
                ).start()
                return
            _settle(done, counted(spans, accepted_spans(spans, result.rejected_ranges)))

        done.add_done_callback(settled)
        sent.add_done_callback(answered)
        return done

    def _ack_again(self, spans: list[Span], done: Future[int]) -> None:
        """Acks sent on a stream whose opening ended before it answered: sent again (on a
        re-opened stream, else with Ack; acks are idempotent), ``done`` resolved with
        their count. Their shared-memory regions ended with that opening."""
        try:
            accepted = self._ack_spans(spans, answer_now=True)
        except BaseException as exc:
            _settle(done, exc)
            return
        _settle(done, counted(spans, accepted))

    def _ack_rpc(self, sidecar: Sidecar, spans: list[Span]) -> list[bool]:
        request = stream_pb2.AckRequest(
            client_id=self.client_id, group=self.group, ranges=[s.range_ack() for s in spans]
        )
        try:
            response = retry_call(lambda: sidecar.stub.Ack(request, timeout=10), ACK_CALLS)
        except grpc.RpcError as err:
            info = error_info(err)
            if err.code() is grpc.StatusCode.UNAVAILABLE:
                sidecar.fall_back()
            if info is not None and info.reason == Reason.LEASE_EPOCH_STALE.value:
                # Every ack named an old epoch: the partition moved; its records come again.
                log.info("acks for a stale lease epoch; records will be redelivered")
            else:
                log.warning("ack failed; records will be redelivered: %s", err)
        except ValueError:
            # Its channel was closed by a binding change meanwhile: the sidecar left, and
            # the partition's next owner redelivers these records.
            log.info("ack to a sidecar that left; records will be redelivered")
        else:
            return accepted_spans(spans, response.rejected_ranges)
        return [False] * len(spans)

    def stream(
        self,
        max_records: int = 500,
        *,
        use_stream_rpc: bool | None = None,
        linger: float = 0.0,
    ) -> Iterator[Batch]:
        """Batches as they arrive, until the client is closed; never an empty one.

        Unless the client was made with ``auto_ack``, ack each batch yourself
        (:meth:`ack`, :meth:`ack_nowait`). The group is the client's own (one client per group).
        By default each batch is one :meth:`fetch`. Over the ``Stream`` RPC, each bound
        sidecar may have up to ``max_records`` records on their way to the application
        (credit is returned as batches are handed out), and what arrived from several
        sidecars while the application was busy is handed out as one batch of about
        ``max_records``. Closing the generator ends its streams.

        Args:
            max_records: Records per fetch, or each sidecar's credit over the ``Stream``
                RPC.
            use_stream_rpc: Read over the ``Stream`` RPC instead of long-polling
                ``Fetch``; default the constructor's choice.
            linger: Over the ``Stream`` RPC, seconds (at most 1): each sidecar sends its
                next batch no sooner than this after the last, unless a whole batch is
                buffered, so at low rates records share messages and acks (less CPU in
                the sidecar and the application per record, up to this much more
                latency while records keep coming). 0: each batch at once.

        Yields:
            Batches of records, in offset order per partition.

        Raises:
            ClientError: As :meth:`fetch`; over the ``Stream`` RPC, a sidecar ended its
                stream with a status other than ``UNAVAILABLE``, ``CANCELLED`` or
                ``DEADLINE_EXCEEDED`` (raised once the batches that came before it are
                handed out).
        """
        if self.use_stream_rpc if use_stream_rpc is None else use_stream_rpc:
            for batch in self._stream_rpc(max_records, columns=False, linger=linger):
                yield cast(Batch, batch)
            return
        while not self._binding.closed.is_set():
            batch = self.fetch(max_records)
            if batch:
                yield batch

    def stream_columns(
        self, max_records: int = 10_000, *, linger: float = 0.0
    ) -> Iterator[ColumnBatch]:
        """Batches as Arrow columns as they arrive over the ``Stream`` RPC, until the client
        is closed; never an empty one.

        Over the sidecar's local socket (the binding names one and the client reaches it)
        each partition run is read in place from shared memory the sidecar wrote it into
        once (``DELIVERY_FORMAT_ARROW_SHM``): no copy of the records on their way to the
        application. Over TCP (a remote client, or a stream that fell back to TCP) the
        sidecar sends ``DELIVERY_FORMAT_BATCHES`` and the client builds the same columns
        on each received RecordBatch's bytes (no copy beyond gRPC's receive). Either way
        a :class:`ColumnBatch` holds one ``pa.RecordBatch`` per partition run in
        ``ReadRange``'s ``ARROW_IPC`` schema (``key``, ``value``, ``topic``, ``partition``,
        ``offset``, ``timestamp``, ``headers``), and ``batch.table`` joins them without a
        copy.

        **The columns are valid until the batch is acked** (:meth:`ack`,
        :meth:`ack_nowait`, :meth:`nack`), or, with ``auto_ack``, until the next batch is
        asked for: the sidecar then writes over their memory. Copy what must outlive that
        (:meth:`ColumnBatch.copy`, ``batch.table.to_pylist()``; not ``combine_chunks()``,
        which returns a single chunk as it is). Ack or nack every
        batch (or use ``auto_ack``): a stream's shared memory is a ring, and while the
        application holds all of it the sidecar sends nothing more on that stream.

        Credit, batching of what arrived meanwhile, re-opening and the ack routing are as
        :meth:`stream` over the ``Stream`` RPC.

        Args:
            max_records: Each sidecar's credit: records on their way to the application.
            linger: As :meth:`stream`'s.

        Yields:
            Column batches, rows in offset order per partition run.

        Raises:
            ClientError: As :meth:`stream` over the ``Stream`` RPC.
            ImportError: pyarrow is not installed (the client's ``arrow`` extra:
                ``pip install 'dataservice-client[arrow]'``).
        """
        _require_arrow()
        for batch in self._stream_rpc(max_records, columns=True, linger=linger):
            yield cast(ColumnBatch, batch)

    def _stream_rpc(
        self, window: int, *, columns: bool, linger: float = 0.0
    ) -> Iterator[Batch | ColumnBatch]:
        out: queue.SimpleQueue[tuple[SidecarStream, Batch | ColumnBatch | ClientError]] = (
            queue.SimpleQueue()
        )
        failed: ClientError | None = None
        try:
            while not self._binding.closed.is_set():
                if failed is not None:
                    raise failed
                self._binding.check()
                self._sync_streams(out, window, columns, linger)
                try:
                    arrived = [out.get(timeout=0.2)]
                except queue.Empty:
                    continue
                # What arrived while the application was busy (acking, say) goes out as one
                # batch, up to the window: one ack for all of it instead of one per message.
                count = 0 if isinstance(arrived[0][1], ClientError) else len(arrived[0][1])
                while count < window:
                    try:
                        arrived.append(out.get_nowait())
                    except queue.Empty:
                        break
                    item = arrived[-1][1]
                    count += 0 if isinstance(item, ClientError) else len(item)
                batches: list[Batch] = []
                column_batches: list[ColumnBatch] = []
                for stream, item in arrived:
                    if isinstance(item, ClientError):
                        failed = failed or item  # raised once what came before is handed out
                        continue
                    self._delivered(item.spans or (), stream.address)
                    # The window counts records on their way to the application: these have
                    # arrived, so the sidecar may send more while they are processed.
                    stream.grant(len(item))
                    if isinstance(item, ColumnBatch):
                        column_batches.append(item)
                    else:
                        batches.append(item)
                if batches:
                    yield joined(batches)
                if column_batches:
                    handed = joined_columns(column_batches)
                    yield handed
                    if self.auto_ack:
                        # Asking for the next batch says the application is done with this
                        # one: its regions go back (its records were acked at delivery).
                        self._release(by_stream(handed.releases))
        finally:
            with self._lock:
                streams, self._streams = list(self._streams.values()), {}
            for stream in streams:
                stream.stop()

    def _sync_streams(
        self,
        out: queue.SimpleQueue[tuple[SidecarStream, Batch | ColumnBatch | ClientError]],
        window: int,
        columns: bool = False,
        linger: float = 0.0,
    ) -> None:
        """One Stream per bound sidecar: open new ones, end those no longer bound, and
        replace those whose sidecar is not the bound one or whose thread ended.

        A binding that drops a sidecar and names its address again before this runs (the
        application busy meanwhile) leaves a stream of the old, closed sidecar under the
        address; its thread ends on the closed channel. It is replaced by one on the bound
        sidecar, which delivers again what the old stream delivered and was not acked. A
        stream that handed the application an error (``failed``) is not: the error is
        raised."""
        stopped = []
        with self._lock:
            for address, stream in list(self._streams.items()):
                sidecar = self._binding.sidecars.get(address)
                if sidecar is None:
                    stopped.append(self._streams.pop(address))
                elif stream.sidecar is not sidecar or (stream.ended and not stream.failed):
                    log.warning(
                        "sidecar %s: its stream %s; opening a new one",
                        address,
                        "ended" if stream.sidecar is sidecar else "was of a replaced sidecar",
                    )
                    stopped.append(self._streams.pop(address))
            for address, sidecar in self._binding.sidecars.items():
                if address not in self._streams:
                    stream = SidecarStream(
                        sidecar,
                        self._stream_open(window, linger),
                        out,
                        columns=columns,
                        frame_socket=self.connection.frame_socket,
                    )
                    self._streams[address] = stream
                    stream.start()
        for stream in stopped:
            stream.stop()

    def _stream_open(self, window: int, linger: float = 0.0) -> stream_pb2.StreamOpen:
        opening = stream_pb2.StreamOpen(
            client_id=self.client_id,
            group=self.group,
            auto_ack=self.auto_ack,
            initial_credit=stream_pb2.StreamCredit(records=window),
            format=stream_pb2.DELIVERY_FORMAT_BATCHES,
            # ack_nowait's answers may ride on the next batch (one message less per batch)
            answers_with_batches=True,
        )
        if linger:
            if not 0 <= linger <= 1:
                raise ValueError(f"linger must be between 0 and 1 s, not {linger}")
            opening.linger.FromNanoseconds(round(linger * 1e9))
        return opening

    def close(self) -> None:
        """Wait for the acks :meth:`ack_nowait` has on their way, give back what was
        delivered and not acked, then unbind and disconnect.

        Records this client received and did not ack are delivered again at once to the
        group's next reader (each sidecar is asked to, best effort, 2 s); a client that
        dies without closing leaves them to their ack deadline (the visibility timeout).
        Unbinding is best effort (2 s). Afterwards :meth:`fetch` returns empty batches,
        :meth:`stream` ends and :meth:`ack_nowait` raises. Calling it again does nothing.
        """
        if self._binding.closed.is_set():
            return
        with self._acker_lock:
            acker, self._acker, self._acks_closed = self._acker, None, True
        with self._stream_acks_lock:
            on_streams = list(self._stream_acks)
        # The acks on their way reach the sidecars first: those sent on a stream (their
        # answers, or their sending again), then the ack thread's.
        if on_streams:
            wait(on_streams, timeout=STREAM_ACK_TIMEOUT_SECONDS)
            for future in on_streams:
                _settle(future, ClientError("closed before the sidecar answered these acks"))
        if acker is not None:
            acker.close()
        self._give_back()
        self._binding.close()

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
        """The addresses of the sidecars the client is bound to now, sorted."""
        with self._lock:
            return sorted(self._binding.sidecars)

    @property
    def assigner(self) -> str:
        """The address of the assigner the client talks to now (the leader it follows)."""
        return self._binding.assigner

    # ---- calls ------------------------------------------------------------------------

    def _rotation(self) -> list[Sidecar]:
        with self._lock:
            sidecars = [self._binding.sidecars[a] for a in sorted(self._binding.sidecars)]
        if not sidecars:
            return []
        self._cursor = (self._cursor + 1) % len(sidecars)
        return sidecars[self._cursor :] + sidecars[: self._cursor]

    def _fetch_from(
        self, sidecar: Sidecar, max_records: int, wait: float, max_bytes: int = 0
    ) -> Batch:
        max_wait = duration_pb2.Duration()
        max_wait.FromNanoseconds(int(wait * 1e9))
        acker, carried = self._carried_to(sidecar)
        seq = self._next_ack_seq() if carried else 0
        request = stream_pb2.FetchRequest(
            client_id=self.client_id,
            group=self.group,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait=max_wait,
            auto_ack=self.auto_ack,
            format=stream_pb2.DELIVERY_FORMAT_BATCHES,
            ack_ranges=[span.range_ack() for item in carried for span in item.spans],
            ack_seq=seq,
        )
        try:
            answered = sidecar.fetch(request, timeout=wait + self.call_timeout)
        except ValueError:
            # A binding change closed this sidecar's channel while we were about to call it
            # (another thread): it is gone; fetch from the others. Its acks go by Ack.
            _send_by_ack(acker, carried)
            return Batch()
        except grpc.RpcError as err:
            # Whether the carried acks were applied is unknown: Ack sends them again (an
            # ack of records already committed is refused, and they are not redelivered).
            _send_by_ack(acker, carried)
            if err.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            ):
                # The sidecar is gone or going: the assigner pushes a new binding. Over
                # its socket: TCP from the next call on.
                if err.code() is grpc.StatusCode.UNAVAILABLE:
                    sidecar.fall_back()
                log.debug("sidecar %s unavailable; waiting for a new binding", sidecar.address)
                return Batch()
            raise ClientError(
                f"Fetch from {sidecar.address} failed: {err.code().name}: {err.details()}"
            ) from err
        batch = answered.batch if isinstance(answered, Fetched) else answered
        acks = answered.acks if isinstance(answered, Fetched) else None
        if carried and acker is not None:
            if acks is not None and acks.applied_seq == seq:
                acker.carried((sidecar.address, seq), carried)
            else:
                # A sidecar that predates FetchRequest.ack_ranges served the fetch and
                # ignored them: they go by Ack, and so do this sidecar's from now on.
                sidecar.reads_carried_acks = False
                acker.give_back(carried)
        if acks is not None and acker is not None:
            for answer in acks.answers:
                acker.answered((sidecar.address, answer.seq), answer.result)
        if batch:
            self._delivered_at[sidecar.address] = time.monotonic()
        self._delivered(batch.spans, sidecar.address)
        return batch

    def _next_ack_seq(self) -> int:
        with self._lock:
            self._ack_seq += 1
            return self._ack_seq

    def _carried_to(self, sidecar: Sidecar) -> tuple[Acker | None, list[Pending]]:
        """The queued ``ack_nowait`` calls a Fetch to ``sidecar`` carries (each of their
        records delivered by it; none while a stream to it is open, whose acks go on it, or
        while acks carried there earlier still wait for their answer), taken off the ack
        thread's queue; from the first fetch on, that thread leaves queued acks a moment
        (``CARRY_WAIT_SECONDS``) for a fetch to carry."""
        with self._acker_lock:
            acker = self._acker
            self._fetching = True
        if acker is None:
            return None, []
        acker.carry_wait = CARRY_WAIT_SECONDS
        with self._lock:
            if not sidecar.reads_carried_acks or sidecar.address in self._streams:
                return acker, []
        if acker.awaiting(sidecar.address):
            return acker, []  # one commit at a time: what queues up meanwhile goes together
        address = sidecar.address
        return acker, acker.claim(
            lambda spans: all(
                self._sidecar_of(s.topic, s.partition, s.lease_epoch) == address for s in spans
            )
        )


def _send_by_ack(acker: Acker | None, carried: list[Pending]) -> None:
    """Carried acks no answer came for: the ack thread sends them with Ack."""
    if acker is not None:
        acker.give_back(carried)


def _settle(future: Future[int], outcome: int | BaseException) -> None:
    """Resolve ``future`` with a count or an exception, unless it already is (close()
    gave up on it, or the answer came first)."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:
        pass


def _spans_and_releases(
    records: Iterable[DsRecord] | ColumnBatch,
) -> tuple[list[Span], Sequence[Release]]:
    """What acking (or nacking) ``records`` sends: its range acks, and the shared-memory
    regions a ColumnBatch releases."""
    if isinstance(records, ColumnBatch):
        return list(records.spans), records.releases
    return spans_of(records if isinstance(records, Sequence) else list(records)), ()


def long_poll_target(sidecars: Sequence[Sidecar], delivered_at: Mapping[str, float]) -> Sidecar:
    """The sidecar of ``sidecars`` (the rotation, last one first among equals) a fetch
    long-polls once a sweep found nothing: one the binding gives partitions to, and of
    those the one that returned records last (``delivered_at``: address → when).

    Not the rotation's last one alone: a sidecar with nothing live to deliver — no
    partitions, or partitions still on their way to it (a handoff's grant is in the
    binding before the new holder has fetched anything) — would hold the whole wait while
    records pile up on the others, and every partition of the application stalls."""
    return max(
        reversed(sidecars),
        key=lambda s: (bool(s.partitions), delivered_at.get(s.address, float("-inf"))),
    )


def _require_arrow() -> None:
    """Fail at once, naming the extra, when pyarrow (or numpy) is not installed: columns
    are the ``arrow`` extra's, and the client imports them only when asked for."""
    try:
        import numpy  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "DsClient.stream_columns needs pyarrow and numpy: "
            "pip install 'dataservice-client[arrow]'"
        ) from exc
