package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import com.google.rpc.Code;
import dataservice.assigner.v1.Binding.BindRequest;
import dataservice.assigner.v1.Binding.BindResponse;
import dataservice.assigner.v1.Binding.UnbindRequest;
import dataservice.assigner.v1.Binding.UnbindResponse;
import dataservice.assigner.v1.Binding.WatchBindingRequest;
import dataservice.assigner.v1.Binding.WatchBindingResponse;
import dataservice.assigner.v1.BindingServiceGrpc;
import dataservice.assigner.v1.Types.Binding;
import dataservice.sidecar.v1.Stream.AckRequest;
import dataservice.sidecar.v1.Stream.AckResponse;
import dataservice.sidecar.v1.Stream.FetchRequest;
import dataservice.sidecar.v1.Stream.FetchResponse;
import dataservice.sidecar.v1.Stream.NackRequest;
import dataservice.sidecar.v1.Stream.NackResponse;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.Stream.StreamAckResult;
import dataservice.sidecar.v1.Stream.StreamBatch;
import dataservice.sidecar.v1.Stream.StreamRequest;
import dataservice.sidecar.v1.Stream.StreamResponse;
import dataservice.sidecar.v1.StreamServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The client against in-process assigner and sidecar servers that answer as the protocol says:
 * an unknown group surfaced (C2), NOT_LEADER followed (C4), a rebind followed by itself (C17),
 * the fetch rotation and skipping a failed sidecar (C18, C19), credits and acks on a stream
 * (C24, C25), Nack(all) and Unbind on close (C38).
 */
class InProcessClientTest {
  private final List<Server> servers = new ArrayList<>();

  /**
   * An assigner: Bind answers {@code binding}; WatchBinding first sends {@code binding} when its
   * version is above the known version (as the real one does), then what is put in
   * {@code pushes}, and ends with the failure put in {@code ends} (status OK: a clean end).
   */
  static final class FakeAssigner extends BindingServiceGrpc.BindingServiceImplBase {
    volatile Binding binding;
    volatile String redirectTo;
    volatile boolean unknownGroup;
    final BlockingQueue<Binding> pushes = new LinkedBlockingQueue<>();
    final BlockingQueue<io.grpc.StatusRuntimeException> ends = new LinkedBlockingQueue<>();
    final List<String> calls = new CopyOnWriteArrayList<>();

    @Override
    public void bind(BindRequest request, StreamObserver<BindResponse> response) {
      calls.add("bind " + request.getClientId() + " " + request.getGroup());
      if (redirectTo != null) {
        Metadata trailers = new Metadata();
        trailers.put(CallPolicy.DS_LEADER, redirectTo);
        response.onError(ErrorMappingTest.failure(Code.FAILED_PRECONDITION, "NOT_LEADER",
            "standby", trailers));
        return;
      }
      if (unknownGroup) {
        response.onError(ErrorMappingTest.failure(Code.NOT_FOUND, "GROUP_NOT_FOUND",
            "no group " + request.getGroup(), new Metadata()));
        return;
      }
      response.onNext(BindResponse.newBuilder().setBinding(binding).build());
      response.onCompleted();
    }

