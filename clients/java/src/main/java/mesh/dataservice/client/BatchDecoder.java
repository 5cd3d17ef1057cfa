package mesh.dataservice.client;

import com.google.protobuf.ByteString;
import dataservice.common.v1.Common;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.Stream.RecordBatchHeaders;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Decodes what a sidecar delivers into {@link DsRecord}s (docs/client-protocol.md §6): columnar
 * {@code RecordBatch}es (little-endian packed columns, length -1 = null) and the {@code Record}
 * messages of a sidecar that predates batches.
 */
public final class BatchDecoder {
  private BatchDecoder() {}

  /** The records of one batch, each carrying the batch's epoch and delivery count. */
  public static List<DsRecord> decode(RecordBatch batch, String sidecar, Object via) {
    long[] offsets = longs(batch.getOffsets());
    int n = offsets.length;
    long[] timestamps = batch.getTimestamps().isEmpty() ? null : longs(batch.getTimestamps());
    int[] valueLengths = ints(batch.getValueLengths());
    int[] keyLengths = batch.getKeyLengths().isEmpty() ? null : ints(batch.getKeyLengths());
    if (valueLengths.length != n || (keyLengths != null && keyLengths.length != n)
        || (timestamps != null && timestamps.length != n)) {
      throw new IllegalArgumentException("record batch of " + batch.getTopic() + "["
          + batch.getPartition() + "]: columns of different lengths");
    }
    Map<Integer, List<Map.Entry<String, byte[]>>> headers = new HashMap<>();
    for (RecordBatchHeaders h : batch.getHeadersList()) {
      headers.put(h.getIndex(), headerList(h.getHeadersList()));
    }
    DsRecord.Delivery delivery = new DsRecord.Delivery(sidecar, batch.getTopic(),
        batch.getPartition(), batch.getLeaseEpoch(), offsets, via);
    List<DsRecord> out = new ArrayList<>(n);
    ByteString keys = batch.getKeys();
    ByteString values = batch.getValues();
    int keyAt = 0;
    int valueAt = 0;
    for (int i = 0; i < n; i++) {
      byte[] key = null;
      if (keyLengths != null && keyLengths[i] >= 0) {
        key = keys.substring(keyAt, keyAt + keyLengths[i]).toByteArray();
        keyAt += keyLengths[i];
      }
      byte[] value = null;
      if (valueLengths[i] >= 0) {
        value = values.substring(valueAt, valueAt + valueLengths[i]).toByteArray();
        valueAt += valueLengths[i];
      }
      out.add(new DsRecord(batch.getTopic(), batch.getPartition(), offsets[i],
          timestamps == null ? -1 : timestamps[i], key, value, headers.getOrDefault(i, List.of()),
          batch.getLeaseEpoch(), batch.getDeliveryCount(), delivery));
    }
    return out;
  }

  /** Record messages (an older sidecar): each its own delivery. */
  public static List<DsRecord> decode(List<Common.Record> records, String sidecar, Object via) {
    List<DsRecord> out = new ArrayList<>(records.size());
    for (Common.Record r : records) {
      DsRecord.Delivery delivery = new DsRecord.Delivery(sidecar, r.getTopic(), r.getPartition(),
          r.getLeaseEpoch(), new long[] {r.getOffset()}, via);
      long ts = r.hasTimestamp()
          ? r.getTimestamp().getSeconds() * 1000 + r.getTimestamp().getNanos() / 1_000_000 : -1;
      out.add(new DsRecord(r.getTopic(), r.getPartition(), r.getOffset(), ts,
          r.hasKey() ? r.getKey().toByteArray() : null,
          r.hasValue() ? r.getValue().toByteArray() : null, headerList(r.getHeadersList()),
          r.getLeaseEpoch(), r.getDeliveryCount(), delivery));
    }
    return out;
  }

  private static List<Map.Entry<String, byte[]>> headerList(List<Common.Header> headers) {
    List<Map.Entry<String, byte[]>> out = new ArrayList<>(headers.size());
    for (Common.Header h : headers) {
      out.add(new AbstractMap.SimpleImmutableEntry<>(h.getKey(), h.getValue().toByteArray()));
    }
    return out;
  }

  static long[] longs(ByteString column) {
    if (column.size() % 8 != 0) {
      throw new IllegalArgumentException("int64 column of " + column.size() + " bytes");
    }
    long[] out = new long[column.size() / 8];
    column.asReadOnlyByteBuffer().order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(out);
    return out;
  }

  static int[] ints(ByteString column) {
    if (column.size() % 4 != 0) {
      throw new IllegalArgumentException("int32 column of " + column.size() + " bytes");
    }
    int[] out = new int[column.size() / 4];
    ByteBuffer buffer = column.asReadOnlyByteBuffer().order(ByteOrder.LITTLE_ENDIAN);
    buffer.asIntBuffer().get(out);
    return out;
  }
}
