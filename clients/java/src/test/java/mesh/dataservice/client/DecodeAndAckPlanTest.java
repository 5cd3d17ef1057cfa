package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import com.google.protobuf.ByteString;
import dataservice.common.v1.Common;
import dataservice.sidecar.v1.Stream.RangeAck;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.Stream.RejectReason;
import dataservice.sidecar.v1.Stream.RejectedRangeAck;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Batch decoding (C22), the ranges of an ack (C29) and counting refused ranges (C31). */
class DecodeAndAckPlanTest {
  static ByteString longs(long... values) {
    ByteBuffer b = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
    for (long v : values) {
      b.putLong(v);
    }
    return ByteString.copyFrom(b.array());
  }

  static ByteString ints(int... values) {
    ByteBuffer b = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
    for (int v : values) {
      b.putInt(v);
    }
    return ByteString.copyFrom(b.array());
  }

  /** A batch of offsets 10, 11, 13 (12 compacted away): keys "a", null, "cc"; values "x", null, "". */
  static RecordBatch batch() {
    return RecordBatch.newBuilder().setTopic("t").setPartition(3).setLeaseEpoch(7)
        .setDeliveryCount(2).setOffsets(longs(10, 11, 13)).setTimestamps(longs(1000, -1, 1002))
        .setKeyLengths(ints(1, -1, 2)).setKeys(ByteString.copyFromUtf8("acc"))
        .setValueLengths(ints(1, -1, 0)).setValues(ByteString.copyFromUtf8("x"))
        .addHeaders(dataservice.sidecar.v1.Stream.RecordBatchHeaders.newBuilder().setIndex(2)
            .addHeaders(Common.Header.newBuilder().setKey("h")
                .setValue(ByteString.copyFromUtf8("v"))))
        .build();
  }

  @Test
  void aBatchDecodesToItsRecordsWithTheBatchEpoch() {
    List<DsRecord> records = BatchDecoder.decode(batch(), "s1:1", null);
    assertEquals(3, records.size());
    DsRecord a = records.get(0);
    assertEquals(10, a.offset());
    assertEquals(1000, a.timestampMs());
    assertArrayEquals("a".getBytes(StandardCharsets.UTF_8), a.key());
    assertArrayEquals("x".getBytes(StandardCharsets.UTF_8), a.value());
    DsRecord b = records.get(1);
    assertNull(b.key());
    assertNull(b.value());
    assertEquals(-1, b.timestampMs());
    DsRecord c = records.get(2);
    assertEquals(13, c.offset());
    assertArrayEquals("cc".getBytes(StandardCharsets.UTF_8), c.key());
    assertArrayEquals(new byte[0], c.value());
    assertEquals("h", c.headers().get(0).getKey());
    for (DsRecord r : records) {
      assertEquals(7, r.leaseEpoch());
      assertEquals(2, r.deliveryCount());
      assertEquals("s1:1", r.delivery().sidecar());
    }
  }

  @Test
  void noKeyLengthsMeansEveryKeyIsNull() {
    RecordBatch b = RecordBatch.newBuilder().setTopic("t").setOffsets(longs(5))
        .setValueLengths(ints(2)).setValues(ByteString.copyFromUtf8("hi")).build();
    DsRecord r = BatchDecoder.decode(b, "s", null).get(0);
    assertNull(r.key());
    assertEquals(-1, r.timestampMs());
  }

  @Test
  void recordMessagesOfAnOlderSidecarAreAccepted() {
    Common.Record r = Common.Record.newBuilder().setTopic("t").setPartition(1).setOffset(4)
        .setValue(ByteString.copyFromUtf8("v")).setLeaseEpoch(3).setDeliveryCount(1).build();
    DsRecord d = BatchDecoder.decode(List.of(r), "s", null).get(0);
    assertEquals(4, d.offset());
    assertNull(d.key());
    assertEquals(3, d.leaseEpoch());
  }

  @Test
  void aWholeBatchIsAckedByOneRangeFromFirstToLastPlusOne() {
    List<DsRecord> records = BatchDecoder.decode(batch(), "s1:1", null);
    Map<String, List<AckPlan.Range>> plan = AckPlan.plan(records);
    assertEquals(List.of("s1:1"), List.copyOf(plan.keySet()));
    List<AckPlan.Range> ranges = plan.get("s1:1");
    assertEquals(1, ranges.size());
    RangeAck r = ranges.get(0).ack();
    assertEquals(10, r.getFromOffset());
    assertEquals(14, r.getToOffset());
    assertEquals(7, r.getLeaseEpoch());
    assertEquals(3, ranges.get(0).records());
  }

  @Test
  void aSubsetIsAckedAsRunsThatCoverExactlyTheAckedRecords() {
    List<DsRecord> records = BatchDecoder.decode(batch(), "s1:1", null);
    List<AckPlan.Range> ranges = AckPlan.plan(List.of(records.get(0), records.get(2)))
        .get("s1:1");
    assertEquals(2, ranges.size());
    assertEquals(10, ranges.get(0).ack().getFromOffset());
    assertEquals(11, ranges.get(0).ack().getToOffset());
    assertEquals(13, ranges.get(1).ack().getFromOffset());
    assertEquals(14, ranges.get(1).ack().getToOffset());
    // Records 11 and 13 are adjacent in the delivery (12 was never delivered): one range.
    List<AckPlan.Range> tail = AckPlan.plan(records.subList(1, 3)).get("s1:1");
    assertEquals(1, tail.size());
    assertEquals(11, tail.get(0).ack().getFromOffset());
    assertEquals(14, tail.get(0).ack().getToOffset());
  }

  @Test
  void acksGoToTheSidecarThatDeliveredEachRecord() {
    List<DsRecord> one = BatchDecoder.decode(batch(), "old:1", null);
    List<DsRecord> two = BatchDecoder.decode(batch().toBuilder().setLeaseEpoch(8).build(),
        "new:1", null);
    Map<String, List<AckPlan.Range>> plan = AckPlan.plan(
        java.util.stream.Stream.concat(one.stream(), two.stream()).toList());
    assertEquals(7, plan.get("old:1").get(0).ack().getLeaseEpoch());
    assertEquals(8, plan.get("new:1").get(0).ack().getLeaseEpoch());
  }

  @Test
  void recordsOfRefusedRangesAreNotCounted() {
    List<DsRecord> records = BatchDecoder.decode(batch(), "s1:1", null);
    List<AckPlan.Range> ranges = AckPlan.plan(List.of(records.get(0), records.get(2)))
        .get("s1:1");
    RejectedRangeAck refused = RejectedRangeAck.newBuilder().setAck(ranges.get(1).ack())
        .setReason(RejectReason.REJECT_REASON_STALE_EPOCH).build();
    assertEquals(1, DsClient.acceptedOf(ranges, List.of(refused)));
    assertEquals(2, DsClient.acceptedOf(ranges, List.of()));
  }
}
