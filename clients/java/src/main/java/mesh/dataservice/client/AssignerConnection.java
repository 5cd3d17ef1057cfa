package mesh.dataservice.client;

import dataservice.assigner.v1.BindingServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.logging.Logger;

/**
 * The client's connection to the assigner leader (docs/client-protocol.md §4, §5): one channel
 * to the current address, calls made under a {@link CallPolicy}, NOT_LEADER naming a leader
 * followed at once, elections and UNAVAILABLE waited out with backoff on the next known address.
 * {@link #generation()} grows at every switch, so the binding watch knows to re-bind.
 */
final class AssignerConnection implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(AssignerConnection.class.getName());

  private final Channels channels;
  private final List<String> known;
  private String current;
  private ManagedChannel channel;
  private long generation;
  private boolean closed;

  AssignerConnection(Channels channels, List<String> addresses) {
    if (addresses.isEmpty()) {
      throw new IllegalArgumentException("no assigner address");
    }
    this.channels = channels;
    this.known = new ArrayList<>(addresses);
    this.current = addresses.get(0);
    this.channel = channels.open(current);
  }

  synchronized String current() {
    return current;
  }

  synchronized long generation() {
    return generation;
  }

  synchronized BindingServiceGrpc.BindingServiceBlockingStub stub() {
    return BindingServiceGrpc.newBlockingStub(channel);
  }

  private synchronized ManagedChannel channel() {
    return channel;
  }

  /** Makes {@code address} current: a new channel, the old one closed. */
  synchronized void switchTo(String address) {
    if (closed || address.equals(current)) {
      return;
    }
    LOG.info(() -> "assigner: switching from " + current + " to " + address);
    ManagedChannel old = channel;
    current = address;
    channel = channels.open(address);
    generation++;
    if (!known.contains(address)) {
      known.add(address);
    }
    old.shutdownNow();
  }

  /** Moves on to the next configured address (an election, or the current one unreachable). */
  synchronized void next() {
    if (known.size() > 1) {
      switchTo(known.get((known.indexOf(current) + 1) % known.size()));
    }
  }

  /**
   * Calls {@code call} under {@code policy}, each attempt with {@code deadline}.
   *
   * @throws DsClientException when the policy surfaces the failure
   */
  <T> T call(CallPolicy policy, Duration deadline,
      Function<BindingServiceGrpc.BindingServiceBlockingStub, T> call) {
    int pauses = 0;
    for (int attempt = 1; ; attempt++) {
      String calling = current();
      Connecting.await(channel(), Connecting.MAX_WAIT);
      try {
        return call.apply(stub().withDeadlineAfter(deadline.toNanos(), TimeUnit.NANOSECONDS));
      } catch (StatusRuntimeException e) {
        Status.Code code = CallPolicy.codeOf(e);
        if (code == Status.Code.CANCELLED && !calling.equals(current())
            && attempt < policy.attempts()) {
          continue; // its channel was closed by a switch: call again on the new one
        }
        String leader = CallPolicy.leaderOf(e);
        switch (policy.decide(attempt, code, DsClientException.reasonOf(e), leader, calling)) {
          case FOLLOW -> switchTo(leader);
          case RETRY -> {
            sleep(Backoff.CALLS.pause(pauses++, ThreadLocalRandom.current()::nextDouble));
            next();
          }
          default -> throw DsClientException.of(e);
        }
      }
    }
  }

  static void sleep(Duration pause) {
    try {
      Thread.sleep(pause.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new DsClientException(Status.Code.CANCELLED, "", java.util.Map.of(),
          "interrupted", e);
    }
  }

  @Override
  public synchronized void close() {
    closed = true;
    channel.shutdownNow();
  }
}
