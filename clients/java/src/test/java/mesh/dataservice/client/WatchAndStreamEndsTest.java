package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.rpc.Code;
import dataservice.sidecar.v1.Stream.StreamRequest;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessServerBuilder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import mesh.dataservice.client.InProcessClientTest.FakeAssigner;
import mesh.dataservice.client.InProcessClientTest.FakeSidecar;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * What the client does when a watch or a stream ends, against in-process servers: a watch that
 * ends is opened again with the held version and the missed binding arrives (C14); a terminal
 * status stops it and the next read raises it (C54); a watched version 0 is applied whatever the
 * version held (C55); a stream that ends UNAVAILABLE (C26) or cleanly (C53) is opened again
 * while its sidecar is bound, and the acks it had not answered go by the Ack RPC (C26).
 */
class WatchAndStreamEndsTest {
  private final List<Server> servers = new ArrayList<>();

  private void serve(String name, io.grpc.BindableService service) throws Exception {
    servers.add(InProcessServerBuilder.forName(name).addService(service).build().start());
  }

  @AfterEach
  void stop() {
    for (Server s : servers) {
      s.shutdownNow();
    }
  }

  private DsClient client() {
    return DsClient.builder("g").assigner("assigner").clientId("c1")
        .channels(new InProcessChannels()).build();
  }

