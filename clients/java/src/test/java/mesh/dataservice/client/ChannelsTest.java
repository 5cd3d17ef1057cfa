package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dataservice.sidecar.v1.Stream.FetchRequest;
import dataservice.sidecar.v1.Stream.FetchResponse;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.StreamServiceGrpc;
import io.grpc.ForwardingChannelBuilder2;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.InsecureServerCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Server;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The settings of every channel (C49, §5), over real Netty transports on loopback: a 5 MiB
 * answer is received (64 MiB allowed), a peer that keeps failing is tried again within about a
 * second (not after grpc-java's backoff growing to 120 s), and the keepalive asked for.
 */
class ChannelsTest {
  private static final int FIVE_MIB = 5 * 1024 * 1024;

  @Test
  void aFiveMebibyteAnswerReachesTheClient() throws Exception {
    Server server = Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
        .addService(new StreamServiceGrpc.StreamServiceImplBase() {
          @Override
          public void fetch(FetchRequest request, StreamObserver<FetchResponse> response) {
            response.onNext(FetchResponse.newBuilder().addBatches(RecordBatch.newBuilder()
                .setTopic("t").setValues(ByteString.copyFrom(new byte[FIVE_MIB]))).build());
            response.onCompleted();
          }
        }).build().start();
    ManagedChannel channel = new Channels(Security.PLAINTEXT)
        .open("localhost:" + server.getPort());
    try {
      FetchResponse got = StreamServiceGrpc.newBlockingStub(channel)
          .withDeadlineAfter(30, TimeUnit.SECONDS).fetch(FetchRequest.getDefaultInstance());
      assertEquals(FIVE_MIB, got.getBatches(0).getValues().size());
    } finally {
      channel.shutdownNow();
      server.shutdownNow();
    }
  }

  /** Forwards to a real Netty channel builder and notes the keepalive asked for. */
  static final class KeepaliveNoted extends ForwardingChannelBuilder2<KeepaliveNoted> {
    private final ManagedChannelBuilder<?> real = Grpc.newChannelBuilder("localhost:1",
        InsecureChannelCredentials.create());
    long timeSeconds;
    long timeoutSeconds;
    boolean withoutCalls;

    @Override
    protected ManagedChannelBuilder<?> delegate() {
      return real;
    }

    @Override
    public KeepaliveNoted keepAliveTime(long time, TimeUnit unit) {
      timeSeconds = unit.toSeconds(time);
      return super.keepAliveTime(time, unit);
    }

    @Override
    public KeepaliveNoted keepAliveTimeout(long time, TimeUnit unit) {
      timeoutSeconds = unit.toSeconds(time);
      return super.keepAliveTimeout(time, unit);
    }

    @Override
    public KeepaliveNoted keepAliveWithoutCalls(boolean enable) {
      withoutCalls = enable;
      return super.keepAliveWithoutCalls(enable);
    }
  }

  @Test
  void everyChannelPingsEvery20sAlsoWithoutCalls() {
    // A ping every 20 s cannot be watched in a unit test's time; what is checked is that the
    // settings every channel gets ask grpc-java for it (its transport sends the pings).
    KeepaliveNoted noted = new KeepaliveNoted();
    Channels.configure(noted);
    assertEquals(20, noted.timeSeconds);
    assertEquals(20, noted.timeoutSeconds);
    assertTrue(noted.withoutCalls);
  }

  @Test
  void aPeerThatKeepsFailingIsTriedMoreOftenThanGrpcsOwnBackoffAllows() throws Exception {
    // A listener that accepts each connection and closes it at once: every connection attempt
    // fails, and the channel tries again after its reconnect backoff.
    List<Long> accepted = new ArrayList<>();
    try (ServerSocket listener = new ServerSocket(0)) {
      Thread acceptor = new Thread(() -> {
        while (!listener.isClosed()) {
          try (Socket s = listener.accept()) {
            synchronized (accepted) {
              accepted.add(System.nanoTime());
            }
          } catch (IOException e) {
            return;
          }
        }
      });
      acceptor.setDaemon(true);
      acceptor.start();
      ManagedChannel channel = new Channels(Security.PLAINTEXT)
          .open("localhost:" + listener.getLocalPort());
      try {
        channel.getState(true); // connect, without a call
        Thread.sleep(8_000);
      } finally {
        channel.shutdownNow();
      }
    }
    List<Long> gapsMs = new ArrayList<>();
    synchronized (accepted) {
      for (int i = 1; i < accepted.size(); i++) {
        gapsMs.add((accepted.get(i) - accepted.get(i - 1)) / 1_000_000);
      }
    }
    // grpc-java's own backoff: 1 s, 1.6 s, 2.56 s, 4.1 s (each +-20%): within 8 s at most 5
    // attempts (4 pauses, 0.8 + 1.28 + 2.05 + 3.28 s at the shortest). The rule, 0.1 s
    // growing to 1 s, makes about 11. Counted, not timed (a single pause is no measure on a
    // loaded machine: one of 2.9 s was seen there): 8 pauses leave room for a slow machine
    // and are 2x what grpc-java's backoff could give.
    assertTrue(gapsMs.size() >= 8, "pauses between attempts (ms): " + gapsMs);
  }
}
