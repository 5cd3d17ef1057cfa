package mesh.dataservice.client;

import static mesh.dataservice.client.InProcessClientTest.batch;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dataservice.assigner.v1.Types.Binding;
import dataservice.assigner.v1.Types.SidecarEndpoint;
import dataservice.sidecar.v1.Stream.FetchRequest;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.Stream.StreamBatch;
import dataservice.sidecar.v1.Stream.StreamRequest;
import dataservice.sidecar.v1.Stream.StreamResponse;
import dataservice.sidecar.v1.StreamServiceGrpc;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.Status;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.stub.StreamObserver;
import java.net.SocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.ServerSocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * §3 local_address: which target the client dials for a bound sidecar ({@link LocalSocket}),
 * and the client against a fake sidecar served on TCP and on a Unix domain socket in a temp dir
 * (as the sidecar does with --uds-dir): it reads over the socket, stays on TCP when the file does
 * not accept, falls back to TCP after UNAVAILABLE on the socket and tries it again at the next
 * binding, and sends its token over the socket.
 */
class LocalSocketTest {
  private static final String TCP = "10.0.0.7:7000";
  private static final String SOCK = "unix:/run/ds/sidecar-s1.sock";
  private static final Path CA = Path.of("/ca.pem");
  private static final Path CERT = Path.of("/app.pem");
  private static final Path KEY = Path.of("/app.key");
  private static final Path TOKEN = Path.of("/token");

  private static EventLoopGroup loop;
  private final List<Server> servers = new ArrayList<>();
  @TempDir
  Path dir;

  @BeforeAll
  static void startLoop() {
    loop = new EpollEventLoopGroup(2);
  }

  @AfterAll
  static void stopLoop() {
    loop.shutdownGracefully(0, 1, TimeUnit.SECONDS);
  }

  @AfterEach
  void stop() {
    for (Server s : servers) {
      s.shutdownNow();
    }
  }

  // ---- the rule -------------------------------------------------------------------------

  private static String target(String local, Security security, boolean nativeTransport,
      boolean accepts, List<String> asked) {
    return LocalSocket.target(TCP, local, security, () -> {
      asked.add("native");
      return nativeTransport;
    }, p -> {
      asked.add(p.toString());
      return accepts;
    });
  }

  @Test
  void theSocketExactlyWhenEveryConditionHolds() {
    Security certOnly = new Security(CA, CERT, KEY, null, null);
    Security certAndToken = new Security(CA, CERT, KEY, null, TOKEN);
    Security tokenOnly = new Security(CA, null, null, null, TOKEN);
    for (String local : List.of("", SOCK, "unix:///run/ds/sidecar-s1.sock", "unix:",
        "dns:sidecar:7000", "10.0.0.8:1")) {
      for (Security security : List.of(Security.PLAINTEXT, certOnly, certAndToken, tokenOnly)) {
        for (boolean nativeTransport : List.of(true, false)) {
          for (boolean accepts : List.of(true, false)) {
            List<String> asked = new ArrayList<>();
            String got = target(local, security, nativeTransport, accepts, asked);
            boolean told = LocalSocket.pathOf(local) != null && security != certOnly;
            boolean wanted = told && nativeTransport && accepts;
            String what = local + " " + security + " native=" + nativeTransport + " accepts="
                + accepts;
            assertEquals(wanted ? local : TCP, got, what);
            List<String> askable = !told ? List.of() : nativeTransport
                ? List.of("native", "/run/ds/sidecar-s1.sock") : List.of("native");
            assertEquals(askable, asked,
                "the native transport, then the file, only for a unix: target: " + what);
          }
        }
      }
    }
  }

  @Test
  void pathOfReadsBothUnixForms() {
    assertEquals(Path.of("/a/b.sock"), LocalSocket.pathOf("unix:/a/b.sock"));
    assertEquals(Path.of("/a/b.sock"), LocalSocket.pathOf("unix:///a/b.sock"));
    assertNull(LocalSocket.pathOf("unix:"));
    assertNull(LocalSocket.pathOf("10.0.0.7:7000"));
    assertNull(LocalSocket.pathOf(""));
  }

