"""The admin API's logic, one module per job; :class:`~services.assigner.rpc.AdminServicer`
is the thin gRPC adapter over it.

* :mod:`.validation`: request fields and whole ``GroupConfig`` messages (pure);
* :mod:`.librdkafka`: per-group consumer properties as librdkafka itself judges them;
* :mod:`.update_mask`: UpdateGroup's field mask (AIP-134): paths, apply, what changed (pure);
* :mod:`.records`: a validated ``GroupConfig`` as the durable ``GroupRecord`` (pure);
* :mod:`.idempotency`: ``request_id`` (AIP-155) for the mutating RPCs;
* :mod:`.paging`: ``page_size`` / ``page_token`` (AIP-158) for ListGroups (pure);
* :mod:`.messages`: leases and members as the API's messages, instants as wall-clock time.

Offsets and lag, which ``/ui`` shares with DescribeGroup, are not admin-only: they live in
:mod:`services.assigner.offsets` (pure), :mod:`services.assigner.kafka_offsets` (the Kafka
edge) and :mod:`services.assigner.offsets_view` (cache and bounded waits on the loop).
"""
