package mesh.dataservice.client;

import java.time.Duration;
import java.util.function.DoubleSupplier;

/**
 * Exponential backoff with jitter: the n-th pause (n from 0) is {@code min(initial * 2^n, max)}
 * multiplied by a uniform draw from [0.5, 1.5) (docs/client-protocol.md §5, §3, §7).
 */
public final class Backoff {
  /** The call policy's pauses: 50 ms doubling to 2 s. */
  public static final Backoff CALLS = new Backoff(Duration.ofMillis(50), Duration.ofSeconds(2));
  /** Re-watching the binding: 0.1 s doubling to 5 s. */
  public static final Backoff WATCH = new Backoff(Duration.ofMillis(100), Duration.ofSeconds(5));
  /** Re-opening a sidecar's Stream: 0.1 s doubling to 2 s. */
  public static final Backoff STREAM = new Backoff(Duration.ofMillis(100), Duration.ofSeconds(2));

  private final double initialSeconds;
  private final double maxSeconds;

  public Backoff(Duration initial, Duration max) {
    this.initialSeconds = initial.toNanos() / 1e9;
    this.maxSeconds = max.toNanos() / 1e9;
  }

  /** The un-jittered n-th pause, in seconds. */
  public double baseSeconds(int n) {
    double base = initialSeconds * Math.pow(2, Math.min(n, 62));
    return Math.min(base, maxSeconds);
  }

  /** The n-th pause, jittered by {@code uniform} (a draw from [0, 1)). */
  public Duration pause(int n, DoubleSupplier uniform) {
    double seconds = baseSeconds(n) * (0.5 + uniform.getAsDouble());
    return Duration.ofNanos((long) (seconds * 1e9));
  }
}
