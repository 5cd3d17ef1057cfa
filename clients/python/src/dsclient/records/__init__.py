"""The records codec: how delivered records travel from the sidecar to the client library.

Shared by the consumer sidecar (which encodes) and the client library (which decodes), so
neither imports the other's package:

- :mod:`dsclient.records.batches`: records as columns. The sidecar's buffer holds
  :class:`~dsclient.records.batches.Chunk`\\ s and delivers
  :class:`~dsclient.records.batches.Slice`\\ s of them as ``RecordBatch`` or ``Record``
  messages; the client reads a ``RecordBatch`` back as
  :class:`~dsclient.records.batches.Columns` and hands the application
  :class:`~dsclient.records.batches.DsRecord` tuples.
- :mod:`dsclient.records.wire`: ``RecordBatch``\\ es written to and read from protobuf wire
  bytes directly, without building the messages.

Pure code: no I/O, and no import of any service's package.
"""
