package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dataservice.sidecar.v1.Stream.FetchRequest;
import dataservice.sidecar.v1.StreamServiceGrpc;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ClientInterceptors;
import io.grpc.ClientStreamTracer;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The in-process transport's race that {@link InProcessChannels} answers: a channel shut down
 * between the transport giving a call its stream and the stream's start (here from the call's own
 * tracer, so the interleaving is certain instead of once in a CI run).
 */
class InProcessChannelsTest {
  private static final FetchRequest FETCH =
      FetchRequest.newBuilder().setClientId("c1").setGroup("g").build();
  private Server server;

  @AfterEach
  void stop() {
    if (server != null) {
      server.shutdownNow();
    }
  }

  /** {@code channel}, shut down from inside each call's start once the transport gave a stream. */
  static Channel shutDownAsTheStreamStarts(ManagedChannel channel) {
    ClientStreamTracer.Factory tracers = new ClientStreamTracer.Factory() {
      @Override
      public ClientStreamTracer newClientStreamTracer(ClientStreamTracer.StreamInfo info,
          Metadata headers) {
        return new ClientStreamTracer() {
          @Override
          public void outboundHeaders() {
            channel.shutdownNow();
          }
        };
      }
    };
    return ClientInterceptors.intercept(channel, new ClientInterceptor() {
      @Override
      public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method,
          CallOptions options, Channel next) {
        return next.newCall(method, options.withStreamTracerFactory(tracers));
      }
    });
  }

  /** A ready channel to a sidecar: one fetch answered over it. */
  private ManagedChannel ready(ManagedChannel channel) throws Exception {
    server = InProcessServerBuilder.forName("s1").addService(new InProcessClientTest.FakeSidecar(
        "s1")).build().start();
    StreamServiceGrpc.newBlockingStub(channel).withDeadlineAfter(2, TimeUnit.SECONDS)
        .fetch(FETCH);
    return channel;
  }

  @Test
  void grpcJavasInProcessTransportThrowsIntoTheCaller() throws Exception {
    ManagedChannel channel = ready(InProcessChannelBuilder.forName("s1").build());
    NullPointerException e = assertThrows(NullPointerException.class,
        () -> StreamServiceGrpc.newBlockingStub(shutDownAsTheStreamStarts(channel))
            .withDeadlineAfter(2, TimeUnit.SECONDS).fetch(FETCH));
    assertEquals("scheduler", e.getMessage(), "if grpc-java fixed it, drop the workaround");
  }

  @Test
  void theTestsChannelsEndSuchACallUnavailableAsNettyDoes() throws Exception {
    ManagedChannel channel = ready(new InProcessChannels().open("s1"));
    StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
        () -> StreamServiceGrpc.newBlockingStub(shutDownAsTheStreamStarts(channel))
            .withDeadlineAfter(2, TimeUnit.SECONDS).fetch(FETCH));
    assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
    assertTrue(channel.isShutdown());
  }
}
