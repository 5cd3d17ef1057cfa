"""The ``dataservice`` Python Data Source: Kafka records through the mesh's sidecars.

    from spark.sources import DataserviceDataSource
    spark.dataSource.register(DataserviceDataSource)
    df = (spark.readStream.format("dataservice")
          .option("assigner", "127.0.0.1:7070").option("group", "orders").load())

Streaming (``DataSourceStreamReader``, on the driver, in one long-lived Python worker):

* ``initialOffset`` — from ``startingOffsets``: ``committed`` (default; the group's
  committed offsets, the log start where none), ``earliest`` (the log start, asked of the
  owning sidecar), ``latest`` (the end offsets) or JSON per partition (-2 earliest,
  -1 latest; unnamed partitions start at the earliest).
* ``latestOffset(start, limit)`` — the end offsets of the group's partitions that a
  sidecar leases (DescribeGroup; an unleased partition waits), cut by the read limit:
  ``maxRecordsPerTrigger`` split over partitions in proportion to what each has
  (``offsets.limit_offsets``); ``Trigger.AvailableNow`` caps
  them at the ends seen when the query started. While idle, at most one DescribeGroup per
  ``pollIntervalMs``.
* ``partitions(start, end)`` — one input partition per partition range, cut into pieces of
  at most ``maxRecordsPerPartition`` records, each with the endpoint of its owner.
* ``read`` (executors) — ``ReadRange`` on the owner, following lease moves
  (``mesh.read_range``); every chunk becomes one Arrow record batch (``arrow.py``).
* ``commit(end)`` — with ``commitOffsets`` (default true), finished batches' end offsets
  are committed to the group through the sidecars holding the partitions, fenced by their
  lease epochs, so lag tools and the notifier see the pipeline's progress. A background
  thread (:class:`GroupCommitter`) does it, retrying while leases move, so a commit never
  stalls a batch. Spark's checkpoint stays the source of truth: a refused commit is logged
  and retried, never a query failure.

Batch (``DataSourceReader``): ``startingOffsets`` (default ``earliest``) to
``endingOffsets`` (``latest`` or JSON), read the same way; a batch read never commits.

Offsets in the checkpoint are ``{"topic": {"partition": offset}}``, canonical
(``offsets.to_json``), so equal offsets are equal JSON.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from services.runtime.topic_partition import TP
from spark.sources import offsets as off
from spark.sources.options import OptionError, SourceOptions, parse_options, schema_ddl

# Spark runs this module in several short-lived Python processes per query that only
# plan (create_data_source, plan_data_source_read): what talks to the mesh (grpc,
# protobuf) and builds batches (pyarrow) is imported where it is used, not here.
if TYPE_CHECKING:
    import pyarrow as pa

    from spark.sources.mesh import GroupView, Mesh, ReadSpec

log = logging.getLogger(__name__)  # standard logging: see spark.sources.mesh


class RangePartition(InputPartition):
    """One Spark input partition: a :class:`ReadSpec` (picklable)."""

    def __init__(self, spec: ReadSpec) -> None:
        super().__init__(spec)
        self.spec = spec


class DataserviceDataSource(DataSource):
    """``format("dataservice")``: see the module documentation for the options."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.source_options = parse_options(dict(options))

    @classmethod
    def name(cls) -> str:
        return "dataservice"

    def schema(self) -> str:
        return schema_ddl(self.source_options)

    def reader(self, schema: StructType) -> DataserviceBatchReader:
        return DataserviceBatchReader(self.source_options, schema)

    def streamReader(self, schema: StructType) -> DataserviceStreamReader:
        return DataserviceStreamReader(self.source_options, schema)


def _arrow_schema(schema: StructType) -> pa.Schema:
    # The exact conversion Spark checks returned batches against.
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


_frozen = False


def _freeze_worker_heap() -> None:
    """Once per Python worker: move every object alive now (the modules pyarrow, grpc,
    protobuf and pyspark loaded, the shared mesh clients) to the permanent generation.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker, and
    it walked all of those objects each time: 20-35 ms on the 2-core machine, more than
    the 10-20 ms of CPU a 20,000-record ARROW_IPC task spends reading. Frozen objects are
    never scanned again (the same collection then takes microseconds); what a task
    allocates afterwards is collected as before."""
    global _frozen
    if not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True


