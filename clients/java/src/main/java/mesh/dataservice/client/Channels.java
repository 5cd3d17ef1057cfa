package mesh.dataservice.client;

import io.grpc.ChannelCredentials;
import io.grpc.CompositeChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.TlsChannelCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.netty.shaded.io.netty.util.concurrent.DefaultThreadFactory;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Opens every channel of the client (assigner and sidecars) the same way (§5's channel settings):
 * the security of §11; gRPC's own retry of UNAVAILABLE only, 4 attempts, 50 ms to 0.5 s (§5
 * layer 1); messages up to 64 MiB each way (grpc-java receives 4 MiB by default, less than one
 * Fetch answer may be); a keepalive ping every 20 s, also without calls, so that a dead peer is
 * noticed under an idle watch or stream; and reconnect attempts at most 1 s apart
 * ({@link ReconnectPacer}: grpc-java's own backoff grows to 120 s and cannot be set).
 */
public class Channels {
  /** The largest message sent or received: 64 MiB, as the servers allow. */
  public static final int MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
  /** A keepalive ping every 20 s (the servers accept one every 5 s). */
  public static final long KEEPALIVE_SECONDS = 20;

  private final Security security;

  public Channels(Security security) {
    this.security = security;
  }

  /** The service config of every channel: gRFC A6 retries of UNAVAILABLE only. */
  public static Map<String, Object> serviceConfig() {
    Map<String, Object> retry = Map.of(
        "maxAttempts", 4.0,
        "initialBackoff", "0.05s",
        "maxBackoff", "0.5s",
        "backoffMultiplier", 2.0,
        "retryableStatusCodes", List.of("UNAVAILABLE"));
    Map<String, Object> method = Map.of("name", List.of(Map.of()), "retryPolicy", retry);
    return Map.of("methodConfig", List.of(method));
  }

  /** A new channel to {@code host:port}. */
  public ManagedChannel open(String address) {
    ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(address, credentials());
    if (security.serverName() != null) {
      builder.overrideAuthority(security.serverName());
    }
    return ReconnectPacer.pace(configure(builder).build());
  }

  /**
   * A new channel to a sidecar's Unix domain socket {@code path} (§3, {@code local_address}):
   * the same settings as {@link #open}, no TLS (the bytes never leave the kernel; the sidecar
   * serves the socket with gRPC's local credentials, plaintext on the wire), and the bearer token
   * on every call as over TLS: the sidecar authorizes every call on the socket as on TCP. A
   * socket carries no client certificate ({@link LocalSocket} keeps a certificate-only client on
   * TCP). Needs Netty's native epoll ({@link LocalSocket#nativeTransport()}).
   */
  public ManagedChannel openLocal(Path path) {
    ChannelCredentials credentials = InsecureChannelCredentials.create();
    if (security.tokenFile() != null) {
      credentials = CompositeChannelCredentials.create(credentials,
          new TokenCredentials(security.tokenFile()));
    }
    NettyChannelBuilder builder = NettyChannelBuilder
        .forAddress(new DomainSocketAddress(path.toString()), credentials)
        .eventLoopGroup(SocketLoop.GROUP).channelType(EpollDomainSocketChannel.class)
        // gRPC sets SO_KEEPALIVE on every connection; a Unix socket has no such option, and
        // Netty would warn at every connect (the null removes it; the HTTP/2 keepalive stays).
        .withOption(ChannelOption.SO_KEEPALIVE, null)
        .overrideAuthority("localhost");
    return ReconnectPacer.pace(configure(builder).build());
  }

  /** The event loop of every socket channel: one daemon thread, made on first use. */
  private static final class SocketLoop {
    static final EventLoopGroup GROUP = new EpollEventLoopGroup(1,
        new DefaultThreadFactory("ds-uds", true));
  }

  /**
   * Applies the settings every channel shares to {@code builder}: the retry service config, the
   * message size limit and the keepalive. (grpc-java sends messages of any size; the limit it
   * has is on what it receives.)
   */
  public static ManagedChannelBuilder<?> configure(ManagedChannelBuilder<?> builder) {
    return builder.defaultServiceConfig(serviceConfig()).enableRetry()
        .maxInboundMessageSize(MAX_MESSAGE_BYTES)
        .keepAliveTime(KEEPALIVE_SECONDS, TimeUnit.SECONDS)
        .keepAliveTimeout(KEEPALIVE_SECONDS, TimeUnit.SECONDS)
        .keepAliveWithoutCalls(true);
  }

  private ChannelCredentials credentials() {
    if (!security.tls()) {
      return InsecureChannelCredentials.create();
    }
    try {
      TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder()
          .trustManager(security.caFile().toFile());
      if (security.certFile() != null) {
        tls.keyManager(security.certFile().toFile(), security.keyFile().toFile());
      }
      ChannelCredentials channel = tls.build();
      if (security.tokenFile() != null) {
        return CompositeChannelCredentials.create(channel,
            new TokenCredentials(security.tokenFile()));
      }
      return channel;
    } catch (IOException e) {
      throw new UncheckedIOException("cannot read the TLS files", e);
    }
  }
}
