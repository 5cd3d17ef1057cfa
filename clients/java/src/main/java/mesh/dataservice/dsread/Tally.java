package mesh.dataservice.dsread;

import java.io.PrintStream;
import java.util.HashSet;
import java.util.Locale;
import java.util.Set;

/** dsread's accounting: distinct (topic, partition, offset) seen, records received, acked. */
final class Tally {
  private final Set<String> distinct = new HashSet<>();
  private long received;
  private long acked;
  private long first = -1;
  private long last = -1;
  private long lastNew = System.nanoTime();

  /** Counts one received record; true if it was not seen before. */
  boolean receive(String topic, int partition, long offset) {
    long now = System.nanoTime();
    if (first < 0) {
      first = now;
    }
    last = now;
    received++;
    boolean fresh = distinct.add(topic + "\u0000" + partition + "\u0000" + offset);
    if (fresh) {
      lastNew = now;
    }
    return fresh;
  }

  /** One {@code rec <topic> <partition> <offset> <epoch> <delivery_count>} line. */
  static void printRec(PrintStream out, String topic, int partition, long offset, long epoch,
      long deliveryCount) {
    out.append("rec ").append(topic).append(' ').append(String.valueOf(partition)).append(' ')
        .append(String.valueOf(offset)).append(' ').append(String.valueOf(epoch)).append(' ')
        .append(String.valueOf(deliveryCount)).append('\n');
  }

  /** A Kafka client's terminal error, as dsread reports it (exit 3). */
  static int kafkaFailed(RuntimeException e) {
    System.err.println("error UNAVAILABLE -");
    System.err.println(e);
    return 3;
  }

  void acked(long n) {
    acked += n;
  }

  long distinct() {
    return distinct.size();
  }

  /** Seconds since the last new record (or since start when none came). */
  double idleSeconds() {
    return (System.nanoTime() - lastNew) / 1e9;
  }

  void printDone(PrintStream out) {
    double seconds = first < 0 ? 0 : (last - first) / 1e9;
    out.printf(Locale.ROOT, "done distinct=%d received=%d acked=%d seconds=%.3f%n",
        distinct.size(), received, acked, seconds);
    out.flush();
  }
}
