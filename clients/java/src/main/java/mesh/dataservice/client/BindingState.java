package mesh.dataservice.client;

import dataservice.assigner.v1.Types.Binding;

/**
 * Which binding the client holds, and whether a new one is applied (docs/client-protocol.md §3):
 * a watched binding with a lower version than the one held is ignored (version 0 is applied, as
 * the Python client does); the binding a new leader's Bind answers is taken as is; an empty
 * binding within {@link #EMPTY_BINDING_GRACE_NANOS} of a leader change, while the client has
 * sidecars, is not applied but its version is recorded. Not thread-safe: the client guards it.
 */
public final class BindingState {
  /** 10 s: how long after a leader change an empty binding is not applied. */
  public static final long EMPTY_BINDING_GRACE_NANOS = 10_000_000_000L;

  private long version;
  private Binding applied;
  private long leaderChangedAt;
  private boolean leaderChanged;

  /** The version to pass as {@code known_version} (0: none yet). */
  public long version() {
    return version;
  }

  /** The binding applied last, or null before the first. */
  public Binding applied() {
    return applied;
  }

  /**
   * Offers a binding; returns true if it is to be applied now.
   *
   * @param fromNewLeader the answer of Bind on a leader the client just switched to
   * @param now {@link System#nanoTime()} now
   */
  public boolean offer(Binding binding, boolean fromNewLeader, long now) {
    if (fromNewLeader) {
      leaderChanged = true;
      leaderChangedAt = now;
    } else if (binding.getVersion() != 0 && binding.getVersion() < version) {
      return false;
    }
    if (binding.getEndpointsCount() == 0 && applied != null && applied.getEndpointsCount() > 0
        && leaderChanged && now - leaderChangedAt < EMPTY_BINDING_GRACE_NANOS) {
      version = binding.getVersion();
      return false;
    }
    version = binding.getVersion();
    applied = binding;
    return true;
  }
}
