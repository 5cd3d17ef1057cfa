package mesh.dataservice.dsread;

import io.grpc.Status;
import java.io.PrintStream;
import java.time.Duration;
import java.util.List;
import mesh.dataservice.client.DsClient;
import mesh.dataservice.client.DsClientException;
import mesh.dataservice.client.DsRecord;

/** dsread through the mesh: bind, read (fetch or stream), print, ack each batch explicitly. */
final class MeshRead {
  private MeshRead() {}

  static int run(DsRead.Args args, PrintStream out) {
    Tally tally = new Tally();
    DsClient client;
    try {
      client = DsClient.builder(args.group()).assigner(args.assigner())
          .clientId(args.clientId()).security(args.security()).build();
    } catch (DsClientException e) {
      return terminal(e);
    }
    try {
      if (args.mode().equals("stream")) {
        client.stream();
      }
      while (tally.distinct() < args.expect()) {
        double left = args.idleExitSeconds() - tally.idleSeconds();
        if (left <= 0) {
          System.err.println("error DEADLINE_EXCEEDED idle");
          client.close();
          return 4;
        }
        Duration wait = Duration.ofMillis((long) (Math.min(left, 1.0) * 1000));
        List<DsRecord> batch = args.mode().equals("stream") ? client.poll(wait)
            : client.fetch(wait);
        if (batch.isEmpty()) {
          continue;
        }
        for (DsRecord r : batch) {
          tally.receive(r.topic(), r.partition(), r.offset());
          if (!args.quiet()) {
            Tally.printRec(out, r.topic(), r.partition(), r.offset(), r.leaseEpoch(),
                r.deliveryCount());
          }
        }
        out.flush();
        tally.acked(client.ack(batch));
      }
      tally.printDone(out);
      client.close();
      return 0;
    } catch (DsClientException e) {
      client.close();
      return terminal(e);
    }
  }

  static int terminal(DsClientException e) {
    Status.Code code = e.code();
    System.err.println("error " + code.name() + " " + (e.reason().isEmpty() ? "-" : e.reason()));
    System.err.println(e.getMessage());
    return 3;
  }
}
