package dataservice.assigner.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 * <pre>
 * Binds application clients to the sidecars that serve their group.
 * </pre>
 */
@io.grpc.stub.annotations.GrpcGenerated
public final class BindingServiceGrpc {

  private BindingServiceGrpc() {}

  public static final java.lang.String SERVICE_NAME = "dataservice.assigner.v1.BindingService";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.BindRequest,
      dataservice.assigner.v1.Binding.BindResponse> getBindMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Bind",
      requestType = dataservice.assigner.v1.Binding.BindRequest.class,
      responseType = dataservice.assigner.v1.Binding.BindResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.BindRequest,
      dataservice.assigner.v1.Binding.BindResponse> getBindMethod() {
    io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.BindRequest, dataservice.assigner.v1.Binding.BindResponse> getBindMethod;
    if ((getBindMethod = BindingServiceGrpc.getBindMethod) == null) {
      synchronized (BindingServiceGrpc.class) {
        if ((getBindMethod = BindingServiceGrpc.getBindMethod) == null) {
          BindingServiceGrpc.getBindMethod = getBindMethod =
              io.grpc.MethodDescriptor.<dataservice.assigner.v1.Binding.BindRequest, dataservice.assigner.v1.Binding.BindResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Bind"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.BindRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.BindResponse.getDefaultInstance()))
              .setSchemaDescriptor(new BindingServiceMethodDescriptorSupplier("Bind"))
              .build();
        }
      }
    }
    return getBindMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.WatchBindingRequest,
      dataservice.assigner.v1.Binding.WatchBindingResponse> getWatchBindingMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "WatchBinding",
      requestType = dataservice.assigner.v1.Binding.WatchBindingRequest.class,
      responseType = dataservice.assigner.v1.Binding.WatchBindingResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
  public static io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.WatchBindingRequest,
      dataservice.assigner.v1.Binding.WatchBindingResponse> getWatchBindingMethod() {
    io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.WatchBindingRequest, dataservice.assigner.v1.Binding.WatchBindingResponse> getWatchBindingMethod;
    if ((getWatchBindingMethod = BindingServiceGrpc.getWatchBindingMethod) == null) {
      synchronized (BindingServiceGrpc.class) {
        if ((getWatchBindingMethod = BindingServiceGrpc.getWatchBindingMethod) == null) {
          BindingServiceGrpc.getWatchBindingMethod = getWatchBindingMethod =
              io.grpc.MethodDescriptor.<dataservice.assigner.v1.Binding.WatchBindingRequest, dataservice.assigner.v1.Binding.WatchBindingResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.SERVER_STREAMING)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "WatchBinding"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.WatchBindingRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.WatchBindingResponse.getDefaultInstance()))
              .setSchemaDescriptor(new BindingServiceMethodDescriptorSupplier("WatchBinding"))
              .build();
        }
      }
    }
    return getWatchBindingMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.UnbindRequest,
      dataservice.assigner.v1.Binding.UnbindResponse> getUnbindMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "Unbind",
      requestType = dataservice.assigner.v1.Binding.UnbindRequest.class,
      responseType = dataservice.assigner.v1.Binding.UnbindResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.UnbindRequest,
      dataservice.assigner.v1.Binding.UnbindResponse> getUnbindMethod() {
    io.grpc.MethodDescriptor<dataservice.assigner.v1.Binding.UnbindRequest, dataservice.assigner.v1.Binding.UnbindResponse> getUnbindMethod;
    if ((getUnbindMethod = BindingServiceGrpc.getUnbindMethod) == null) {
      synchronized (BindingServiceGrpc.class) {
        if ((getUnbindMethod = BindingServiceGrpc.getUnbindMethod) == null) {
          BindingServiceGrpc.getUnbindMethod = getUnbindMethod =
              io.grpc.MethodDescriptor.<dataservice.assigner.v1.Binding.UnbindRequest, dataservice.assigner.v1.Binding.UnbindResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "Unbind"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.UnbindRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dataservice.assigner.v1.Binding.UnbindResponse.getDefaultInstance()))
              .setSchemaDescriptor(new BindingServiceMethodDescriptorSupplier("Unbind"))
              .build();
        }
      }
    }
    return getUnbindMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static BindingServiceStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<BindingServiceStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<BindingServiceStub>() {
        @java.lang.Override
        public BindingServiceStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new BindingServiceStub(channel, callOptions);
        }
      };
    return BindingServiceStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports all types of calls on the service
   */
  public static BindingServiceBlockingV2Stub newBlockingV2Stub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<BindingServiceBlockingV2Stub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<BindingServiceBlockingV2Stub>() {
        @java.lang.Override
        public BindingServiceBlockingV2Stub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new BindingServiceBlockingV2Stub(channel, callOptions);
        }
      };
    return BindingServiceBlockingV2Stub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static BindingServiceBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<BindingServiceBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<BindingServiceBlockingStub>() {
        @java.lang.Override
        public BindingServiceBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new BindingServiceBlockingStub(channel, callOptions);
        }
      };
    return BindingServiceBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static BindingServiceFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<BindingServiceFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<BindingServiceFutureStub>() {
        @java.lang.Override
        public BindingServiceFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new BindingServiceFutureStub(channel, callOptions);
        }
      };
    return BindingServiceFutureStub.newStub(factory, channel);
  }

  /**
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public interface AsyncService {

    /**
     * <pre>
     * Binds a client to the sidecar(s) of a group, or returns its existing binding
     * (idempotent per client_id and group).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED (caller may not read the group), FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_CLIENTS: a new client past the group's
     * max_clients_per_group), UNAVAILABLE.
     * </pre>
     */
    default void bind(dataservice.assigner.v1.Binding.BindRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.BindResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getBindMethod(), responseObserver);
    }

    /**
     * <pre>
     * Streams a client's binding: first the current binding if its version differs from
     * known_version (always when known_version is 0), then every later change as it happens
     * (never behind a cache). The stream stays open until the client cancels it, Unbind is
     * called, or this replica stops serving the group: a lost term ends it
     * FAILED_PRECONDITION (NOT_LEADER) with `ds-leader`, a group closed here UNAVAILABLE
     * (SERVICE_NOT_READY); either way the client re-watches the leader. It does not bind:
     * call Bind first (a watch alone stores no binding and is not counted as a client).
     * Errors: INVALID_ARGUMENT (empty client_id/group, negative known_version), NOT_FOUND
     * (unknown group), PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS: the group has max_watchers_per_group streams;
     * WATCHER_TOO_SLOW: the stream fell watch_queue_max bindings behind and was dropped:
     * watch again with the known version), UNAVAILABLE.
     * </pre>
     */
    default void watchBinding(dataservice.assigner.v1.Binding.WatchBindingRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.WatchBindingResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getWatchBindingMethod(), responseObserver);
    }

    /**
     * <pre>
     * Removes a client's binding and ends its watch streams. Unbinding an unbound client
     * succeeds (idempotent).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`, UNAVAILABLE.
     * </pre>
     */
    default void unbind(dataservice.assigner.v1.Binding.UnbindRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.UnbindResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getUnbindMethod(), responseObserver);
    }
  }

  /**
   * Base class for the server implementation of the service BindingService.
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public static abstract class BindingServiceImplBase
      implements io.grpc.BindableService, AsyncService {

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return BindingServiceGrpc.bindService(this);
    }
  }

  /**
   * A stub to allow clients to do asynchronous rpc calls to service BindingService.
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public static final class BindingServiceStub
      extends io.grpc.stub.AbstractAsyncStub<BindingServiceStub> {
    private BindingServiceStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected BindingServiceStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new BindingServiceStub(channel, callOptions);
    }

    /**
     * <pre>
     * Binds a client to the sidecar(s) of a group, or returns its existing binding
     * (idempotent per client_id and group).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED (caller may not read the group), FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_CLIENTS: a new client past the group's
     * max_clients_per_group), UNAVAILABLE.
     * </pre>
     */
    public void bind(dataservice.assigner.v1.Binding.BindRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.BindResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getBindMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Streams a client's binding: first the current binding if its version differs from
     * known_version (always when known_version is 0), then every later change as it happens
     * (never behind a cache). The stream stays open until the client cancels it, Unbind is
     * called, or this replica stops serving the group: a lost term ends it
     * FAILED_PRECONDITION (NOT_LEADER) with `ds-leader`, a group closed here UNAVAILABLE
     * (SERVICE_NOT_READY); either way the client re-watches the leader. It does not bind:
     * call Bind first (a watch alone stores no binding and is not counted as a client).
     * Errors: INVALID_ARGUMENT (empty client_id/group, negative known_version), NOT_FOUND
     * (unknown group), PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS: the group has max_watchers_per_group streams;
     * WATCHER_TOO_SLOW: the stream fell watch_queue_max bindings behind and was dropped:
     * watch again with the known version), UNAVAILABLE.
     * </pre>
     */
    public void watchBinding(dataservice.assigner.v1.Binding.WatchBindingRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.WatchBindingResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncServerStreamingCall(
          getChannel().newCall(getWatchBindingMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Removes a client's binding and ends its watch streams. Unbinding an unbound client
     * succeeds (idempotent).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`, UNAVAILABLE.
     * </pre>
     */
    public void unbind(dataservice.assigner.v1.Binding.UnbindRequest request,
        io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.UnbindResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getUnbindMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   * A stub to allow clients to do synchronous rpc calls to service BindingService.
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public static final class BindingServiceBlockingV2Stub
      extends io.grpc.stub.AbstractBlockingStub<BindingServiceBlockingV2Stub> {
    private BindingServiceBlockingV2Stub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected BindingServiceBlockingV2Stub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new BindingServiceBlockingV2Stub(channel, callOptions);
    }

    /**
     * <pre>
     * Binds a client to the sidecar(s) of a group, or returns its existing binding
     * (idempotent per client_id and group).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED (caller may not read the group), FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_CLIENTS: a new client past the group's
     * max_clients_per_group), UNAVAILABLE.
     * </pre>
     */
    public dataservice.assigner.v1.Binding.BindResponse bind(dataservice.assigner.v1.Binding.BindRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getBindMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams a client's binding: first the current binding if its version differs from
     * known_version (always when known_version is 0), then every later change as it happens
     * (never behind a cache). The stream stays open until the client cancels it, Unbind is
     * called, or this replica stops serving the group: a lost term ends it
     * FAILED_PRECONDITION (NOT_LEADER) with `ds-leader`, a group closed here UNAVAILABLE
     * (SERVICE_NOT_READY); either way the client re-watches the leader. It does not bind:
     * call Bind first (a watch alone stores no binding and is not counted as a client).
     * Errors: INVALID_ARGUMENT (empty client_id/group, negative known_version), NOT_FOUND
     * (unknown group), PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS: the group has max_watchers_per_group streams;
     * WATCHER_TOO_SLOW: the stream fell watch_queue_max bindings behind and was dropped:
     * watch again with the known version), UNAVAILABLE.
     * </pre>
     */
    @io.grpc.ExperimentalApi("https://github.com/grpc/grpc-java/issues/10918")
    public io.grpc.stub.BlockingClientCall<?, dataservice.assigner.v1.Binding.WatchBindingResponse>
        watchBinding(dataservice.assigner.v1.Binding.WatchBindingRequest request) {
      return io.grpc.stub.ClientCalls.blockingV2ServerStreamingCall(
          getChannel(), getWatchBindingMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Removes a client's binding and ends its watch streams. Unbinding an unbound client
     * succeeds (idempotent).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`, UNAVAILABLE.
     * </pre>
     */
    public dataservice.assigner.v1.Binding.UnbindResponse unbind(dataservice.assigner.v1.Binding.UnbindRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getUnbindMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do limited synchronous rpc calls to service BindingService.
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public static final class BindingServiceBlockingStub
      extends io.grpc.stub.AbstractBlockingStub<BindingServiceBlockingStub> {
    private BindingServiceBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected BindingServiceBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new BindingServiceBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Binds a client to the sidecar(s) of a group, or returns its existing binding
     * (idempotent per client_id and group).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED (caller may not read the group), FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_CLIENTS: a new client past the group's
     * max_clients_per_group), UNAVAILABLE.
     * </pre>
     */
    public dataservice.assigner.v1.Binding.BindResponse bind(dataservice.assigner.v1.Binding.BindRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getBindMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Streams a client's binding: first the current binding if its version differs from
     * known_version (always when known_version is 0), then every later change as it happens
     * (never behind a cache). The stream stays open until the client cancels it, Unbind is
     * called, or this replica stops serving the group: a lost term ends it
     * FAILED_PRECONDITION (NOT_LEADER) with `ds-leader`, a group closed here UNAVAILABLE
     * (SERVICE_NOT_READY); either way the client re-watches the leader. It does not bind:
     * call Bind first (a watch alone stores no binding and is not counted as a client).
     * Errors: INVALID_ARGUMENT (empty client_id/group, negative known_version), NOT_FOUND
     * (unknown group), PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_WATCHERS: the group has max_watchers_per_group streams;
     * WATCHER_TOO_SLOW: the stream fell watch_queue_max bindings behind and was dropped:
     * watch again with the known version), UNAVAILABLE.
     * </pre>
     */
    public java.util.Iterator<dataservice.assigner.v1.Binding.WatchBindingResponse> watchBinding(
        dataservice.assigner.v1.Binding.WatchBindingRequest request) {
      return io.grpc.stub.ClientCalls.blockingServerStreamingCall(
          getChannel(), getWatchBindingMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Removes a client's binding and ends its watch streams. Unbinding an unbound client
     * succeeds (idempotent).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`, UNAVAILABLE.
     * </pre>
     */
    public dataservice.assigner.v1.Binding.UnbindResponse unbind(dataservice.assigner.v1.Binding.UnbindRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getUnbindMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do ListenableFuture-style rpc calls to service BindingService.
   * <pre>
   * Binds application clients to the sidecars that serve their group.
   * </pre>
   */
  public static final class BindingServiceFutureStub
      extends io.grpc.stub.AbstractFutureStub<BindingServiceFutureStub> {
    private BindingServiceFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected BindingServiceFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new BindingServiceFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Binds a client to the sidecar(s) of a group, or returns its existing binding
     * (idempotent per client_id and group).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED (caller may not read the group), FAILED_PRECONDITION + `ds-leader`,
     * RESOURCE_EXHAUSTED (TOO_MANY_CLIENTS: a new client past the group's
     * max_clients_per_group), UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.assigner.v1.Binding.BindResponse> bind(
        dataservice.assigner.v1.Binding.BindRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getBindMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Removes a client's binding and ends its watch streams. Unbinding an unbound client
     * succeeds (idempotent).
     * Errors: INVALID_ARGUMENT (empty client_id/group), NOT_FOUND (unknown group),
     * PERMISSION_DENIED, FAILED_PRECONDITION + `ds-leader`, UNAVAILABLE.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dataservice.assigner.v1.Binding.UnbindResponse> unbind(
        dataservice.assigner.v1.Binding.UnbindRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getUnbindMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_BIND = 0;
  private static final int METHODID_WATCH_BINDING = 1;
  private static final int METHODID_UNBIND = 2;

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
        case METHODID_BIND:
          serviceImpl.bind((dataservice.assigner.v1.Binding.BindRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.BindResponse>) responseObserver);
          break;
        case METHODID_WATCH_BINDING:
          serviceImpl.watchBinding((dataservice.assigner.v1.Binding.WatchBindingRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.WatchBindingResponse>) responseObserver);
          break;
        case METHODID_UNBIND:
          serviceImpl.unbind((dataservice.assigner.v1.Binding.UnbindRequest) request,
              (io.grpc.stub.StreamObserver<dataservice.assigner.v1.Binding.UnbindResponse>) responseObserver);
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
        default:
          throw new AssertionError();
      }
    }
  }

  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {
    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
        .addMethod(
          getBindMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.assigner.v1.Binding.BindRequest,
              dataservice.assigner.v1.Binding.BindResponse>(
                service, METHODID_BIND)))
        .addMethod(
          getWatchBindingMethod(),
          io.grpc.stub.ServerCalls.asyncServerStreamingCall(
            new MethodHandlers<
              dataservice.assigner.v1.Binding.WatchBindingRequest,
              dataservice.assigner.v1.Binding.WatchBindingResponse>(
                service, METHODID_WATCH_BINDING)))
        .addMethod(
          getUnbindMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dataservice.assigner.v1.Binding.UnbindRequest,
              dataservice.assigner.v1.Binding.UnbindResponse>(
                service, METHODID_UNBIND)))
        .build();
  }

  private static abstract class BindingServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    BindingServiceBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return dataservice.assigner.v1.Binding.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("BindingService");
    }
  }

  private static final class BindingServiceFileDescriptorSupplier
      extends BindingServiceBaseDescriptorSupplier {
    BindingServiceFileDescriptorSupplier() {}
  }

  private static final class BindingServiceMethodDescriptorSupplier
      extends BindingServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final java.lang.String methodName;

    BindingServiceMethodDescriptorSupplier(java.lang.String methodName) {
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
      synchronized (BindingServiceGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new BindingServiceFileDescriptorSupplier())
              .addMethod(getBindMethod())
              .addMethod(getWatchBindingMethod())
              .addMethod(getUnbindMethod())
              .build();
        }
      }
    }
    return result;
  }
}