  @Test
  void acceptsNowOnlyWhereAProcessListens() throws Exception {
    Path live = dir.resolve("live.sock");
    try (ServerSocketChannel listening = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
      listening.bind(UnixDomainSocketAddress.of(live));
      Path stale = staleSocket(dir.resolve("stale.sock"));
      Path plain = Files.writeString(dir.resolve("plain"), "");
      assertTrue(LocalSocket.acceptsNow(live));
      assertEquals(List.of(false, false, false), List.of(LocalSocket.acceptsNow(stale),
          LocalSocket.acceptsNow(plain), LocalSocket.acceptsNow(dir.resolve("none.sock"))));
    }
    assertTrue(LocalSocket.nativeTransport(), "Netty's epoll loads on this Linux machine");
  }

  /** A socket file no process accepts on, as a killed sidecar leaves. */
  private static Path staleSocket(Path path) throws Exception {
    try (ServerSocketChannel s = ServerSocketChannel.open(StandardProtocolFamily.UNIX)) {
      s.bind(UnixDomainSocketAddress.of(path));
    }
    return path;
  }

  // ---- against a fake sidecar on TCP and on its socket ------------------------------------

  /** Notes each call a server received: "unix|tcp Method authorization". */
  static final class Transports implements ServerInterceptor {
    final List<String> calls = new CopyOnWriteArrayList<>();

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
        ServerCallHandler<Q, R> next) {
      SocketAddress local = call.getAttributes().get(Grpc.TRANSPORT_ATTR_LOCAL_ADDR);
      String auth = headers.get(TokenCredentials.AUTHORIZATION);
      calls.add((local instanceof DomainSocketAddress ? "unix " : "tcp ")
          + call.getMethodDescriptor().getBareMethodName() + " " + (auth == null ? "(none)"
          : auth));
      return next.startCall(call, headers);
    }
  }

  private Server serveTcp(io.grpc.BindableService service, Transports tr) throws Exception {
    Server s = Grpc.newServerBuilderForPort(0, InsecureServerCredentials.create())
        .addService(ServerInterceptors.intercept(service, tr)).build().start();
    servers.add(s);
    return s;
  }

  /** Serves {@code service} on the socket file {@code path}, plaintext, as the sidecar does. */
  private Server serveSocket(io.grpc.BindableService service, Transports tr, Path path)
      throws Exception {
    Files.deleteIfExists(path);
    Server s = NettyServerBuilder.forAddress(new DomainSocketAddress(path.toString()))
        .channelType(EpollServerDomainSocketChannel.class)
        .bossEventLoopGroup(loop).workerEventLoopGroup(loop)
        .withChildOption(ChannelOption.SO_KEEPALIVE, null) // none on a Unix socket
        .addService(ServerInterceptors.intercept(service, tr)).build().start();
    servers.add(s);
    return s;
  }

  private static Binding binding(long version, String address, String localAddress) {
    return Binding.newBuilder().setGroup("g").setClientId("c1").setVersion(version)
        .addEndpoints(SidecarEndpoint.newBuilder().setAddress(address).setSidecarId("s1")
            .setLocalAddress(localAddress)).build();
  }

  /** A client of group g bound to one sidecar at {@code address} naming {@code local}. */
  private DsClient client(InProcessClientTest.FakeAssigner assigner, String address, String local)
      throws Exception {
    assigner.binding = binding(1, address, local);
    Server a = serveTcp(assigner, new Transports());
    return DsClient.builder("g").assigner("127.0.0.1:" + a.getPort()).clientId("c1").build();
  }

  private static void fetchAndAck(DsClient client, InProcessClientTest.FakeSidecar sidecar,
      long first, String what) {
    sidecar.batches.add(batch(0, 1, first, first + 1));
    List<DsRecord> records = client.fetch(Duration.ofSeconds(20));
    assertEquals(2, records.size(), what + ": fetched");
    assertEquals(2, client.ack(records), what + ": acked");
  }

  private static void await(String what, BooleanSupplier condition) throws Exception {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (!condition.getAsBoolean()) {
      assertTrue(System.nanoTime() < deadline, "timed out waiting for " + what);
      Thread.sleep(10);
    }
  }

  @Test
  void theClientReadsOverTheSocketTheBindingNames() throws Exception {
    Transports tr = new Transports();
    InProcessClientTest.FakeSidecar sidecar = new InProcessClientTest.FakeSidecar("s1");
    String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
    Path path = dir.resolve("sidecar-s1.sock");
    serveSocket(sidecar, tr, path);
    try (DsClient client = client(new InProcessClientTest.FakeAssigner(), address,
        "unix:" + path)) {
      assertEquals("unix:" + path, client.dials(address));
      fetchAndAck(client, sidecar, 10, "over the socket");
    }
    assertEquals(List.of("unix Fetch (none)", "unix Ack (none)", "unix Nack (none)"), tr.calls);
    assertTrue(sidecar.nacks.get(0).getAll(), "Nack(all) at close");
  }

  /** A directory of {@code mode}, whatever the umask. */
  private Path directory(String name, String mode) throws Exception {
    Path made = Files.createDirectory(dir.resolve(name));
    Files.setPosixFilePermissions(made, java.nio.file.attribute.PosixFilePermissions.fromString(mode));
    return made;
  }

  /**
   * Issue 37, finding 1: the client sends its calls (and its token) to a socket only when nobody
   * but its owner could have placed it, as the Python and Go clients do: a socket in a directory
   * its group or every user may write, or reached through a linked directory, is not used (the
   * client reads over TCP, where TLS checks who answers); a socket writable by every user and a
   * plain file are refused as well.
   */
  @Test
  void aSocketOthersCouldHavePlacedIsNotUsed() throws Exception {
    Path own = directory("own", "rwxr-x---");
    Path link = Files.createSymbolicLink(dir.resolve("link"), own);
    java.util.Map<Path, String> cases = new java.util.LinkedHashMap<>();
    cases.put(own.resolve("sidecar-s1.sock"), null);
    cases.put(directory("group", "rwxrwx---").resolve("sidecar-s1.sock"),
        "writable by users other than its owner");
    cases.put(directory("tmp", "rwxrwxrwx").resolve("sidecar-s1.sock"),
        "writable by users other than its owner");
    cases.put(link.resolve("sidecar-s2.sock"), "is not a directory");
    for (java.util.Map.Entry<Path, String> c : cases.entrySet()) {
      Path path = c.getKey();
      Transports tr = new Transports();
      InProcessClientTest.FakeSidecar sidecar = new InProcessClientTest.FakeSidecar("s1");
      String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
      serveSocket(sidecar, tr, path);
      String why = LocalSocket.untrusted(path);
      System.out.println(path + ": " + why);
      if (c.getValue() == null) {
        assertEquals(null, why, path.toString());
      } else {
        assertTrue(why != null && why.contains(c.getValue()), path + ": " + why);
      }
      String network = c.getValue() == null ? "unix" : "tcp";
      try (DsClient client = client(new InProcessClientTest.FakeAssigner(), address,
          "unix:" + path)) {
        fetchAndAck(client, sidecar, 10, path.toString());
      }
      assertEquals(List.of(network + " Fetch (none)", network + " Ack (none)",
          network + " Nack (none)"), tr.calls, path.toString());
    }
    Path open = staleSocket(own.resolve("sidecar-s3.sock"));
    Files.setPosixFilePermissions(open,
        java.nio.file.attribute.PosixFilePermissions.fromString("rwxrwxrwx"));
    assertTrue(LocalSocket.untrusted(open).contains("writable by every user"));
    Path plain = Files.writeString(own.resolve("plain"), "");
    assertTrue(LocalSocket.untrusted(plain).contains("is not a socket"));
  }

  @Test
  void aSocketThatDoesNotAcceptLeavesTheClientOnTcp() throws Exception {
    for (Path path : List.of(dir.resolve("missing.sock"), staleSocket(dir.resolve("stale.sock")))) {
      Transports tr = new Transports();
      InProcessClientTest.FakeSidecar sidecar = new InProcessClientTest.FakeSidecar("s1");
      String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
      try (DsClient client = client(new InProcessClientTest.FakeAssigner(), address,
          "unix:" + path)) {
        assertEquals(address, client.dials(address), path.toString());
        fetchAndAck(client, sidecar, 10, path.toString());
      }
      assertEquals(List.of("tcp Fetch (none)", "tcp Ack (none)", "tcp Nack (none)"), tr.calls,
          path.toString());
    }
  }

  @Test
  void aFailedSocketFallsBackToTcpAndTheNextBindingTriesItAgain() throws Exception {
    Transports tr = new Transports();
    InProcessClientTest.FakeSidecar sidecar = new InProcessClientTest.FakeSidecar("s1");
    String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
    Path path = dir.resolve("sidecar-s1.sock");
    Server socket = serveSocket(sidecar, tr, path);
    InProcessClientTest.FakeAssigner assigner = new InProcessClientTest.FakeAssigner();
    try (DsClient client = client(assigner, address, "unix:" + path)) {
      fetchAndAck(client, sidecar, 10, "over the socket");
      socket.shutdownNow().awaitTermination(10, TimeUnit.SECONDS); // the socket dies; TCP serves
      fetchAndAck(client, sidecar, 12, "after the socket died");
      assertEquals(address, client.dials(address), "on TCP after UNAVAILABLE on the socket");

      serveSocket(sidecar, tr, path); // the sidecar serves its socket again
      assigner.pushes.add(binding(2, address, "unix:" + path));
      await("the next binding to move the client back to the socket",
          () -> ("unix:" + path).equals(client.dials(address)));
      fetchAndAck(client, sidecar, 14, "back on the socket");
    }
    assertEquals(List.of("unix Fetch (none)", "unix Ack (none)", "tcp Fetch (none)",
        "tcp Ack (none)", "unix Fetch (none)", "unix Ack (none)", "unix Nack (none)"), tr.calls);
  }

  /**
   * A sidecar whose every Stream, once opened, sends the next batch queued (waiting for one) and
   * nothing more: a batch queued after a stream died goes to the stream opened after it.
   */
  static final class OneBatchPerStream extends StreamServiceGrpc.StreamServiceImplBase {
    final BlockingQueue<RecordBatch> batches = new LinkedBlockingQueue<>();
    /** The response side of every Stream opened, in order (a test ends one with it). */
    final List<StreamObserver<StreamResponse>> opened = new CopyOnWriteArrayList<>();

    @Override
    public StreamObserver<StreamRequest> stream(StreamObserver<StreamResponse> response) {
      opened.add(response);
      Thread sender = new Thread(() -> {
        try {
          RecordBatch b = batches.poll(30, TimeUnit.SECONDS);
          if (b != null) {
            response.onNext(StreamResponse.newBuilder()
                .setBatch(StreamBatch.newBuilder().addBatches(b)).build());
          }
        } catch (InterruptedException | RuntimeException e) {
          // the stream ended (its socket died, the client closed): nothing more to send
        }
      }, "one-batch");
      return new StreamObserver<>() {
        @Override
        public void onNext(StreamRequest request) {
          if (request.hasOpen()) {
            sender.start();
          }
        }

        @Override
        public void onError(Throwable t) {
          sender.interrupt();
        }

        @Override
        public void onCompleted() {
          sender.interrupt();
          response.onCompleted();
        }
      };
    }
  }

  @Test
  void aStreamOverAFailedSocketIsOpenedAgainOverTcp() throws Exception {
    Transports tr = new Transports();
    OneBatchPerStream sidecar = new OneBatchPerStream();
    String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
    Path path = dir.resolve("sidecar-s1.sock");
    Server socket = serveSocket(sidecar, tr, path);
    try (DsClient client = client(new InProcessClientTest.FakeAssigner(), address,
        "unix:" + path)) {
      client.stream();
      sidecar.batches.add(batch(0, 1, 10, 11));
      assertEquals(2, client.poll(Duration.ofSeconds(20)).size(), "over the socket");
      socket.shutdownNow().awaitTermination(10, TimeUnit.SECONDS);
      sidecar.batches.add(batch(0, 1, 12, 13)); // for the stream opened after the socket died
      assertEquals(2, client.poll(Duration.ofSeconds(20)).size(), "after the socket died");
      assertEquals(address, client.dials(address));
    }
    assertEquals(List.of("unix Stream (none)", "tcp Stream (none)", "tcp Nack (none)"), tr.calls,
        "streams, then Nack(all) at close");
  }

  /**
   * Only UNAVAILABLE over the channel the sidecar dials now moves it off its socket: a stream
   * opened over TCP before a binding moved the client to the socket, ended UNAVAILABLE there, is
   * opened again over the socket, which the client keeps.
   */
  @Test
  void theEndOfAStreamOverAReplacedChannelLeavesTheSocketInUse() throws Exception {
    Transports tr = new Transports();
    OneBatchPerStream sidecar = new OneBatchPerStream();
    String address = "127.0.0.1:" + serveTcp(sidecar, tr).getPort();
    Path path = dir.resolve("sidecar-s1.sock"); // not served yet: the client starts on TCP
    InProcessClientTest.FakeAssigner assigner = new InProcessClientTest.FakeAssigner();
    try (DsClient client = client(assigner, address, "unix:" + path)) {
      assertEquals(address, client.dials(address));
      client.stream();
      // A batch received: gRPC no longer retries the stream by itself when it ends.
      sidecar.batches.add(batch(0, 1, 10, 11));
      assertEquals(2, client.poll(Duration.ofSeconds(20)).size(), "over TCP");
      serveSocket(sidecar, tr, path);
      assigner.pushes.add(binding(2, address, "unix:" + path));
      await("the binding to move the client to the socket",
          () -> ("unix:" + path).equals(client.dials(address)));
      sidecar.opened.get(0).onError(Status.UNAVAILABLE.withDescription("going away")
          .asRuntimeException()); // the stream over TCP ends UNAVAILABLE
      await("the stream opened again over the socket",
          () -> tr.calls.contains("unix Stream (none)"));
      assertEquals("unix:" + path, client.dials(address));
    }
    assertEquals(List.of("tcp Stream (none)", "unix Stream (none)", "unix Nack (none)"),
        tr.calls, "streams, then Nack(all) at close");
  }

  @Test
  void overTheSocketTheTokenIsSentPerCallWithoutTls() throws Exception {
    Transports tr = new Transports();
    Path path = dir.resolve("sidecar-s1.sock");
    serveSocket(new InProcessClientTest.FakeSidecar("s1"), tr, path);
    Path token = Files.writeString(dir.resolve("token"), "tok-1\n");
    // The CA is never read for the socket: the channel is plaintext, the token per call.
    Channels channels = new Channels(new Security(dir.resolve("no-ca.pem"), null, null, null,
        token));
    ManagedChannel channel = channels.openLocal(path);
    try {
      StreamServiceGrpc.newBlockingStub(channel).withDeadlineAfter(20, TimeUnit.SECONDS)
          .fetch(FetchRequest.getDefaultInstance());
    } finally {
      channel.shutdownNow();
    }
    assertEquals(List.of("unix Fetch Bearer tok-1"), tr.calls);
  }
}
