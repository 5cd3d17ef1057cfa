"""The application's client for the mesh: bind, fetch, ack — and never handle a move.

    from dsclient import DsClient

    with DsClient("demo", client_id="billing-1", assigner="127.0.0.1:7070") as client:
        for batch in client.stream():
            process(batch)
            client.ack(batch)

A client serves one group (given to the constructor), so ``stream()`` takes no group.
``stream()`` long-polls ``Fetch`` by default; ``use_stream_rpc=True`` (constructor or
``stream()`` argument) reads over the credit-based ``Stream`` RPC instead: one stream per
bound sidecar, ``max_records`` of credit each, credit returned as the application takes
each batch, and ``ack()`` sent on the stream that delivered the records (falling back to
the ``Ack`` RPC if that stream broke). ``auto_ack=True`` acks at delivery in both modes.

Records arrive as ``RecordBatch`` columns (``DELIVERY_FORMAT_BATCHES``) and are handed to the
application as :class:`DsRecord` tuples (``topic``, ``partition``, ``offset``, ``key``,
``value``, ``timestamp_ms``, ``headers``, ``lease_epoch``; a Kafka null key or value is
``None``) in a :class:`Batch` — an immutable sequence that builds each record as it is read
and remembers the offset ranges it came in, so ``ack(batch)`` sends one range ack per
partition run instead of one ack per record. Acking any other collection of records (a
subset, several batches) works too: the client groups it into runs of consecutive offsets.
A sidecar answers an ack once it is committed; ``ack_nowait(batch)`` sends it from a
background thread, in order, and returns a future, so the next ``fetch()`` travels while
the sidecar commits; the acks that queue up meanwhile go together as the next ack (one
commit). ``close()`` waits for the acks still on their way.

``stream_columns()`` reads over the ``Stream`` RPC too, and hands the records out as Arrow
columns (:class:`ColumnBatch`: one ``pa.RecordBatch`` per partition run, ``.table`` for all
of them) instead of records. Over the sidecar's local socket they come through shared
memory (``DELIVERY_FORMAT_ARROW_SHM``: written once by the sidecar, mapped and read in place
by the client, no copy on the way); over TCP as ``BATCHES`` turned into the same columns.
The columns are valid until the batch is acked (or nacked; with ``auto_ack``, until the
next batch is asked for): the ack releases their memory to the sidecar, which writes over
it. Copy what must outlive the ack (``batch.copy()``, ``batch.table.to_pylist()``).

Fetch and Stream responses are read without building their protobuf messages
(``dsclient.records.wire.parse_batches``): keys and values are cut from the received bytes
directly.

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

The names below (``__all__``) are the library's public surface (clients/python/README.md
"Public surface"): the client, what it hands out (:class:`Batch`, :class:`DsRecord`,
:class:`ColumnBatch`), its exception (:class:`ClientError`), what its ``connection``
argument takes (:class:`ConnectionSettings`, :class:`TlsConfig`, ``DEFAULT_SETTINGS``) and
how to read an error's reason (:class:`Reason`, :func:`error_info`). A public name changes
incompatibly only after a release in which the old use warns (``DeprecationWarning``).

Every module is internal, also where it holds a public name: the implementation, one job
each: ``client`` (:class:`DsClient`: fetch, stream, ack), ``batch`` (batches, and acks as
offset ranges), ``columns`` (column batches and their shared-memory releases), ``shared``
(a stream's segments, mapped), ``acker`` (``ack_nowait``'s thread), ``stream`` (the
``Stream`` RPC reader), ``sidecar`` (one bound sidecar's calls), ``binding`` (binding,
leader following, retries) and ``errors``; and what the mesh's servers share with the
client and import from here: ``records`` (the records codec), ``connection`` (channels,
TLS, tokens, leader following), ``reasons`` (the errors catalogue), ``leader_watch``,
``mesh_env``, ``local_socket``, ``watched_file``, ``addresses``, ``long_poll``. They change
with the mesh, without notice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsclient.batch import Batch
    from dsclient.client import DsClient
    from dsclient.columns import ColumnBatch
    from dsclient.connection import DEFAULT_SETTINGS, ConnectionSettings, TlsConfig
    from dsclient.errors import ClientError
    from dsclient.reasons import Reason, error_info
    from dsclient.records.batches import DsRecord

# Each public name is imported on first use (PEP 562), not with the package: the mesh's
# servers import the modules they share with the client (``reasons``, ``records``,
# ``local_socket``, ``connection``), and importing one of those loads this package first;
# with the client's own modules (client, binding, stream, acker, columns, shared, ...)
# imported here eagerly, every sidecar paid for a client it never runs (issue 34, "a lean
# process").
_PUBLIC = {
    "Batch": "dsclient.batch",
    "DsClient": "dsclient.client",
    "ColumnBatch": "dsclient.columns",
    "DEFAULT_SETTINGS": "dsclient.connection",
    "ConnectionSettings": "dsclient.connection",
    "TlsConfig": "dsclient.connection",
    "ClientError": "dsclient.errors",
    "Reason": "dsclient.reasons",
    "error_info": "dsclient.reasons",
    "DsRecord": "dsclient.records.batches",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'dsclient' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


# The distribution's version (clients/python/pyproject.toml reads it from here).
__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SETTINGS",
    "Batch",
    "ClientError",
    "ColumnBatch",
    "ConnectionSettings",
    "DsClient",
    "DsRecord",
    "Reason",
    "TlsConfig",
    "error_info",
]
