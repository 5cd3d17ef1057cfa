package mesh.dataservice.client;

import java.util.ArrayList;
import java.util.List;

/**
 * The order in which one fetch pass asks the bound sidecars (docs/client-protocol.md §6): sorted
 * by address, the starting one moved on by one at each pass, so no sidecar is always first.
 */
public final class FetchRotation {
  private long pass;

  /** The order of the next pass over {@code addresses}. */
  public synchronized List<String> next(List<String> addresses) {
    List<String> sorted = new ArrayList<>(addresses);
    sorted.sort(null);
    if (sorted.isEmpty()) {
      return sorted;
    }
    int start = (int) (pass++ % sorted.size());
    List<String> out = new ArrayList<>(sorted.size());
    out.addAll(sorted.subList(start, sorted.size()));
    out.addAll(sorted.subList(0, start));
    return out;
  }
}
