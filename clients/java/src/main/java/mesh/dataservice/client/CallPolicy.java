package mesh.dataservice.client;

import io.grpc.Metadata;
import io.grpc.Status;

/**
 * What to do with a failed attempt of a unary call (docs/client-protocol.md §4, §5): retry
 * UNAVAILABLE (and, at the assigner, NOT_LEADER while no leader is known) with backoff, follow
 * NOT_LEADER naming another leader at once, surface anything else. At most {@link #attempts}
 * attempts in all, a followed redirect included.
 */
public final class CallPolicy {
  /** Trailing metadata a standby assigner names the leader in. */
  public static final Metadata.Key<String> DS_LEADER =
      Metadata.Key.of("ds-leader", Metadata.ASCII_STRING_MARSHALLER);

  /** The protocol's budget of attempts per call. */
  public static final int DEFAULT_ATTEMPTS = 8;

  /** What the caller does next. */
  public enum Decision {
    /** Back off, then call again (on the next known address, for the assigner). */
    RETRY,
    /** Switch to the leader named in {@code ds-leader} and call again at once. */
    FOLLOW,
    /** Surface the failure to the application. */
    RAISE
  }

  private final int attempts;
  private final boolean waitElections;

  /**
   * @param attempts budget of attempts in all
   * @param waitElections whether NOT_LEADER without a leader is waited out (the assigner's calls)
   */
  public CallPolicy(int attempts, boolean waitElections) {
    this.attempts = attempts;
    this.waitElections = waitElections;
  }

  /** The policy of Bind and Unbind: 8 attempts, elections waited out. */
  public static CallPolicy assigner() {
    return new CallPolicy(DEFAULT_ATTEMPTS, true);
  }

  /** The policy of Ack and Nack: 8 attempts on UNAVAILABLE, no election waiting. */
  public static CallPolicy sidecar() {
    return new CallPolicy(DEFAULT_ATTEMPTS, false);
  }

  public int attempts() {
    return attempts;
  }

  /**
   * Decides after attempt {@code attempt} (1-based) failed.
   *
   * @param leader the {@code ds-leader} the failure named, or null/"" when none
   * @param current the address that was called
   */
  public Decision decide(int attempt, Status.Code code, String reason, String leader,
      String current) {
    Decision wanted = classify(code, reason, leader, current);
    if (wanted != Decision.RAISE && attempt >= attempts) {
      return Decision.RAISE;
    }
    return wanted;
  }

  private Decision classify(Status.Code code, String reason, String leader, String current) {
    if (code == Status.Code.UNAVAILABLE) {
      return Decision.RETRY;
    }
    if (code == Status.Code.FAILED_PRECONDITION && "NOT_LEADER".equals(reason)) {
      if (leader != null && !leader.isEmpty() && !leader.equals(current)) {
        return Decision.FOLLOW;
      }
      return waitElections ? Decision.RETRY : Decision.RAISE;
    }
    return Decision.RAISE;
  }

  /**
   * The status code of a failed call as the protocol reads it: a transport failure that gRPC
   * reports UNKNOWN (grpc-java's netty transport answers a call whose connection was reset, e.g.
   * by a kill -9 of the server, {@code UNKNOWN: channel closed} with the IOException as its cause)
   * is UNAVAILABLE: no server answered it.
   */
  public static Status.Code codeOf(Throwable error) {
    Status status = Status.fromThrowable(error);
    if (status.getCode() == Status.Code.UNKNOWN && status.getCause() instanceof java.io.IOException) {
      return Status.Code.UNAVAILABLE;
    }
    return status.getCode();
  }

  /** The {@code ds-leader} trailer of a failed call, or "" when it has none. */
  public static String leaderOf(Throwable error) {
    Metadata trailers = Status.trailersFromThrowable(error);
    if (trailers == null) {
      return "";
    }
    String leader = trailers.get(DS_LEADER);
    return leader == null ? "" : leader;
  }
}