    @Override
    public void watchBinding(WatchBindingRequest request,
        StreamObserver<WatchBindingResponse> response) {
      calls.add("watch " + request.getKnownVersion());
      Binding now = binding;
      if (now != null && now.getVersion() > request.getKnownVersion()) {
        response.onNext(WatchBindingResponse.newBuilder().setBinding(now).build());
      }
      try {
        while (true) {
          Binding next = pushes.poll(50, TimeUnit.MILLISECONDS);
          if (io.grpc.Context.current().isCancelled()) {
            return;
          }
          io.grpc.StatusRuntimeException end = ends.poll();
          if (end != null) {
            if (end.getStatus().isOk()) {
              response.onCompleted();
            } else {
              response.onError(end);
            }
            return;
          }
          if (next != null) {
            response.onNext(WatchBindingResponse.newBuilder().setBinding(next).build());
          }
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }

    @Override
    public void unbind(UnbindRequest request, StreamObserver<UnbindResponse> response) {
      calls.add("unbind " + request.getClientId());
      response.onNext(UnbindResponse.getDefaultInstance());
      response.onCompleted();
    }
  }

  /** A sidecar that hands out the batches queued in {@code batches}, and records acks. */
  static final class FakeSidecar extends StreamServiceGrpc.StreamServiceImplBase {
    final String name;
    final BlockingQueue<RecordBatch> batches = new LinkedBlockingQueue<>();
    final List<FetchRequest> fetches = new CopyOnWriteArrayList<>();
    final List<AckRequest> acks = new CopyOnWriteArrayList<>();
    final List<NackRequest> nacks = new CopyOnWriteArrayList<>();
    final List<StreamRequest> streamed = new CopyOnWriteArrayList<>();
    /** The response side of every Stream opened, in order (a test ends one with it). */
    final List<StreamObserver<StreamResponse>> streams = new CopyOnWriteArrayList<>();
    volatile Status failFetch;
    /** When set, acks on a stream get no ack_result (they wait, as behind a slow commit). */
    volatile boolean holdStreamAcks;

    FakeSidecar(String name) {
      this.name = name;
    }

    @Override
    public void fetch(FetchRequest request, StreamObserver<FetchResponse> response) {
      fetches.add(request);
      if (failFetch != null) {
        response.onError(failFetch.asRuntimeException());
        return;
      }
      long waitMs = request.getMaxWait().getSeconds() * 1000 + request.getMaxWait().getNanos()
          / 1_000_000;
      try {
        RecordBatch b = batches.poll(waitMs, TimeUnit.MILLISECONDS);
        FetchResponse.Builder out = FetchResponse.newBuilder();
        if (b != null) {
          out.addBatches(b);
        }
        response.onNext(out.build());
        response.onCompleted();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }

    @Override
    public void ack(AckRequest request, StreamObserver<AckResponse> response) {
      acks.add(request);
      response.onNext(AckResponse.newBuilder()
          .setAckedCount(request.getAcksCount() + request.getRangesCount()).build());
      response.onCompleted();
    }

    @Override
    public void nack(NackRequest request, StreamObserver<NackResponse> response) {
      nacks.add(request);
      response.onNext(NackResponse.newBuilder().setNackedCount(1).build());
      response.onCompleted();
    }

    @Override
    public StreamObserver<StreamRequest> stream(StreamObserver<StreamResponse> response) {
      OpenStream open = new OpenStream(response);
      return new StreamObserver<>() {
        @Override
        public void onNext(StreamRequest request) {
          streamed.add(request);
          if (request.hasOpen()) {
            streams.add(open);
          }
          synchronized (open) {
            if (open.ended) {
              return; // ended by the test: a batch stays queued for the next stream
            }
            if (request.hasOpen() || request.hasCredit()) {
              RecordBatch b = batches.poll();
              if (b != null) {
                response.onNext(StreamResponse.newBuilder()
                    .setBatch(StreamBatch.newBuilder().addBatches(b)).build());
              }
            }
            if (request.hasAcks() && !holdStreamAcks) {
              response.onNext(StreamResponse.newBuilder().setAckResult(StreamAckResult
                  .newBuilder().setAckedCount(request.getAcks().getRangesCount())).build());
            }
          }
        }

        @Override
        public void onError(Throwable t) {}

        @Override
        public void onCompleted() {
          open.onCompleted();
        }
      };
    }
  }

  /**
   * The response side of one Stream, as a test holds it: ending it (onError, onCompleted)
   * and the server thread's sends take turns, so a credit handled after the test ended the
   * stream takes no batch off the queue and loses none.
   */
  static final class OpenStream implements StreamObserver<StreamResponse> {
    private final StreamObserver<StreamResponse> response;
    boolean ended;

    OpenStream(StreamObserver<StreamResponse> response) {
      this.response = response;
    }

    @Override
    public synchronized void onNext(StreamResponse value) {
      if (!ended) {
        response.onNext(value);
      }
    }

    @Override
    public synchronized void onError(Throwable t) {
      if (!ended) {
        ended = true;
        response.onError(t);
      }
    }

    @Override
    public synchronized void onCompleted() {
      if (!ended) {
        ended = true;
        response.onCompleted();
      }
    }
  }

  private void serve(String name, io.grpc.BindableService service) throws Exception {
    servers.add(InProcessServerBuilder.forName(name).addService(service).build().start());
  }

  @AfterEach
  void stop() {
    for (Server s : servers) {
      s.shutdownNow();
    }
  }

  static RecordBatch batch(int partition, long epoch, long... offsets) {
    int[] lengths = new int[offsets.length];
    java.util.Arrays.fill(lengths, 1);
    return RecordBatch.newBuilder().setTopic("t").setPartition(partition).setLeaseEpoch(epoch)
        .setDeliveryCount(1).setOffsets(DecodeAndAckPlanTest.longs(offsets))
        .setValueLengths(DecodeAndAckPlanTest.ints(lengths))
        .setValues(ByteString.copyFromUtf8("x".repeat(offsets.length))).build();
  }

  private DsClient client(String assigner) {
    return DsClient.builder("g").assigner(assigner).clientId("c1")
        .channels(new InProcessChannels()).build();
  }

  @Test
  void anUnknownGroupIsSurfacedAtOnceWithItsReason() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.unknownGroup = true;
    serve("assigner", assigner);
    DsClientException e = assertThrows(DsClientException.class, () -> client("assigner"));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals("GROUP_NOT_FOUND", e.reason());
    assertEquals(1, assigner.calls.size(), "not retried: " + assigner.calls);
  }

  @Test
  void aStandbyNamingTheLeaderIsFollowedAndTheClientBindsThere() throws Exception {
    FakeAssigner standby = new FakeAssigner();
    standby.redirectTo = "leader";
    FakeAssigner leader = new FakeAssigner();
    leader.binding = BindingStateTest.binding(1, "s1");
    serve("standby", standby);
    serve("leader", leader);
    serve("s1", new FakeSidecar("s1"));
    try (DsClient client = client("standby")) {
      assertEquals(List.of("s1"), client.boundSidecars());
      assertEquals(1, standby.calls.size());
      assertEquals("bind c1 g", leader.calls.get(0));
    }
  }

  @Test
  void aRebindIsFollowedAndAcksGoToTheSidecarThatDelivered() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    FakeSidecar s1 = new FakeSidecar("s1");
    FakeSidecar s2 = new FakeSidecar("s2");
    serve("assigner", assigner);
    serve("s1", s1);
    serve("s2", s2);
    s1.batches.add(batch(0, 1, 0, 1, 2));
    try (DsClient client = client("assigner")) {
      List<DsRecord> first = client.fetch(Duration.ofSeconds(2));
      assertEquals(3, first.size());
      assertEquals(3, client.ack(first));
      assertEquals(1, s1.acks.size());
      assertEquals(0, s1.acks.get(0).getRanges(0).getFromOffset());
      assertEquals(3, s1.acks.get(0).getRanges(0).getToOffset());
      assertEquals(1, s1.acks.get(0).getRanges(0).getLeaseEpoch());

      s1.batches.add(batch(0, 1, 3));
      List<DsRecord> unacked = client.fetch(Duration.ofSeconds(2));
      assertEquals(1, unacked.size());
      // s1 is killed: the assigner moves partition 0 to s2, epoch 2.
      assigner.pushes.add(BindingStateTest.binding(2, "s2"));
      s2.batches.add(batch(0, 2, 3, 4));
      List<DsRecord> moved = client.fetch(Duration.ofSeconds(5));
      assertEquals(List.of("s2"), client.boundSidecars());
      assertEquals(2, moved.size());
      assertEquals("s2", moved.get(0).delivery().sidecar());
      assertEquals(0, client.ack(unacked), "s1 is no longer bound: its ack is dropped");
      assertEquals(1, s1.acks.size());
      assertEquals(2, client.ack(moved));
      assertEquals(2, s2.acks.get(0).getRanges(0).getLeaseEpoch());
    }
    assertTrue(s2.nacks.get(0).getAll(), "close gives back what is not acked");
    assertTrue(assigner.calls.contains("unbind c1"));
  }

