package mesh.dataservice.client;

import io.grpc.ChannelCredentials;
import io.grpc.CompositeChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.TlsChannelCredentials;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.List;
import java.util.Map;

/**
 * Opens every channel of the client (assigner and sidecars) the same way: the security of §11,
 * and gRPC's own retry of UNAVAILABLE only, 4 attempts, 50 ms to 0.5 s (§5 layer 1).
 */
public class Channels {
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
    return builder.defaultServiceConfig(serviceConfig()).enableRetry().build();
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
