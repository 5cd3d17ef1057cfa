package dataservice.sidecar.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 * <pre>
 * Serves the records of the partitions this sidecar holds to application clients and Spark.
 * </pre>
 */
@io.grpc.stub.annotations.GrpcGenerated
public final class StreamServiceGrpc {

  private StreamServiceGrpc() {}

  public static final java.lang.String SERVICE_NAME = "dataservice.sidecar.v1.StreamService";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.FetchRequest,
      dataservice.sidecar.v1.Stream.FetchResponse> getFetchMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Fetch",
      requestType = dataservice.sidecar.v1.Stream.FetchRequest.class,
      responseType = dataservice.sidecar.v1.Stream.FetchResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.FetchRequest,
      dataservice.sidecar.v1.Stream.FetchResponse> getFetchMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.FetchRequest, dataservice.sidecar.v1.Stream.FetchResponse> getFetchMethod;
    if ((getFetchMethod = StreamServiceGrpc.getFetchMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getFetchMethod = StreamServiceGrpc.getFetchMethod) == null) {
          StreamServiceGrpc.getFetchMethod = getFetchMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.FetchRequest, dataservice.sidecar.v1.Stream.FetchResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Fetch"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.FetchRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.FetchResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("Fetch"))
              .build();
        }
      }
    }
    return getFetchMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StreamRequest,
      dataservice.sidecar.v1.Stream.StreamResponse> getStreamMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Stream",
      requestType = dataservice.sidecar.v1.Stream.StreamRequest.class,
      responseType = dataservice.sidecar.v1.Stream.StreamResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.BIDI_STREAMING)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StreamRequest,
      dataservice.sidecar.v1.Stream.StreamResponse> getStreamMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StreamRequest, dataservice.sidecar.v1.Stream.StreamResponse> getStreamMethod;
    if ((getStreamMethod = StreamServiceGrpc.getStreamMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getStreamMethod = StreamServiceGrpc.getStreamMethod) == null) {
          StreamServiceGrpc.getStreamMethod = getStreamMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.StreamRequest, dataservice.sidecar.v1.Stream.StreamResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.BIDI_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Stream"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.StreamRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.StreamResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("Stream"))
              .build();
        }
      }
    }
    return getStreamMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.AckRequest,
      dataservice.sidecar.v1.Stream.AckResponse> getAckMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Ack",
      requestType = dataservice.sidecar.v1.Stream.AckRequest.class,
      responseType = dataservice.sidecar.v1.Stream.AckResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.AckRequest,
      dataservice.sidecar.v1.Stream.AckResponse> getAckMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.AckRequest, dataservice.sidecar.v1.Stream.AckResponse> getAckMethod;
    if ((getAckMethod = StreamServiceGrpc.getAckMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getAckMethod = StreamServiceGrpc.getAckMethod) == null) {
          StreamServiceGrpc.getAckMethod = getAckMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.AckRequest, dataservice.sidecar.v1.Stream.AckResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Ack"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.AckRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.AckResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("Ack"))
              .build();
        }
      }
    }
    return getAckMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.NackRequest,
      dataservice.sidecar.v1.Stream.NackResponse> getNackMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Nack",
      requestType = dataservice.sidecar.v1.Stream.NackRequest.class,
      responseType = dataservice.sidecar.v1.Stream.NackResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.NackRequest,
      dataservice.sidecar.v1.Stream.NackResponse> getNackMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.NackRequest, dataservice.sidecar.v1.Stream.NackResponse> getNackMethod;
    if ((getNackMethod = StreamServiceGrpc.getNackMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getNackMethod = StreamServiceGrpc.getNackMethod) == null) {
          StreamServiceGrpc.getNackMethod = getNackMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.NackRequest, dataservice.sidecar.v1.Stream.NackResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Nack"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.NackRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.NackResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("Nack"))
              .build();
        }
      }
    }
    return getNackMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.ReadRangeRequest,
      dataservice.sidecar.v1.Stream.ReadRangeResponse> getReadRangeMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "ReadRange",
      requestType = dataservice.sidecar.v1.Stream.ReadRangeRequest.class,
      responseType = dataservice.sidecar.v1.Stream.ReadRangeResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.ReadRangeRequest,
      dataservice.sidecar.v1.Stream.ReadRangeResponse> getReadRangeMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.ReadRangeRequest, dataservice.sidecar.v1.Stream.ReadRangeResponse> getReadRangeMethod;
    if ((getReadRangeMethod = StreamServiceGrpc.getReadRangeMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getReadRangeMethod = StreamServiceGrpc.getReadRangeMethod) == null) {
          StreamServiceGrpc.getReadRangeMethod = getReadRangeMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.ReadRangeRequest, dataservice.sidecar.v1.Stream.ReadRangeResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "ReadRange"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.ReadRangeRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.ReadRangeResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("ReadRange"))
              .build();
        }
      }
    }
    return getReadRangeMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.CommitOffsetsRequest,
      dataservice.sidecar.v1.Stream.CommitOffsetsResponse> getCommitOffsetsMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "CommitOffsets",
      requestType = dataservice.sidecar.v1.Stream.CommitOffsetsRequest.class,
      responseType = dataservice.sidecar.v1.Stream.CommitOffsetsResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.CommitOffsetsRequest,
      dataservice.sidecar.v1.Stream.CommitOffsetsResponse> getCommitOffsetsMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.CommitOffsetsRequest, dataservice.sidecar.v1.Stream.CommitOffsetsResponse> getCommitOffsetsMethod;
    if ((getCommitOffsetsMethod = StreamServiceGrpc.getCommitOffsetsMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getCommitOffsetsMethod = StreamServiceGrpc.getCommitOffsetsMethod) == null) {
          StreamServiceGrpc.getCommitOffsetsMethod = getCommitOffsetsMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.CommitOffsetsRequest, dataservice.sidecar.v1.Stream.CommitOffsetsResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "CommitOffsets"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.CommitOffsetsRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.CommitOffsetsResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("CommitOffsets"))
              .build();
        }
      }
    }
    return getCommitOffsetsMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StatusRequest,
      dataservice.sidecar.v1.Stream.StatusResponse> getStatusMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Status",
      requestType = dataservice.sidecar.v1.Stream.StatusRequest.class,
      responseType = dataservice.sidecar.v1.Stream.StatusResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StatusRequest,
      dataservice.sidecar.v1.Stream.StatusResponse> getStatusMethod() {
    io.grpc.MethodDescriptor<dataservice.sidecar.v1.Stream.StatusRequest, dataservice.sidecar.v1.Stream.StatusResponse> getStatusMethod;
    if ((getStatusMethod = StreamServiceGrpc.getStatusMethod) == null) {
      synchronized (StreamServiceGrpc.class) {
        if ((getStatusMethod = StreamServiceGrpc.getStatusMethod) == null) {
          StreamServiceGrpc.getStatusMethod = getStatusMethod =
              io.grpc.MethodDescriptor.<dataservice.sidecar.v1.Stream.StatusRequest, dataservice.sidecar.v1.Stream.StatusResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Status"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.StatusRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.sidecar.v1.Stream.StatusResponse.getDefaultInstance()))
              .setSchemaDescriptor(new StreamServiceMethodDescriptorSupplier("Status"))
              .build();
        }
      }
    }
    return getStatusMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static StreamServiceStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<StreamServiceStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<StreamServiceStub>() {
        @java.lang.Override
        public StreamServiceStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new StreamServiceStub(channel, callOptions);
        }
      };
    return StreamServiceStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports all types of calls on the service
   */
  public static StreamServiceBlockingV2Stub newBlockingV2Stub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<StreamServiceBlockingV2Stub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<StreamServiceBlockingV2Stub>() {
        @java.lang.Override
        public StreamServiceBlockingV2Stub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new StreamServiceBlockingV2Stub(channel, callOptions);
        }
      };
    return StreamServiceBlockingV2Stub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static StreamServiceBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<StreamServiceBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<StreamServiceBlockingStub>() {
        @java.lang.Override
        public StreamServiceBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new StreamServiceBlockingStub(channel, callOptions);
        }
      };
    return StreamServiceBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static StreamServiceFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<StreamServiceFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<StreamServiceFutureStub>() {
        @java.lang.Override
        public StreamServiceFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new StreamServiceFutureStub(channel, callOptions);
        }
      };
    return StreamServiceFutureStub.newStub(factory, channel);
  }

  /**
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public interface AsyncService {

    /**
     * <pre>
     * Long-poll fetch: returns as soon as max_records or max_bytes are buffered for the
     * client, or when max_wait elapses (possibly with no records; that is not an error).
     * Errors: INVALID_ARGUMENT (empty client_id/group, max_records negative or &gt; 100000,
     * max_bytes negative or &gt; 64 MiB, max_wait negative or &gt; 30 s, unknown format or
     * DELIVERY_FORMAT_ARROW_SHM),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED (caller may not read
     * the group), UNAVAILABLE (sidecar shutting down or not yet joined).
     * </pre>
     */
    default void fetch(dataservice.sidecar.v1.Stream.FetchRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.FetchResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getFetchMethod(), responseObserver);
    }

    /**
     * <pre>
     * Credit-based bidirectional stream: the client sends `open` first, then credits and acks;
     * the sidecar sends record batches while the client has credit and answers every `acks`
     * message with an `ack_result`.
     * Errors: INVALID_ARGUMENT (first message not `open`, second `open`, empty
     * client_id/group, negative credit, unknown format, DELIVERY_FORMAT_ARROW_SHM over TCP
     * or from a sidecar without a local socket, a range ack's to_offset &lt;= from_offset),
     * NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE (sidecar shutting down: the stream ends, rebind).
     * </pre>
     */
    default io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StreamRequest> stream(
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StreamResponse> responseObserver) {
      return io.grpc.stub.ServerCalls.asyncUnimplementedStreamingCall(getStreamMethod(), responseObserver);
    }

    /**
     * <pre>
     * Acknowledges delivered records, one by one (acks) or by offset range (ranges); acking
     * an already-acked record counts as acked. Per-record and per-range problems are reported
     * in rejected_acks and rejected_ranges, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no acks nor ranges, more than 100000
     * acks or ranges, negative offset, a range's to_offset &lt;= from_offset), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, FAILED_PRECONDITION (every ack and range names a stale lease epoch:
     * ErrorInfo reason LEASE_EPOCH_STALE), UNAVAILABLE.
     * </pre>
     */
    default void ack(dataservice.sidecar.v1.Stream.AckRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.AckResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getAckMethod(), responseObserver);
    }

    /**
     * <pre>
     * Gives delivered records back: the caller's records named (or, with `all`, every record
     * this sidecar delivered to the caller and that is not acked yet) are delivered again,
     * now or after `delay`. Only the caller's own records in flight are concerned; acked
     * records, records in flight to other clients and records already due are left alone.
     * A record nacked after its limit of deliveries is given up (POISON_RECORD).
     * Errors: INVALID_ARGUMENT (empty client_id/group, nothing named and not `all`, more
     * than 100000 records or ranges, negative offset, a range's to_offset &lt;= from_offset,
     * delay negative or &gt; 12 h), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    default void nack(dataservice.sidecar.v1.Stream.NackRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.NackResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getNackMethod(), responseObserver);
    }

    /**
     * <pre>
     * Reads the exact offset range [from_offset, to_offset) of one partition this sidecar
     * holds, in chunks of at most max_bytes, without moving the group's position (for Spark).
     * Errors: INVALID_ARGUMENT (empty fields, negative partition or offsets, to_offset &lt;
     * from_offset, negative max_bytes or max_bytes &gt; 64 MiB), NOT_FOUND
     * (group or topic/partition unknown), FAILED_PRECONDITION (this sidecar does not hold the
     * partition's lease, or its lease expired; ErrorInfo metadata names the holder),
     * OUT_OF_RANGE (from_offset below the log start offset, or to_offset above the high
     * watermark), RESOURCE_EXHAUSTED (TOO_MANY_RANGE_READS: the sidecar runs as many ReadRange
     * streams as its settings allow, or their memory budget is taken; retry later),
     * PERMISSION_DENIED, UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    default void readRange(dataservice.sidecar.v1.Stream.ReadRangeRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.ReadRangeResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getReadRangeMethod(), responseObserver);
    }

    /**
     * <pre>
     * Commits explicit offsets to the group (Spark's batch commit), fenced by lease epoch and
     * bound to the reading client: accepted only from a client_id that ReadRange on this
     * sidecar gave the partition's records up to the offset under that epoch.
     * Per-partition problems are reported in results, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no offsets, negative offset),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    default void commitOffsets(dataservice.sidecar.v1.Stream.CommitOffsetsRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.CommitOffsetsResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getCommitOffsetsMethod(), responseObserver);
    }

    /**
     * <pre>
     * Reports this sidecar's leases, positions, buffers and effective consumer config.
     * Errors: PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    default void status(dataservice.sidecar.v1.Stream.StatusRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StatusResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getStatusMethod(), responseObserver);
    }
  }

  /**
   * Base class for the server implementation of the service StreamService.
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public static abstract class StreamServiceImplBase
      implements io.grpc.BindableService, AsyncService {

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return StreamServiceGrpc.bindService(this);
    }
  }

  /**
   * A stub to allow clients to do asynchronous rpc calls to service StreamService.
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public static final class StreamServiceStub
      extends io.grpc.stub.AbstractAsyncStub<StreamServiceStub> {
    private StreamServiceStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected StreamServiceStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new StreamServiceStub(channel, callOptions);
    }

    /**
     * <pre>
     * Long-poll fetch: returns as soon as max_records or max_bytes are buffered for the
     * client, or when max_wait elapses (possibly with no records; that is not an error).
     * Errors: INVALID_ARGUMENT (empty client_id/group, max_records negative or &gt; 100000,
     * max_bytes negative or &gt; 64 MiB, max_wait negative or &gt; 30 s, unknown format or
     * DELIVERY_FORMAT_ARROW_SHM),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED (caller may not read
     * the group), UNAVAILABLE (sidecar shutting down or not yet joined).
     * </pre>
     */
    public void fetch(dataservice.sidecar.v1.Stream.FetchRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.FetchResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getFetchMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Credit-based bidirectional stream: the client sends `open` first, then credits and acks;
     * the sidecar sends record batches while the client has credit and answers every `acks`
     * message with an `ack_result`.
     * Errors: INVALID_ARGUMENT (first message not `open`, second `open`, empty
     * client_id/group, negative credit, unknown format, DELIVERY_FORMAT_ARROW_SHM over TCP
     * or from a sidecar without a local socket, a range ack's to_offset &lt;= from_offset),
     * NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE (sidecar shutting down: the stream ends, rebind).
     * </pre>
     */
    public io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StreamRequest> stream(
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StreamResponse> responseObserver) {
      return io.grpc.stub.ClientCalls.asyncBidiStreamingCall(
          getChannel().newCall(getStreamMethod(), getCallOptions()), responseObserver);
    }

    /**
     * <pre>
     * Acknowledges delivered records, one by one (acks) or by offset range (ranges); acking
     * an already-acked record counts as acked. Per-record and per-range problems are reported
     * in rejected_acks and rejected_ranges, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no acks nor ranges, more than 100000
     * acks or ranges, negative offset, a range's to_offset &lt;= from_offset), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, FAILED_PRECONDITION (every ack and range names a stale lease epoch:
     * ErrorInfo reason LEASE_EPOCH_STALE), UNAVAILABLE.
     * </pre>
     */
    public void ack(dataservice.sidecar.v1.Stream.AckRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.AckResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getAckMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Gives delivered records back: the caller's records named (or, with `all`, every record
     * this sidecar delivered to the caller and that is not acked yet) are delivered again,
     * now or after `delay`. Only the caller's own records in flight are concerned; acked
     * records, records in flight to other clients and records already due are left alone.
     * A record nacked after its limit of deliveries is given up (POISON_RECORD).
     * Errors: INVALID_ARGUMENT (empty client_id/group, nothing named and not `all`, more
     * than 100000 records or ranges, negative offset, a range's to_offset &lt;= from_offset,
     * delay negative or &gt; 12 h), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public void nack(dataservice.sidecar.v1.Stream.NackRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.NackResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getNackMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Reads the exact offset range [from_offset, to_offset) of one partition this sidecar
     * holds, in chunks of at most max_bytes, without moving the group's position (for Spark).
     * Errors: INVALID_ARGUMENT (empty fields, negative partition or offsets, to_offset &lt;
     * from_offset, negative max_bytes or max_bytes &gt; 64 MiB), NOT_FOUND
     * (group or topic/partition unknown), FAILED_PRECONDITION (this sidecar does not hold the
     * partition's lease, or its lease expired; ErrorInfo metadata names the holder),
     * OUT_OF_RANGE (from_offset below the log start offset, or to_offset above the high
     * watermark), RESOURCE_EXHAUSTED (TOO_MANY_RANGE_READS: the sidecar runs as many ReadRange
     * streams as its settings allow, or their memory budget is taken; retry later),
     * PERMISSION_DENIED, UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public void readRange(dataservice.sidecar.v1.Stream.ReadRangeRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.ReadRangeResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getReadRangeMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Commits explicit offsets to the group (Spark's batch commit), fenced by lease epoch and
     * bound to the reading client: accepted only from a client_id that ReadRange on this
     * sidecar gave the partition's records up to the offset under that epoch.
     * Per-partition problems are reported in results, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no offsets, negative offset),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public void commitOffsets(dataservice.sidecar.v1.Stream.CommitOffsetsRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.CommitOffsetsResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getCommitOffsetsMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Reports this sidecar's leases, positions, buffers and effective consumer config.
     * Errors: PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public void status(dataservice.sidecar.v1.Stream.StatusRequest request,
        io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StatusResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getStatusMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   * A stub to allow clients to do synchronous rpc calls to service StreamService.
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public static final class StreamServiceBlockingV2Stub
      extends io.grpc.stub.AbstractBlockingStub<StreamServiceBlockingV2Stub> {
    private StreamServiceBlockingV2Stub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected StreamServiceBlockingV2Stub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new StreamServiceBlockingV2Stub(channel, callOptions);
    }

    /**
     * <pre>
     * Long-poll fetch: returns as soon as max_records or max_bytes are buffered for the
     * client, or when max_wait elapses (possibly with no records; that is not an error).
     * Errors: INVALID_ARGUMENT (empty client_id/group, max_records negative or &gt; 100000,
     * max_bytes negative or &gt; 64 MiB, max_wait negative or &gt; 30 s, unknown format or
     * DELIVERY_FORMAT_ARROW_SHM),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED (caller may not read
     * the group), UNAVAILABLE (sidecar shutting down or not yet joined).
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.FetchResponse fetch(dataservice.sidecar.v1.Stream.FetchRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getFetchMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Credit-based bidirectional stream: the client sends `open` first, then credits and acks;
     * the sidecar sends record batches while the client has credit and answers every `acks`
     * message with an `ack_result`.
     * Errors: INVALID_ARGUMENT (first message not `open`, second `open`, empty
     * client_id/group, negative credit, unknown format, DELIVERY_FORMAT_ARROW_SHM over TCP
     * or from a sidecar without a local socket, a range ack's to_offset &lt;= from_offset),
     * NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE (sidecar shutting down: the stream ends, rebind).
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<dataservice.sidecar.v1.Stream.StreamRequest, dataservice.sidecar.v1.Stream.StreamResponse>
        stream() {
      return io.grpc.stub.ClientCalls.blockingBidiStreamingCall(
          getChannel(), getStreamMethod(), getCallOptions());
    }

    /**
     * <pre>
     * Acknowledges delivered records, one by one (acks) or by offset range (ranges); acking
     * an already-acked record counts as acked. Per-record and per-range problems are reported
     * in rejected_acks and rejected_ranges, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no acks nor ranges, more than 100000
     * acks or ranges, negative offset, a range's to_offset &lt;= from_offset), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, FAILED_PRECONDITION (every ack and range names a stale lease epoch:
     * ErrorInfo reason LEASE_EPOCH_STALE), UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.AckResponse ack(dataservice.sidecar.v1.Stream.AckRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getAckMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Gives delivered records back: the caller's records named (or, with `all`, every record
     * this sidecar delivered to the caller and that is not acked yet) are delivered again,
     * now or after `delay`. Only the caller's own records in flight are concerned; acked
     * records, records in flight to other clients and records already due are left alone.
     * A record nacked after its limit of deliveries is given up (POISON_RECORD).
     * Errors: INVALID_ARGUMENT (empty client_id/group, nothing named and not `all`, more
     * than 100000 records or ranges, negative offset, a range's to_offset &lt;= from_offset,
     * delay negative or &gt; 12 h), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.NackResponse nack(dataservice.sidecar.v1.Stream.NackRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getNackMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Reads the exact offset range [from_offset, to_offset) of one partition this sidecar
     * holds, in chunks of at most max_bytes, without moving the group's position (for Spark).
     * Errors: INVALID_ARGUMENT (empty fields, negative partition or offsets, to_offset &lt;
     * from_offset, negative max_bytes or max_bytes &gt; 64 MiB), NOT_FOUND
     * (group or topic/partition unknown), FAILED_PRECONDITION (this sidecar does not hold the
     * partition's lease, or its lease expired; ErrorInfo metadata names the holder),
     * OUT_OF_RANGE (from_offset below the log start offset, or to_offset above the high
     * watermark), RESOURCE_EXHAUSTED (TOO_MANY_RANGE_READS: the sidecar runs as many ReadRange
     * streams as its settings allow, or their memory budget is taken; retry later),
     * PERMISSION_DENIED, UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, dataservice.sidecar.v1.Stream.ReadRangeResponse>
        readRange(dataservice.sidecar.v1.Stream.ReadRangeRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getReadRangeMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Commits explicit offsets to the group (Spark's batch commit), fenced by lease epoch and
     * bound to the reading client: accepted only from a client_id that ReadRange on this
     * sidecar gave the partition's records up to the offset under that epoch.
     * Per-partition problems are reported in results, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no offsets, negative offset),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.CommitOffsetsResponse commitOffsets(dataservice.sidecar.v1.Stream.CommitOffsetsRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getCommitOffsetsMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Reports this sidecar's leases, positions, buffers and effective consumer config.
     * Errors: PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.StatusResponse status(dataservice.sidecar.v1.Stream.StatusRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getStatusMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do limited synchronous rpc calls to service StreamService.
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public static final class StreamServiceBlockingStub
      extends io.grpc.stub.AbstractBlockingStub<StreamServiceBlockingStub> {
    private StreamServiceBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected StreamServiceBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new StreamServiceBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Long-poll fetch: returns as soon as max_records or max_bytes are buffered for the
     * client, or when max_wait elapses (possibly with no records; that is not an error).
     * Errors: INVALID_ARGUMENT (empty client_id/group, max_records negative or &gt; 100000,
     * max_bytes negative or &gt; 64 MiB, max_wait negative or &gt; 30 s, unknown format or
     * DELIVERY_FORMAT_ARROW_SHM),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED (caller may not read
     * the group), UNAVAILABLE (sidecar shutting down or not yet joined).
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.FetchResponse fetch(dataservice.sidecar.v1.Stream.FetchRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getFetchMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Acknowledges delivered records, one by one (acks) or by offset range (ranges); acking
     * an already-acked record counts as acked. Per-record and per-range problems are reported
     * in rejected_acks and rejected_ranges, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no acks nor ranges, more than 100000
     * acks or ranges, negative offset, a range's to_offset &lt;= from_offset), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, FAILED_PRECONDITION (every ack and range names a stale lease epoch:
     * ErrorInfo reason LEASE_EPOCH_STALE), UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.AckResponse ack(dataservice.sidecar.v1.Stream.AckRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getAckMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Gives delivered records back: the caller's records named (or, with `all`, every record
     * this sidecar delivered to the caller and that is not acked yet) are delivered again,
     * now or after `delay`. Only the caller's own records in flight are concerned; acked
     * records, records in flight to other clients and records already due are left alone.
     * A record nacked after its limit of deliveries is given up (POISON_RECORD).
     * Errors: INVALID_ARGUMENT (empty client_id/group, nothing named and not `all`, more
     * than 100000 records or ranges, negative offset, a range's to_offset &lt;= from_offset,
     * delay negative or &gt; 12 h), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.NackResponse nack(dataservice.sidecar.v1.Stream.NackRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getNackMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Reads the exact offset range [from_offset, to_offset) of one partition this sidecar
     * holds, in chunks of at most max_bytes, without moving the group's position (for Spark).
     * Errors: INVALID_ARGUMENT (empty fields, negative partition or offsets, to_offset &lt;
     * from_offset, negative max_bytes or max_bytes &gt; 64 MiB), NOT_FOUND
     * (group or topic/partition unknown), FAILED_PRECONDITION (this sidecar does not hold the
     * partition's lease, or its lease expired; ErrorInfo metadata names the holder),
     * OUT_OF_RANGE (from_offset below the log start offset, or to_offset above the high
     * watermark), RESOURCE_EXHAUSTED (TOO_MANY_RANGE_READS: the sidecar runs as many ReadRange
     * streams as its settings allow, or their memory budget is taken; retry later),
     * PERMISSION_DENIED, UNAVAILABLE (Kafka unreachable).
     * </pre>
     */
    public java.util.Iterator<dataservice.sidecar.v1.Stream.ReadRangeResponse> readRange(
        dataservice.sidecar.v1.Stream.ReadRangeRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getReadRangeMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Commits explicit offsets to the group (Spark's batch commit), fenced by lease epoch and
     * bound to the reading client: accepted only from a client_id that ReadRange on this
     * sidecar gave the partition's records up to the offset under that epoch.
     * Per-partition problems are reported in results, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no offsets, negative offset),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.CommitOffsetsResponse commitOffsets(dataservice.sidecar.v1.Stream.CommitOffsetsRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getCommitOffsetsMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Reports this sidecar's leases, positions, buffers and effective consumer config.
     * Errors: PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public dataservice.sidecar.v1.Stream.StatusResponse status(dataservice.sidecar.v1.Stream.StatusRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getStatusMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do ListenableFuture-style rpc calls to service StreamService.
   * <pre>
   * Serves the records of the partitions this sidecar holds to application clients and Spark.
   * </pre>
   */
  public static final class StreamServiceFutureStub
      extends io.grpc.stub.AbstractFutureStub<StreamServiceFutureStub> {
    private StreamServiceFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected StreamServiceFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new StreamServiceFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Long-poll fetch: returns as soon as max_records or max_bytes are buffered for the
     * client, or when max_wait elapses (possibly with no records; that is not an error).
     * Errors: INVALID_ARGUMENT (empty client_id/group, max_records negative or &gt; 100000,
     * max_bytes negative or &gt; 64 MiB, max_wait negative or &gt; 30 s, unknown format or
     * DELIVERY_FORMAT_ARROW_SHM),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED (caller may not read
     * the group), UNAVAILABLE (sidecar shutting down or not yet joined).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.sidecar.v1.Stream.FetchResponse> fetch(
        dataservice.sidecar.v1.Stream.FetchRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getFetchMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Acknowledges delivered records, one by one (acks) or by offset range (ranges); acking
     * an already-acked record counts as acked. Per-record and per-range problems are reported
     * in rejected_acks and rejected_ranges, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no acks nor ranges, more than 100000
     * acks or ranges, negative offset, a range's to_offset &lt;= from_offset), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, FAILED_PRECONDITION (every ack and range names a stale lease epoch:
     * ErrorInfo reason LEASE_EPOCH_STALE), UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.sidecar.v1.Stream.AckResponse> ack(
        dataservice.sidecar.v1.Stream.AckRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getAckMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Gives delivered records back: the caller's records named (or, with `all`, every record
     * this sidecar delivered to the caller and that is not acked yet) are delivered again,
     * now or after `delay`. Only the caller's own records in flight are concerned; acked
     * records, records in flight to other clients and records already due are left alone.
     * A record nacked after its limit of deliveries is given up (POISON_RECORD).
     * Errors: INVALID_ARGUMENT (empty client_id/group, nothing named and not `all`, more
     * than 100000 records or ranges, negative offset, a range's to_offset &lt;= from_offset,
     * delay negative or &gt; 12 h), NOT_FOUND (group not served by this sidecar),
     * PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.sidecar.v1.Stream.NackResponse> nack(
        dataservice.sidecar.v1.Stream.NackRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getNackMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Commits explicit offsets to the group (Spark's batch commit), fenced by lease epoch and
     * bound to the reading client: accepted only from a client_id that ReadRange on this
     * sidecar gave the partition's records up to the offset under that epoch.
     * Per-partition problems are reported in results, not as an RPC error.
     * Errors: INVALID_ARGUMENT (empty client_id/group, no offsets, negative offset),
     * NOT_FOUND (group not served by this sidecar), PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.sidecar.v1.Stream.CommitOffsetsResponse> commitOffsets(
        dataservice.sidecar.v1.Stream.CommitOffsetsRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getCommitOffsetsMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Reports this sidecar's leases, positions, buffers and effective consumer config.
     * Errors: PERMISSION_DENIED, UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.sidecar.v1.Stream.StatusResponse> status(
        dataservice.sidecar.v1.Stream.StatusRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getStatusMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_FETCH = 0;
  private static final int METHODID_ACK = 1;
  private static final int METHODID_NACK = 2;
  private static final int METHODID_READ_RANGE = 3;
  private static final int METHODID_COMMIT_OFFSETS = 4;
  private static final int METHODID_STATUS = 5;
  private static final int METHODID_STREAM = 6;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final AsyncService serviceImpl;
    private final int methodId;

    MethodHandlers(AsyncService serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_FETCH:
          serviceImpl.fetch((dataservice.sidecar.v1.Stream.FetchRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.FetchResponse>) responseObserver);
          break;
        case METHODID_ACK:
          serviceImpl.ack((dataservice.sidecar.v1.Stream.AckRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.AckResponse>) responseObserver);
          break;
        case METHODID_NACK:
          serviceImpl.nack((dataservice.sidecar.v1.Stream.NackRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.NackResponse>) responseObserver);
          break;
        case METHODID_READ_RANGE:
          serviceImpl.readRange((dataservice.sidecar.v1.Stream.ReadRangeRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.ReadRangeResponse>) responseObserver);
          break;
        case METHODID_COMMIT_OFFSETS:
          serviceImpl.commitOffsets((dataservice.sidecar.v1.Stream.CommitOffsetsRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.CommitOffsetsResponse>) responseObserver);
          break;
        case METHODID_STATUS:
          serviceImpl.status((dataservice.sidecar.v1.Stream.StatusRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StatusResponse>) responseObserver);
          break;
        default:
          throw new AssertionError();
      }
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public io.grpc.stub.StreamObserver<Req> invoke(
        io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_STREAM:
          return (io.grpc.stub.StreamObserver<Req>) serviceImpl.stream(
              (io.grpc.stub.StreamObserver<dataservice.sidecar.v1.Stream.StreamResponse>) responseObserver);
        default:
          throw new AssertionError();
      }
    }
  }

  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {
    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
        .addMethod(
          getFetchMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.FetchRequest,
              dataservice.sidecar.v1.Stream.FetchResponse>(
                service, METHODID_FETCH)))
        .addMethod(
          getStreamMethod(),
          io.grpc.stub.ServerCalls.asyncBidiStreamingCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.StreamRequest,
              dataservice.sidecar.v1.Stream.StreamResponse>(
                service, METHODID_STREAM)))
        .addMethod(
          getAckMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.AckRequest,
              dataservice.sidecar.v1.Stream.AckResponse>(
                service, METHODID_ACK)))
        .addMethod(
          getNackMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.NackRequest,
              dataservice.sidecar.v1.Stream.NackResponse>(
                service, METHODID_NACK)))
        .addMethod(
          getReadRangeMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.ReadRangeRequest,
              dataservice.sidecar.v1.Stream.ReadRangeResponse>(
                service, METHODID_READ_RANGE)))
        .addMethod(
          getCommitOffsetsMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.CommitOffsetsRequest,
              dataservice.sidecar.v1.Stream.CommitOffsetsResponse>(
                service, METHODID_COMMIT_OFFSETS)))
        .addMethod(
          getStatusMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.sidecar.v1.Stream.StatusRequest,
              dataservice.sidecar.v1.Stream.StatusResponse>(
                service, METHODID_STATUS)))
        .build();
  }

  private static abstract class StreamServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    StreamServiceBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return dataservice.sidecar.v1.Stream.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("StreamService");
    }
  }

  private static final class StreamServiceFileDescriptorSupplier
      extends StreamServiceBaseDescriptorSupplier {
    StreamServiceFileDescriptorSupplier() {}
  }

  private static final class StreamServiceMethodDescriptorSupplier
      extends StreamServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final java.lang.String methodName;

    StreamServiceMethodDescriptorSupplier(java.lang.String methodName) {
      this.methodName = methodName;
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {
      return getServiceDescriptor().findMethodByName(methodName);
    }
  }

  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;

  public static io.grpc.ServiceDescriptor getServiceDescriptor() {
    io.grpc.ServiceDescriptor result = serviceDescriptor;
    if (result == null) {
      synchronized (StreamServiceGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new StreamServiceFileDescriptorSupplier())
              .addMethod(getFetchMethod())
              .addMethod(getStreamMethod())
              .addMethod(getAckMethod())
              .addMethod(getNackMethod())
              .addMethod(getReadRangeMethod())
              .addMethod(getCommitOffsetsMethod())
              .addMethod(getStatusMethod())
              .build();
        }
      }
    }
    return result;
  }
}
