package mesh.dataservice.client;

import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * Keeps a failing channel's reconnect attempts at most 1 s apart (§5: 0.1 s growing to 1 s).
 * grpc-java has no public setting for its reconnect backoff (1 s growing by 1.6 to 120 s); what it
 * offers is {@link ManagedChannel#resetConnectBackoff()}, which makes a channel in
 * TRANSIENT_FAILURE connect again at once. While a channel stays in TRANSIENT_FAILURE this calls
 * it after 0.1 s, 0.2 s, 0.4 s, 0.8 s, then every 1 s; a channel that connects starts over.
 */
final class ReconnectPacer {
  /** The pauses between reconnect attempts: 0.1 s doubling to 1 s (not jittered upwards). */
  static final Backoff PAUSES = new Backoff(Duration.ofMillis(100), Duration.ofSeconds(1));

  private static final ScheduledExecutorService TIMER = Executors.newSingleThreadScheduledExecutor(
      r -> {
        Thread t = new Thread(r, "ds-reconnect");
        t.setDaemon(true);
        return t;
      });

  private final ManagedChannel channel;
  private int failures;

  private ReconnectPacer(ManagedChannel channel) {
    this.channel = channel;
  }

  /** Paces {@code channel}'s reconnects until it is shut down; returns it. */
  static ManagedChannel pace(ManagedChannel channel) {
    new ReconnectPacer(channel).watch(ConnectivityState.IDLE);
    return channel;
  }

  private void watch(ConnectivityState seen) {
    channel.notifyWhenStateChanged(seen, this::changed);
  }

  private synchronized void changed() {
    ConnectivityState now = channel.getState(false);
    if (now == ConnectivityState.SHUTDOWN) {
      return;
    }
    if (now == ConnectivityState.READY) {
      failures = 0;
    } else if (now == ConnectivityState.TRANSIENT_FAILURE && failures == 0) {
      schedule();
    }
    watch(now);
  }

  /** The next attempt; while the channel stays failed, the one after it. */
  private void schedule() {
    long pauseNanos = (long) (PAUSES.baseSeconds(failures++) * 1e9);
    TIMER.schedule(this::retry, pauseNanos, TimeUnit.NANOSECONDS);
  }

  private synchronized void retry() {
    if (channel.getState(false) != ConnectivityState.TRANSIENT_FAILURE) {
      failures = 0; // connecting, connected or shut down: the next failure starts over
      return;
    }
    channel.resetConnectBackoff();
    schedule();
  }
}