def read_batches(
    options: SourceOptions, schema: StructType, spec: ReadSpec
) -> Iterator[pa.RecordBatch]:
    """Executor side of both readers: the range's records as Arrow batches."""
    from spark.sources.arrow import BatchBuilder
    from spark.sources.mesh import ReadPolicy, read_range, shared_mesh

    builder = BatchBuilder(_arrow_schema(schema), options.key_format, options.value_format)
    mesh = shared_mesh(options.assigners, options.consul, options.group, options.client_id)
    _freeze_worker_heap()
    policy = ReadPolicy(
        chunk_bytes=options.chunk_bytes,
        read_timeout=options.read_timeout_seconds,
        fail_on_data_loss=options.fail_on_data_loss,
        arrow=options.read_format != "records",
    )
    for chunk in read_range(mesh, spec, policy):
        if chunk.arrow_ipc:
            yield builder.build_ipc(chunk.arrow_ipc, chunk.start)
        else:
            yield builder.build(chunk.records)


class _Planner:
    """Driver-side state shared by both readers: the mesh clients and the group's view."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._mesh: Mesh | None = None
        self.view: GroupView | None = None
        self.view_at = 0.0

    @property
    def mesh(self) -> Mesh:
        if self._mesh is None:
            from spark.sources.mesh import AssignerClient, Mesh, SidecarPool

            self._mesh = Mesh(
                self.options.group,
                self.options.client_id,
                AssignerClient(self.options.assigners, self.options.consul),
                SidecarPool(),
            )
        return self._mesh

    def describe(self) -> GroupView:
        self.view = self.mesh.assigner.describe(self.options.group)
        self.view_at = time.monotonic()
        return self.view

    def topics(self, view: GroupView) -> tuple[str, ...]:
        if not self.options.topics:
            return view.topics
        unknown = sorted(set(self.options.topics) - set(view.topics))
        if unknown:
            raise OptionError(
                f"option topics: {', '.join(unknown)} not consumed by group "
                f"{self.options.group} (its topics: {', '.join(view.topics)})"
            )
        return self.options.topics

    def ends(self, view: GroupView) -> off.Offsets:
        topics = set(self.topics(view))
        return {tp: end for tp, end in view.ends.items() if tp[0] in topics}

    def earliest(self, view: GroupView, tps: Sequence[TP]) -> off.Offsets:
        """Log start offsets, asked of the partitions' owners (in parallel: each probe
        costs the sidecar a consumer and a broker round trip)."""
        if not tps:
            return {}
        from spark.sources.mesh import log_start_offset

        def probe(tp: TP) -> int:
            return log_start_offset(
                self.mesh, tp, view.endpoint_of(tp), self.options.read_timeout_seconds
            )

        with ThreadPoolExecutor(max_workers=min(8, len(tps))) as pool:
            return dict(zip(tps, pool.map(probe, tps), strict=True))

    def resolve(self, spec: str, view: GroupView, unnamed: int = off.EARLIEST) -> off.Offsets:
        """Offsets for a startingOffsets/endingOffsets value, for every subscribed partition;
        a JSON value leaves the partitions it does not name at ``unnamed``."""
        ends = self.ends(view)
        if spec == "latest":
            return dict(ends)
        if spec == "earliest":
            return self.earliest(view, sorted(ends))
        if spec == "committed":
            out = {tp: view.committed.get(tp, -1) for tp in ends}
            missing = sorted(tp for tp, o in out.items() if o < 0)
            out.update(self.earliest(view, missing))
            return out
        wanted = off.from_json(spec, allow_special=True)
        unknown = sorted(tp for tp in wanted if tp not in ends)
        if unknown:
            raise OptionError(f"offsets name partitions the group does not read: {unknown}")
        out = {}
        for tp in ends:
            value = wanted.get(tp, unnamed)
            out[tp] = ends[tp] if value == off.LATEST else value
        out.update(self.earliest(view, sorted(tp for tp, o in out.items() if o == off.EARLIEST)))
        return out

    def plan(self, start: off.Offsets, end: off.Offsets) -> list[RangePartition]:
        view = self.view
        if view is None or time.monotonic() - self.view_at > 5.0:
            view = self.describe()  # owner hints: executors ask again if they are stale
        ranges = off.plan_ranges(
            off.merge_new_partitions(start, end), end, self.options.max_records_per_partition
        )
        from spark.sources.mesh import ReadSpec

        return [
            RangePartition(
                ReadSpec(
                    topic=r.topic,
                    partition=r.partition,
                    from_offset=r.from_offset,
                    to_offset=r.to_offset,
                    endpoint=view.endpoint_of(TP(r.topic, r.partition)),
                    from_earliest=(r.topic, r.partition) not in start,
                )
            )
            for r in ranges
        ]

    def close(self) -> None:
        if self._mesh is not None:
            self._mesh.close()
            self._mesh = None


class GroupCommitter:
    """Commits a stream's progress to the group through the sidecars, on its own thread, so
    a lease moving (commits refused until the new owner holds it) never stalls a batch.

    :meth:`offer` sets the offsets to reach (each is a batch end already in Spark's commit
    log); the thread commits what changed, retries what was refused with backoff, and
    always works towards the latest offer. Spark's checkpoint stays the source of truth:
    failures are logged, never raised into the query."""

    def __init__(self, mesh: Callable[[], Mesh], options: SourceOptions) -> None:
        self._mesh = mesh
        self._options = options
        self._cond = threading.Condition()
        self._target: off.Offsets = {}
        self._committed: off.Offsets = {}
        self._closed = False
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="ds-group-commit", daemon=True)
        self._thread.start()

    def offer(self, offsets: off.Offsets) -> None:
        with self._cond:
            self._target = dict(offsets)
            self._cond.notify_all()

    def _pending(self) -> off.Offsets:
        return {tp: o for tp, o in self._target.items() if self._committed.get(tp) != o}

    def _run(self) -> None:
        backoff = 0.2
        while True:
            with self._cond:
                while not self._closed and not self._pending():
                    self._cond.wait()
                if self._closed:
                    return
                pending = self._pending()
            failed = self._commit(pending)
            with self._cond:
                for tp, offset in pending.items():
                    if tp not in failed:
                        self._committed[tp] = offset
                self._cond.notify_all()
                if failed and not self._closed:
                    self._cond.wait(backoff)
            backoff = min(backoff * 2, 5.0) if failed else 0.2

    def _commit(self, offsets: off.Offsets) -> dict[TP, str]:
        from spark.sources.mesh import MeshError, commit_offsets

        try:
            failed = commit_offsets(self._mesh(), offsets, self._options.commit_timeout_seconds)
        except MeshError as exc:
            failed = {tp: str(exc) for tp in offsets}
        except Exception as exc:  # never let the thread die: the next offer retries
            failed = {tp: f"{type(exc).__name__}: {exc}" for tp in offsets}
        if failed:
            self._failures += 1
            log.warning(
                "group %s: offsets not committed yet, retrying: %s",
                self._options.group,
                {f"{t}[{p}]": why for (t, p), why in sorted(failed.items())},
            )
        return failed

    def flush(self, timeout: float) -> bool:
        """Wait until the latest offer is committed; False if that took longer."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending() and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return not self._pending()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


class DataserviceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._planner: _Planner | None = None
        self._committer: GroupCommitter | None = None
        self._target: off.Offsets | None = None  # Trigger.AvailableNow: stop here
        self._initial: off.Offsets | None = None
        self._unleased: list[TP] = []

    # The reader is pickled to executors for read(): clients and state stay on the driver.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "schema": self.schema}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__init__(state["options"], state["schema"])  # type: ignore[misc]

    @property
    def planner(self) -> _Planner:
        if self._planner is None:
            self._planner = _Planner(self.options)
        return self._planner

    def _offer_commit(self, offsets: off.Offsets) -> None:
        if not self.options.commit_offsets:
            return
        if self._committer is None:
            self._committer = GroupCommitter(lambda: self.planner.mesh, self.options)
        self._committer.offer(offsets)

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks more than once for a new query (planning the first batch, then running
        # it): both must get the same answer, or "latest" could move in between.
        if self._initial is None:
            spec = self.options.starting_offsets or "committed"
            self._initial = self.planner.resolve(spec, self.planner.describe())
            log.info(
                "group %s: stream starts at %s (%s)", self.options.group,
                off.dumps(self._initial), spec,
            )  # fmt: skip
        return off.to_json(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.planner.ends(self.planner.describe())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = off.from_json(start)
        # Spark asks for the next batch only once every batch up to `start` is in the
        # checkpoint's commit log (a restart re-runs an unfinished batch first, without
        # asking). So `start` is committed progress: hand it to the group. Spark's own
        # commit(end) comes only when a *next* batch is planned, which never happens once
        # the stream has caught up; this way the group reaches the end offsets too.
        self._offer_commit(begin)
        self._throttle()
        view = self.planner.describe()
        ends = self.planner.ends(view)
        if self._target is not None:
            # Partitions that appeared after the target was taken are not read this run.
            ends = {tp: min(e, self._target[tp]) for tp, e in ends.items() if tp in self._target}
        begin = off.merge_new_partitions(begin, ends)
        # Only partitions a sidecar leases can be read: the others wait (an unassigned
        # partition would hold the whole batch until a sidecar takes it).
        unleased = sorted(tp for tp in ends if view.endpoint_of(tp) is None)
        if unleased != self._unleased:
            if unleased:
                log.warning("group %s: not leased, not read for now: %s", view.group, unleased)
            self._unleased = unleased
        # A DescribeGroup answer may be a moment older than the one the last batch was cut
        # from (another assigner replica): a partition never goes back.
        latest = {tp: o if tp in unleased else max(ends.get(tp, o), o) for tp, o in begin.items()}
        end = self._apply_limit(begin, latest, limit)
        if end == begin and self._committer is not None:
            # Caught up (or AvailableNow done): make the group's offsets reach `start` before
            # saying so, since the query may stop next and its source worker with it.
            self._committer.flush(self.options.commit_timeout_seconds)
        return off.to_json(end)

    def _apply_limit(
        self, begin: off.Offsets, latest: off.Offsets, limit: ReadLimit
    ) -> off.Offsets:
        if isinstance(limit, ReadMaxRows):
            return off.limit_offsets(begin, latest, limit.max_rows)
        if isinstance(limit, ReadMinRows):
            available = sum(latest[tp] - begin[tp] for tp in latest)
            return latest if available >= limit.min_rows else begin
        return latest

    def _throttle(self) -> None:
        """While idle Spark asks for new offsets every few milliseconds: one DescribeGroup
        per poll interval is enough (a batch that took longer is not slowed down)."""
        since = time.monotonic() - self.planner.view_at
        if since < self.options.poll_interval_seconds:
            time.sleep(self.options.poll_interval_seconds - since)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        view = self.planner.view
        return off.to_json(self.planner.ends(view)) if view is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.planner.plan(off.from_json(start), off.from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(self.options, self.schema, partition.spec)

    def commit(self, end: dict[str, Any]) -> None:
        self._offer_commit(off.from_json(end))

    def stop(self) -> None:
        if self._committer is not None:
            if not self._committer.flush(self.options.commit_timeout_seconds):
                log.warning("group %s: stopping with offsets not committed", self.options.group)
            self._committer.close()
            self._committer = None
        if self._planner is not None:
            self._planner.close()
            self._planner = None


class DataserviceBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        planner = _Planner(self.options)
        try:
            view = planner.describe()
            start = planner.resolve(self.options.starting_offsets or "earliest", view)
            end = planner.resolve(self.options.ending_offsets, view, unnamed=off.LATEST)
            ends = planner.ends(view)
            for tp, o in end.items():
                if o < start.get(tp, 0):
                    raise OptionError(
                        f"option endingOffsets: {tp[0]}[{tp[1]}]={o} is below its start {start[tp]}"
                    )
                if o > ends[tp]:
                    raise OptionError(
                        f"option endingOffsets: {tp[0]}[{tp[1]}]={o} is beyond the end of "
                        f"the log ({ends[tp]})"
                    )
            return planner.plan(start, end)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(self.options, self.schema, partition.spec)