  @Test
  void theFetchSweepsEverySidecarThenLongPollsTheLastSkippingAFailedOne() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1", "s2", "s3");
    FakeSidecar s1 = new FakeSidecar("s1");
    FakeSidecar s2 = new FakeSidecar("s2");
    FakeSidecar s3 = new FakeSidecar("s3");
    s2.failFetch = Status.UNAVAILABLE.withDescription("killed");
    serve("assigner", assigner);
    serve("s1", s1);
    serve("s2", s2);
    serve("s3", s3);
    try (DsClient client = client("assigner")) {
      assertEquals(List.of(), client.fetch(Duration.ofSeconds(2)));
      // The first pass starts at s1: s1, s2 (failed: skipped), s3 swept with max_wait 0, then
      // s3, the last of the rotation, long-polled with what is left.
      // max_wait is present and zero in the sweep (C50): absent, a sidecar would long-poll.
      for (FetchRequest swept : List.of(s1.fetches.get(0), s3.fetches.get(0))) {
        assertTrue(swept.hasMaxWait(), "max_wait present");
        assertEquals(0, swept.getMaxWait().getSeconds());
        assertEquals(0, swept.getMaxWait().getNanos());
      }
      assertTrue(s3.fetches.get(1).getMaxWait().getNanos() > 0);
      assertEquals(dataservice.sidecar.v1.Stream.DeliveryFormat.DELIVERY_FORMAT_BATCHES,
          s1.fetches.get(0).getFormat());
      s2.failFetch = null;
      s2.batches.add(batch(1, 4, 7));
      List<DsRecord> got = client.fetch(Duration.ofSeconds(2));
      assertEquals(1, got.size());
      assertEquals("s2", got.get(0).delivery().sidecar());
    }
  }

