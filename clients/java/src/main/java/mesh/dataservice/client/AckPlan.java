package mesh.dataservice.client;

import dataservice.sidecar.v1.Stream.RangeAck;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Turns the records an application acks into range acks, per sidecar that delivered them
 * (docs/client-protocol.md §8): one range per run of records delivered together and acked
 * together, so a whole batch is one range and a subset never covers a record not acked.
 */
public final class AckPlan {
  /** One range and the number of records it acks. */
  public record Range(RangeAck ack, int records, Object via) {}

  private AckPlan() {}

  /** The ranges of {@code records}, grouped by the address of the sidecar that delivered them. */
  public static Map<String, List<Range>> plan(List<DsRecord> records) {
    Map<DsRecord.Delivery, BitSet> acked = new IdentityHashMap<>();
    List<DsRecord.Delivery> order = new ArrayList<>();
    for (DsRecord r : records) {
      DsRecord.Delivery d = r.delivery();
      BitSet bits = acked.get(d);
      if (bits == null) {
        bits = new BitSet(d.offsets().length);
        acked.put(d, bits);
        order.add(d);
      }
      int index = java.util.Arrays.binarySearch(d.offsets(), r.offset());
      if (index < 0) {
        throw new IllegalArgumentException("record " + r.offset() + " not in its delivery");
      }
      bits.set(index);
    }
    Map<String, List<Range>> out = new LinkedHashMap<>();
    for (DsRecord.Delivery d : order) {
      BitSet bits = acked.get(d);
      long[] offsets = d.offsets();
      for (int from = bits.nextSetBit(0); from >= 0; ) {
        int to = bits.nextClearBit(from); // the run is [from, to) in delivery order
        RangeAck range = RangeAck.newBuilder().setTopic(d.topic()).setPartition(d.partition())
            .setFromOffset(offsets[from]).setToOffset(offsets[to - 1] + 1)
            .setLeaseEpoch(d.epoch()).build();
        out.computeIfAbsent(d.sidecar(), k -> new ArrayList<>())
            .add(new Range(range, to - from, d.via()));
        from = bits.nextSetBit(to);
      }
    }
    return out;
  }
}
