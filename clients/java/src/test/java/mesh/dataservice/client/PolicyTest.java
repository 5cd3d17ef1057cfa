package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** Backoff (C7) and the call policy's decisions and budget (C4, C5, C6, C8). */
class PolicyTest {
  @Test
  void backoffDoublesFrom50msToItsMaximumOf2s() {
    double[] expected = {0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0};
    for (int n = 0; n < expected.length; n++) {
      assertEquals(expected[n], Backoff.CALLS.baseSeconds(n), 1e-9, "pause " + n);
    }
    assertEquals(2.0, Backoff.CALLS.baseSeconds(1000), 1e-9);
  }

  @Test
  void backoffJittersByHalfEitherWay() {
    for (int n = 0; n < 10; n++) {
      double base = Backoff.CALLS.baseSeconds(n);
      Duration low = Backoff.CALLS.pause(n, () -> 0.0);
      Duration high = Backoff.CALLS.pause(n, () -> 0.999_999);
      assertEquals(base * 0.5, low.toNanos() / 1e9, 1e-6);
      assertTrue(high.toNanos() / 1e9 < base * 1.5);
      assertTrue(high.toNanos() / 1e9 > base * 1.49);
    }
    assertEquals(0.1, Backoff.WATCH.baseSeconds(0), 1e-9);
    assertEquals(5.0, Backoff.WATCH.baseSeconds(10), 1e-9);
    assertEquals(2.0, Backoff.STREAM.baseSeconds(10), 1e-9);
  }

  @Test
  void decisions() {
    CallPolicy assigner = CallPolicy.assigner();
    CallPolicy sidecar = CallPolicy.sidecar();
    assertEquals(CallPolicy.Decision.RETRY,
        assigner.decide(1, Status.Code.UNAVAILABLE, "", "", "a:1"));
    assertEquals(CallPolicy.Decision.FOLLOW,
        assigner.decide(1, Status.Code.FAILED_PRECONDITION, "NOT_LEADER", "b:1", "a:1"));
    // NOT_LEADER naming the address called is an election as far as the client can tell.
    assertEquals(CallPolicy.Decision.RETRY,
        assigner.decide(1, Status.Code.FAILED_PRECONDITION, "NOT_LEADER", "a:1", "a:1"));
    assertEquals(CallPolicy.Decision.RETRY,
        assigner.decide(1, Status.Code.FAILED_PRECONDITION, "NOT_LEADER", "", "a:1"));
    assertEquals(CallPolicy.Decision.RAISE,
        sidecar.decide(1, Status.Code.FAILED_PRECONDITION, "NOT_LEADER", "", "a:1"));
    assertEquals(CallPolicy.Decision.RETRY,
        sidecar.decide(1, Status.Code.UNAVAILABLE, "KAFKA_UNAVAILABLE", "", "a:1"));
    for (Status.Code code : Status.Code.values()) {
      if (code != Status.Code.UNAVAILABLE) {
        assertEquals(CallPolicy.Decision.RAISE, assigner.decide(1, code, "GROUP_NOT_FOUND", "",
            "a:1"), code.name());
      }
    }
  }

  @Test
  void noAttemptPastTheBudgetOf8RedirectsIncluded() {
    CallPolicy policy = CallPolicy.assigner();
    assertEquals(8, policy.attempts());
    assertEquals(CallPolicy.Decision.RETRY, policy.decide(7, Status.Code.UNAVAILABLE, "", "", "a"));
    assertEquals(CallPolicy.Decision.RAISE, policy.decide(8, Status.Code.UNAVAILABLE, "", "", "a"));
    assertEquals(CallPolicy.Decision.RAISE,
        policy.decide(8, Status.Code.FAILED_PRECONDITION, "NOT_LEADER", "b", "a"));
  }
}
