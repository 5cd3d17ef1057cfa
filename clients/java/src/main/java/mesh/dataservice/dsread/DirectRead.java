package mesh.dataservice.dsread;

import java.io.PrintStream;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * dsread --direct: Kafka's own KafkaConsumer, the benchmark's baseline. Subscribes to the topic in
 * the group from the earliest offset, counts N records, commits, exits. Its rec lines carry epoch
 * 0 and delivery count 1 (there are no leases outside the mesh).
 */
final class DirectRead {
  private DirectRead() {}

  static int run(DsRead.Args args, PrintStream out) {
    Properties props = new Properties();
    props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap());
    props.put(ConsumerConfig.GROUP_ID_CONFIG, args.group());
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
    Tally tally = new Tally();
    try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
      consumer.subscribe(List.of(args.topic()));
      while (tally.distinct() < args.expect()) {
        if (tally.idleSeconds() > args.idleExitSeconds()) {
          System.err.println("error DEADLINE_EXCEEDED idle");
          return 4;
        }
        ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
        if (records.isEmpty()) {
          continue;
        }
        for (ConsumerRecord<byte[], byte[]> r : records) {
          tally.receive(r.topic(), r.partition(), r.offset());
          if (!args.quiet()) {
            Tally.printRec(out, r.topic(), r.partition(), r.offset(), 0, 1);
          }
        }
        out.flush();
        consumer.commitSync();
        tally.acked(records.count());
      }
      tally.printDone(out);
      return 0;
    } catch (org.apache.kafka.common.KafkaException e) {
      return Tally.kafkaFailed(e);
    }
  }
}
