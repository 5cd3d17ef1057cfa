package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dataservice.assigner.v1.Types.Binding;
import dataservice.assigner.v1.Types.SidecarEndpoint;
import java.util.List;
import org.junit.jupiter.api.Test;

/** Which bindings are applied (C13, C15, C16, C55) and the fetch rotation (C18). */
class BindingStateTest {
  static Binding binding(long version, String... addresses) {
    Binding.Builder b = Binding.newBuilder().setGroup("g").setClientId("c").setVersion(version);
    for (String a : addresses) {
      b.addEndpoints(SidecarEndpoint.newBuilder().setAddress(a).setSidecarId(a));
    }
    return b.build();
  }

  @Test
  void aLowerVersionIsIgnoredAndHigherOnesApplied() {
    BindingState state = new BindingState();
    assertTrue(state.offer(binding(3, "a"), false, 0));
    assertFalse(state.offer(binding(2, "b"), false, 0));
    assertEquals(3, state.version());
    assertTrue(state.offer(binding(4, "b"), false, 0));
    assertEquals("b", state.applied().getEndpoints(0).getAddress());
  }

  @Test
  void aWatchedVersion0IsAppliedWhateverTheVersionHeld() {
    BindingState state = new BindingState();
    assertTrue(state.offer(binding(7, "a"), false, 0));
    assertTrue(state.offer(binding(0, "b"), false, 0));
    assertEquals(0, state.version());
    assertEquals("b", state.applied().getEndpoints(0).getAddress());
  }

  @Test
  void aNewLeadersBindingIsTakenWhateverItsVersion() {
    BindingState state = new BindingState();
    assertTrue(state.offer(binding(9, "a"), false, 0));
    assertTrue(state.offer(binding(1, "a", "b"), true, 0));
    assertEquals(1, state.version());
    assertTrue(state.offer(binding(2, "b"), false, 0));
  }

  @Test
  void anEmptyBindingRightAfterALeaderChangeIsNotAppliedButItsVersionKept() {
    BindingState state = new BindingState();
    Binding old = binding(5, "a");
    assertTrue(state.offer(old, false, 0));
    long changed = 1_000_000_000L;
    assertTrue(state.offer(binding(0, "a"), true, changed));
    assertFalse(state.offer(binding(1), false, changed + 9_000_000_000L));
    assertEquals(1, state.version());
    assertEquals(1, state.applied().getEndpointsCount());
    // Past the grace, an empty binding is applied.
    assertTrue(state.offer(binding(2), false, changed + 10_000_000_001L));
    assertEquals(0, state.applied().getEndpointsCount());
  }

  @Test
  void anEmptyBindingWithoutALeaderChangeIsApplied() {
    BindingState state = new BindingState();
    assertTrue(state.offer(binding(1, "a"), false, 0));
    assertTrue(state.offer(binding(2), false, 1));
  }

  @Test
  void theRotationStartsOneFurtherAtEachPass() {
    FetchRotation rotation = new FetchRotation();
    List<String> bound = List.of("c:1", "a:1", "b:1");
    assertEquals(List.of("a:1", "b:1", "c:1"), rotation.next(bound));
    assertEquals(List.of("b:1", "c:1", "a:1"), rotation.next(bound));
    assertEquals(List.of("c:1", "a:1", "b:1"), rotation.next(bound));
    assertEquals(List.of("a:1", "b:1", "c:1"), rotation.next(bound));
    assertSame(0, rotation.next(List.of()).size());
  }
}