  private static void await(String what, BooleanSupplier done) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > deadline) {
        throw new AssertionError("not within 10 s: " + what);
      }
      Thread.sleep(10);
    }
  }

  private static long watches(FakeAssigner assigner, long knownVersion) {
    return assigner.calls.stream().filter(c -> c.equals("watch " + knownVersion)).count();
  }

  @Test
  void aWatchThatEndsIsOpenedAgainWithTheHeldVersionAndTheMissedBindingsArrive()
      throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    serve("assigner", assigner);
    serve("s1", new FakeSidecar("s1"));
    serve("s2", new FakeSidecar("s2"));
    serve("s3", new FakeSidecar("s3"));
    try (DsClient client = client()) {
      await("the first watch", () -> watches(assigner, 1) == 1);
      // Dropped for falling behind: meanwhile the group moved to s2 (version 2).
      assigner.binding = BindingStateTest.binding(2, "s2");
      assigner.ends.add(ErrorMappingTest.failure(Code.RESOURCE_EXHAUSTED, "WATCHER_TOO_SLOW",
          "watcher too slow", new Metadata()));
      await("watched again with version 1", () -> watches(assigner, 1) >= 2);
      await("the missed binding v2 applied", () -> client.boundSidecars().equals(List.of("s2")));
      // Ended UNAVAILABLE (the replica going away): the same again, with version 2.
      assigner.binding = BindingStateTest.binding(3, "s3");
      assigner.ends.add(Status.UNAVAILABLE.withDescription("replica stopping")
          .asRuntimeException());
      await("the missed binding v3 applied", () -> client.boundSidecars().equals(List.of("s3")));
      assertTrue(watches(assigner, 2) >= 1, "watched again with version 2: " + assigner.calls);
      assertEquals(List.of(), client.fetch(Duration.ofMillis(200)), "nothing surfaced");
    }
  }

  @ParameterizedTest
  @CsvSource({"NOT_FOUND, GROUP_NOT_FOUND", "INVALID_ARGUMENT, INVALID_FIELD",
      "PERMISSION_DENIED, PERMISSION_DENIED", "UNAUTHENTICATED, UNAUTHENTICATED"})
  void aWatchEndedByATerminalStatusStopsAndTheNextReadRaisesIt(String code, String reason)
      throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    serve("assigner", assigner);
    serve("s1", new FakeSidecar("s1"));
    try (DsClient client = client()) {
      await("the first watch", () -> watches(assigner, 1) == 1);
      assigner.ends.add(ErrorMappingTest.failure(Code.valueOf(code), reason, "refused",
          new Metadata()));
      DsClientException raised = assertThrows(DsClientException.class, () -> {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < deadline) {
          client.fetch(Duration.ofMillis(100));
        }
      });
      assertEquals(Status.Code.valueOf(code), raised.code());
      assertEquals(reason, raised.reason());
      assertThrows(DsClientException.class, () -> client.fetch(Duration.ofMillis(10)),
          "raised again by every later read");
      Thread.sleep(500);
      assertEquals(1, assigner.calls.stream().filter(c -> c.startsWith("watch")).count(),
          "not watched again: " + assigner.calls);
    }
  }

  @Test
  void aWatchedBindingWithVersion0IsAppliedWhateverTheVersionHeld() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(7, "s1");
    serve("assigner", assigner);
    serve("s1", new FakeSidecar("s1"));
    serve("s2", new FakeSidecar("s2"));
    try (DsClient client = client()) {
      await("the first watch", () -> watches(assigner, 7) == 1);
      assigner.pushes.add(BindingStateTest.binding(3, "s2"));
      assigner.pushes.add(BindingStateTest.binding(0, "s2"));
      await("version 0 applied", () -> client.boundSidecars().equals(List.of("s2")));
      assertEquals(List.of("s2"), client.boundSidecars());
    }
  }

  /** Waits until {@code sidecar} saw {@code n} Stream opens. */
  private static void awaitOpens(FakeSidecar sidecar, int n) throws InterruptedException {
    await(n + " streams opened", () -> sidecar.streams.size() >= n);
  }

  @Test
  void aStreamThatEndsUnavailableIsOpenedAgainAndItsPendingAcksGoByTheAckRpc()
      throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    FakeSidecar s1 = new FakeSidecar("s1");
    s1.batches.add(InProcessClientTest.batch(0, 1, 0, 1));
    s1.batches.add(InProcessClientTest.batch(0, 1, 2));
    serve("assigner", assigner);
    serve("s1", s1);
    try (DsClient client = client()) {
      client.stream();
      List<DsRecord> first = client.poll(Duration.ofSeconds(5));
      List<DsRecord> second = client.poll(Duration.ofSeconds(5));
      assertEquals(2, first.size());
      assertEquals(1, second.size());
      // An ack sent on the stream, its answer held back, when the stream ends UNAVAILABLE.
      s1.holdStreamAcks = true;
      CompletableFuture<Long> pending = CompletableFuture.supplyAsync(() -> client.ack(first));
      await("the ack sent on the stream", () -> s1.streamed.stream()
          .anyMatch(StreamRequest::hasAcks));
      s1.batches.add(InProcessClientTest.batch(0, 1, 3)); // for the re-opened stream
      s1.streams.get(0).onError(Status.UNAVAILABLE.withDescription("commit failed")
          .asRuntimeException());
      assertEquals(2, pending.get(10, TimeUnit.SECONDS), "answered by the Ack RPC");
      assertEquals(1, s1.acks.size());
      assertEquals(0, s1.acks.get(0).getRanges(0).getFromOffset());
      assertEquals(2, s1.acks.get(0).getRanges(0).getToOffset());
      // A batch of the ended stream acked afterwards goes by the Ack RPC too.
      assertEquals(1, client.ack(second));
      assertEquals(2, s1.acks.size());
      assertEquals(2, s1.acks.get(1).getRanges(0).getFromOffset());
      // The stream is opened again, and reading goes on on it.
      awaitOpens(s1, 2);
      s1.holdStreamAcks = false;
      List<DsRecord> third = client.poll(Duration.ofSeconds(5));
      assertEquals(1, third.size());
      assertEquals(3, third.get(0).offset());
      assertEquals(1, client.ack(third));
      assertEquals(2, s1.acks.size(), "acked on the new stream, not by the Ack RPC");
      assertEquals(2, s1.streamed.stream().filter(StreamRequest::hasOpen).count());
    }
  }

  @Test
  void aStreamThatEndsCleanlyIsOpenedAgain() throws Exception {
    FakeAssigner assigner = new FakeAssigner();
    assigner.binding = BindingStateTest.binding(1, "s1");
    FakeSidecar s1 = new FakeSidecar("s1");
    s1.batches.add(InProcessClientTest.batch(0, 1, 0));
    serve("assigner", assigner);
    serve("s1", s1);
    try (DsClient client = client()) {
      client.stream();
      assertEquals(1, client.poll(Duration.ofSeconds(5)).size());
      s1.batches.add(InProcessClientTest.batch(0, 1, 1)); // for the re-opened stream
      s1.streams.get(0).onCompleted(); // status OK: the sidecar ended the stream cleanly
      awaitOpens(s1, 2);
      List<DsRecord> next = client.poll(Duration.ofSeconds(5));
      assertEquals(1, next.size(), "read on the re-opened stream, nothing surfaced");
      assertEquals(1, next.get(0).offset());
    }
  }
}
