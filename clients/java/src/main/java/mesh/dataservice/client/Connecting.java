package mesh.dataservice.client;

import io.grpc.ConnectivityState;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Waits for a channel to finish connecting before a call's deadline starts. A JVM under load can
 * take seconds to open its first connection (class loading, TLS, the native transport); a 10 s
 * per-attempt deadline spent on that ends DEADLINE_EXCEEDED, which the protocol does not retry,
 * although the request was never sent. A channel that fails to connect answers the call
 * UNAVAILABLE by itself (retried as the protocol says).
 */
final class Connecting {
  /** The longest wait for a connection to be made, beyond the call's own deadline. */
  static final Duration MAX_WAIT = Duration.ofSeconds(30);

  private Connecting() {}

  /** Returns once {@code channel} is READY, failed, shut down, or after {@code max}. */
  static void await(ManagedChannel channel, Duration max) {
    long deadline = System.nanoTime() + max.toNanos();
    while (true) {
      ConnectivityState state = channel.getState(true);
      if (state != ConnectivityState.IDLE && state != ConnectivityState.CONNECTING) {
        return;
      }
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return;
      }
      CountDownLatch changed = new CountDownLatch(1);
      channel.notifyWhenStateChanged(state, changed::countDown);
      try {
        changed.await(left, TimeUnit.NANOSECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }
}
