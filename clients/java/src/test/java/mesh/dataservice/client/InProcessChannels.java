package mesh.dataservice.client;

import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.ForwardingClientCallListener;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;

/**
 * Opens in-process channels by name, with the same service config as real ones.
 *
 * <p>grpc-java's in-process transport (1.83) hands a call its stream under the transport's lock
 * and starts it after: a channel shut down in between (the client dropping a sidecar that a fetch
 * on another thread is about to call) terminates the transport, and the stream's start then
 * throws {@code NullPointerException: scheduler} from the server side into the caller
 * ({@link InProcessChannelsTest} shows it). Netty's transport, the one the client uses, ends such
 * a call {@code UNAVAILABLE}; {@link #TERMINATED_AS_UNAVAILABLE} makes the in-process one do the
 * same, so the tests see what the client sees in production.
 */
final class InProcessChannels extends Channels {
  InProcessChannels() {
    super(Security.PLAINTEXT);
  }

  @Override
  public ManagedChannel open(String address) {
    return InProcessChannelBuilder.forName(address).defaultServiceConfig(serviceConfig())
        .enableRetry().intercept(TERMINATED_AS_UNAVAILABLE).build();
  }

  static final ClientInterceptor TERMINATED_AS_UNAVAILABLE = new ClientInterceptor() {
    @Override
    public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method,
        CallOptions options, Channel next) {
      return new StartedOrUnavailable<>(next.newCall(method, options));
    }
  };

  /** A call whose start racing its transport's end closes it UNAVAILABLE, once. */
  private static final class StartedOrUnavailable<Q, R>
      extends ForwardingClientCall.SimpleForwardingClientCall<Q, R> {
    private volatile boolean failed;

    StartedOrUnavailable(ClientCall<Q, R> call) {
      super(call);
    }

    @Override
    public void start(Listener<R> listener, Metadata headers) {
      try {
        super.start(new ForwardingClientCallListener.SimpleForwardingClientCallListener<>(
            listener) {
          @Override
          public void onClose(Status status, Metadata trailers) {
            if (!failed) {
              super.onClose(status, trailers);
            }
          }
        }, headers);
      } catch (NullPointerException e) {
        failed = true;
        listener.onClose(Status.UNAVAILABLE.withCause(e)
            .withDescription("in-process transport ended as the call started"), new Metadata());
      }
    }

    @Override
    public void request(int n) {
      if (!failed) {
        super.request(n);
      }
    }

    @Override
    public void sendMessage(Q message) {
      if (!failed) {
        super.sendMessage(message);
      }
    }

    @Override
    public void halfClose() {
      if (!failed) {
        super.halfClose();
      }
    }

    @Override
    public void cancel(String message, Throwable cause) {
      if (!failed) {
        super.cancel(message, cause);
      }
    }
  }
}