  @Test
  void aStreamIsOpenedWithCreditGrantsBackWhatWasTakenAndAcksOnIt() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    FakeSidecar s1 = new FakeSidecar("s1");
    s1.batches.add(batch(2, 5, 10, 11));
    s1.batches.add(batch(2, 5, 12));
    serve("assigner", assigner);
    serve("s1", s1);
    try (DsClient client = client("assigner")) {
      client.stream();
      List<DsRecord> first = client.poll(Duration.ofSeconds(2));
      assertEquals(2, first.size());
      StreamRequest open = s1.streamed.get(0);
      assertTrue(open.hasOpen());
      assertEquals(500, open.getOpen().getInitialCredit().getRecords());
      assertEquals(false, open.getOpen().getAutoAck());
      assertEquals(false, open.getOpen().hasLinger(), "no linger unless asked for");
      List<DsRecord> second = client.poll(Duration.ofSeconds(2));
      assertEquals(1, second.size());
      assertEquals(2, s1.streamed.get(1).getCredit().getRecords(), "credit back for the batch");
      assertEquals(2, client.ack(first));
      assertTrue(s1.acks.isEmpty(), "acked on the stream, not by the Ack RPC");
      StreamRequest acks = s1.streamed.stream().filter(StreamRequest::hasAcks).findFirst()
          .orElseThrow();
      assertEquals(10, acks.getAcks().getRanges(0).getFromOffset());
      assertEquals(12, acks.getAcks().getRanges(0).getToOffset());
    }
  }

  @Test
  void aStreamOpensWithTheLingerAskedFor() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    FakeSidecar s1 = new FakeSidecar("s1");
    s1.batches.add(batch(2, 5, 10));
    serve("assigner", assigner);
    serve("s1", s1);
    try (DsClient client = DsClient.builder("g").assigner("assigner").clientId("c1")
        .channels(new InProcessChannels()).streamLinger(Duration.ofMillis(50)).build()) {
      client.stream();
      assertEquals(1, client.poll(Duration.ofSeconds(2)).size());
      StreamRequest open = s1.streamed.get(0);
      assertTrue(open.getOpen().hasLinger());
      assertEquals(50_000_000, open.getOpen().getLinger().getNanos());
    }
    assertThrows(IllegalArgumentException.class,
        () -> DsClient.builder("g").streamLinger(Duration.ofSeconds(2)));
  }

  @Test
  void channelsLetGrpcRetryUnavailableOnlyFourAttempts() throws Exception {
    java.util.concurrent.atomic.AtomicInteger calls = new java.util.concurrent.atomic.AtomicInteger();
    java.util.concurrent.atomic.AtomicReference<Status> answer =
        new java.util.concurrent.atomic.AtomicReference<>(Status.UNAVAILABLE);
    serve("flaky", new StreamServiceGrpc.StreamServiceImplBase() {
      @Override
      public void ack(AckRequest request, StreamObserver<AckResponse> response) {
        if (calls.incrementAndGet() < 4) {
          response.onError(answer.get().asRuntimeException());
          return;
        }
        response.onNext(AckResponse.newBuilder().setAckedCount(1).build());
        response.onCompleted();
      }
    });
    ManagedChannel channel = new InProcessChannels().open("flaky");
    try {
      StreamServiceGrpc.StreamServiceBlockingStub stub = StreamServiceGrpc.newBlockingStub(channel)
          .withDeadlineAfter(10, TimeUnit.SECONDS);
      assertEquals(1, stub.ack(AckRequest.getDefaultInstance()).getAckedCount());
      assertEquals(4, calls.get(), "three UNAVAILABLE answers retried by gRPC itself");
      calls.set(0);
      answer.set(Status.INTERNAL);
      io.grpc.StatusRuntimeException e = assertThrows(io.grpc.StatusRuntimeException.class,
          () -> stub.ack(AckRequest.getDefaultInstance()));
      assertEquals(Status.Code.INTERNAL, e.getStatus().getCode());
      assertEquals(1, calls.get(), "anything but UNAVAILABLE is not retried");
    } finally {
      channel.shutdownNow();
    }
  }
}
