package mesh.dataservice.dsread;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * dsread --share: a Kafka share group (KIP-932) read with Kafka's own KafkaShareConsumer, the
 * per-record delivery Kafka itself offers (acquisition locks, delivery counts), beside the mesh in
 * bench_pod_cost. Subscribes to the topic in the share group (which starts at the topic's end, the
 * share group default), acknowledges each batch with {@code commitSync()} (implicit
 * acknowledgement: every record of the last poll accepted, and waited for: the sidecar's guarantee,
 * a batch committed once acked), and exits after N distinct records, or at SIGTERM with its
 * {@code done} line. Its rec lines carry epoch 0 and the record's delivery count.
 *
 * <p>{@code --stamped} prints, instead of rec lines, {@code lat SEQ MS} per record: the time from
 * the {@code time_ns} in its {@code seq:time_ns:} value (bench_pod_cost's producer) to its
 * arrival, in milliseconds of the wall clock.
 */
final class ShareRead {
  private ShareRead() {}

  static int run(DsRead.Args args, PrintStream out) {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap());
    props.put(ConsumerConfig.GROUP_ID_CONFIG, args.group());
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    Tally tally = new Tally();
    AtomicBoolean stopping = new AtomicBoolean();
    Thread main = Thread.currentThread();
    try (KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props)) {
      // SIGTERM: end the poll, let this thread acknowledge what it holds and print its done line.
      Thread hook = new Thread(() -> {
        stopping.set(true);
        consumer.wakeup();
        try {
          main.join(10_000);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      });
      Runtime.getRuntime().addShutdownHook(hook);
      consumer.subscribe(List.of(args.topic()));
      while (!stopping.get() && tally.distinct() < args.expect()) {
        if (tally.idleSeconds() > args.idleExitSeconds()) {
          System.err.println("error DEADLINE_EXCEEDED idle");
          return 4;
        }
        ConsumerRecords<byte[], byte[]> records;
        try {
          records = consumer.poll(Duration.ofMillis(1000));
        } catch (WakeupException e) {
          break;
        }
        if (records.isEmpty()) {
          continue;
        }
        Instant now = Instant.now();
        long nowNs = now.getEpochSecond() * 1_000_000_000L + now.getNano();
        for (ConsumerRecord<byte[], byte[]> r : records) {
          tally.receive(r.topic(), r.partition(), r.offset());
          if (args.stamped()) {
            stamp(r.value(), nowNs, out);
          } else if (!args.quiet()) {
            Tally.printRec(out, r.topic(), r.partition(), r.offset(), 0,
                r.deliveryCount().orElse((short) 1));
          }
        }
        out.flush();
        try {
          consumer.commitSync();
        } catch (WakeupException e) {
          consumer.commitSync();
          stopping.set(true);
        }
        tally.acked(records.count());
      }
      tally.printDone(out);
      return 0;
    } catch (org.apache.kafka.common.KafkaException e) {
      return Tally.kafkaFailed(e);
    }
  }

  /** {@code lat SEQ MS} for a value {@code seq:time_ns:...}; nothing for any other value. */
  private static void stamp(byte[] value, long nowNs, PrintStream out) {
    if (value == null) {
      return;
    }
    String text = new String(value, 0, Math.min(value.length, 48), StandardCharsets.US_ASCII);
    String[] parts = text.split(":", 3);
    if (parts.length < 3) {
      return;
    }
    try {
      long seq = Long.parseLong(parts[0]);
      long sent = Long.parseLong(parts[1]);
      out.append("lat ").append(String.valueOf(seq)).append(' ')
          .append(String.format(java.util.Locale.ROOT, "%.3f", (nowNs - sent) / 1e6))
          .append('\n');
    } catch (NumberFormatException e) {
      // not a stamped value: counted, no latency
    }
  }
}
