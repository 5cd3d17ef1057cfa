package mesh.dataservice.client;

import java.util.List;
import java.util.Map;

/**
 * One record delivered through the mesh. Key, value and timestamp are as in Kafka (null key or
 * value: a Kafka null; timestamp -1: none). {@code leaseEpoch} and {@code deliveryCount} come from
 * the sidecar that delivered it; acks go back to that sidecar under that epoch.
 */
public record DsRecord(String topic, int partition, long offset, long timestampMs, byte[] key,
    byte[] value, List<Map.Entry<String, byte[]>> headers, long leaseEpoch, int deliveryCount,
    Delivery delivery) {

  /** Where and how a run of records was delivered: the ack's destination. */
  public static final class Delivery {
    private final String sidecar;
    private final String topic;
    private final int partition;
    private final long epoch;
    private final long[] offsets;
    private final Object via;

    /**
     * @param sidecar address of the sidecar that delivered the records
     * @param offsets every offset delivered together, ascending (a batch, or one record)
     * @param via the Stream that carried them, or null for a Fetch
     */
    Delivery(String sidecar, String topic, int partition, long epoch, long[] offsets, Object via) {
      this.sidecar = sidecar;
      this.topic = topic;
      this.partition = partition;
      this.epoch = epoch;
      this.offsets = offsets;
      this.via = via;
    }

    public String sidecar() {
      return sidecar;
    }

    String topic() {
      return topic;
    }

    int partition() {
      return partition;
    }

    long epoch() {
      return epoch;
    }

    long[] offsets() {
      return offsets;
    }

    Object via() {
      return via;
    }
  }
}
