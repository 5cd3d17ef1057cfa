package mesh.dataservice.dsread;

import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import mesh.dataservice.client.Security;

/**
 * The conformance reader (issue 20's contract, the same command line in every language):
 *
 * <pre>
 * dsread --assigner HOST:PORT --group GROUP --client-id ID --expect N
 *        [--mode fetch|stream] [--idle-exit-s S] [--quiet]
 *        [--ca FILE] [--cert FILE --key FILE] [--server-name NAME] [--token-file FILE]
 *        [--sidecar-token-file FILE]
 * dsread --direct --bootstrap HOST:PORT --topic T --group GROUP --expect N [--quiet]
 * dsread --share --bootstrap HOST:PORT --topic T --group GROUP --expect N [--quiet] [--stamped]
 * </pre>
 *
 * {@code --share} reads through a Kafka share group (KIP-932, {@link ShareRead}): the baseline
 * beside the mesh for per-record delivery; {@code --stamped} prints each record's latency from
 * its {@code seq:time_ns:} value (bench_pod_cost's producer) instead of its {@code rec} line.
 *
 * The TLS flags (mesh mode only, docs/client-protocol.md §16): {@code --ca} speaks TLS to the
 * assigner and every sidecar, verified with that CA; {@code --cert}/{@code --key} a client
 * certificate (mTLS), both or neither; {@code --server-name} the name checked in the servers'
 * certificates; {@code --token-file} a bearer token on every call, the file read again when it
 * changes, and only with {@code --ca} (a token is never sent over plaintext).
 *
 * Exit codes: 0 done, 2 bad arguments, 3 a terminal error ({@code error CODE REASON} on stderr),
 * 4 idle ({@code error DEADLINE_EXCEEDED idle}). Logs go to stderr, records to stdout.
 */
public final class DsRead {
  static final String USAGE = String.join("\n",
      "usage: dsread --assigner HOST:PORT --group GROUP --client-id ID --expect N",
      "              [--mode fetch|stream] [--idle-exit-s S] [--quiet]",
      "              [--ca FILE] [--cert FILE --key FILE] [--server-name NAME]"
          + " [--token-file FILE] [--sidecar-token-file FILE]",
      "       dsread --direct --bootstrap HOST:PORT --topic T --group GROUP --expect N [--quiet]",
      "       dsread --share --bootstrap HOST:PORT --topic T --group GROUP --expect N [--quiet]"
          + " [--stamped]");

  private static final Set<String> FLAGS = Set.of("--quiet", "--direct", "--share", "--stamped");
  private static final Set<String> VALUES = Set.of("--assigner", "--group", "--client-id",
      "--expect", "--mode", "--idle-exit-s", "--bootstrap", "--topic", "--ca", "--cert", "--key",
      "--server-name", "--token-file", "--sidecar-token-file");
  private static final List<String> TLS_FLAGS = List.of("--ca", "--cert", "--key",
      "--server-name", "--token-file", "--sidecar-token-file");

  /** Parsed arguments; {@code security} is the mesh's transport security (plaintext if none). */
  record Args(boolean direct, boolean share, boolean stamped, String assigner, String bootstrap, String topic, String group,
      String clientId, long expect, String mode, double idleExitSeconds, boolean quiet,
      Security security) {}

  /** Parses the command line; throws IllegalArgumentException with the reason when bad. */
  static Args parse(String[] argv) {
    Map<String, String> values = new HashMap<>();
    Set<String> flags = new java.util.HashSet<>();
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      String value = null;
      int eq = a.indexOf('=');
      if (a.startsWith("--") && eq > 0) {
        value = a.substring(eq + 1);
        a = a.substring(0, eq);
      }
      if (FLAGS.contains(a) && value == null) {
        flags.add(a);
      } else if (VALUES.contains(a)) {
        if (value == null) {
          if (i + 1 >= argv.length) {
            throw new IllegalArgumentException(a + " needs a value");
          }
          value = argv[++i];
        }
        values.put(a, value);
      } else {
        throw new IllegalArgumentException("unknown argument " + argv[i]);
      }
    }
    boolean share = flags.contains("--share");
    if (share && flags.contains("--direct")) {
      throw new IllegalArgumentException("--direct and --share: one or the other");
    }
    if (flags.contains("--stamped") && !share) {
      throw new IllegalArgumentException("--stamped is for --share");
    }
    boolean direct = share || flags.contains("--direct");
    List<String> required = direct
        ? List.of("--bootstrap", "--topic", "--group", "--expect")
        : List.of("--assigner", "--group", "--client-id", "--expect");
    for (String r : required) {
      if (!values.containsKey(r) || values.get(r).isBlank()) {
        throw new IllegalArgumentException(r + " is required");
      }
    }
    long expect = parseLong(values.get("--expect"), "--expect");
    if (expect < 1) {
      throw new IllegalArgumentException("--expect must be at least 1");
    }
    String mode = values.getOrDefault("--mode", "fetch");
    if (!mode.equals("fetch") && !mode.equals("stream")) {
      throw new IllegalArgumentException("--mode must be fetch or stream");
    }
    double idle = 60;
    if (values.containsKey("--idle-exit-s")) {
      try {
        idle = Double.parseDouble(values.get("--idle-exit-s"));
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("--idle-exit-s must be a number of seconds");
      }
      if (!(idle > 0)) {
        throw new IllegalArgumentException("--idle-exit-s must be positive");
      }
    }
    return new Args(direct, share, flags.contains("--stamped"), values.get("--assigner"), values.get("--bootstrap"),
        values.get("--topic"), values.get("--group"), values.get("--client-id"), expect, mode,
        idle, flags.contains("--quiet"), security(values, direct));
  }

  /** The TLS flags as a {@link Security}; bad combinations are bad arguments (exit 2). */
  private static Security security(Map<String, String> values, boolean direct) {
    for (String flag : TLS_FLAGS) {
      if (values.containsKey(flag)) {
        if (direct) {
          throw new IllegalArgumentException(flag + ": TLS flags are for the mesh, not --direct");
        }
        if (values.get(flag).isBlank()) {
          throw new IllegalArgumentException(flag + " needs a value");
        }
      }
    }
    if (values.containsKey("--cert") != values.containsKey("--key")) {
      throw new IllegalArgumentException("--cert and --key go together: both or neither");
    }
    if ((values.containsKey("--token-file") || values.containsKey("--sidecar-token-file"))
        && !values.containsKey("--ca")) {
      throw new IllegalArgumentException(
          "--token-file needs --ca: a token is never sent over plaintext");
    }
    if (!values.containsKey("--ca") && (values.containsKey("--cert")
        || values.containsKey("--server-name"))) {
      throw new IllegalArgumentException("--cert, --key and --server-name need --ca (TLS)");
    }
    return new Security(path(values, "--ca"), path(values, "--cert"), path(values, "--key"),
        values.get("--server-name"), path(values, "--token-file"),
        path(values, "--sidecar-token-file"));
  }

  private static Path path(Map<String, String> values, String flag) {
    String value = values.get(flag);
    if (value == null) {
      return null;
    }
    Path path = Path.of(value);
    if (!Files.isReadable(path)) {
      throw new IllegalArgumentException(flag + ": cannot read " + value);
    }
    return path;
  }

  private static long parseLong(String s, String name) {
    try {
      return Long.parseLong(s);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(name + " must be an integer");
    }
  }

  public static void main(String[] argv) {
    // Logs (gRPC's java.util.logging, Kafka's slf4j-simple) go to stderr, warnings and up.
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    java.util.logging.Logger.getLogger("").setLevel(java.util.logging.Level.WARNING);
    Args args;
    try {
      args = parse(argv);
    } catch (IllegalArgumentException e) {
      System.err.println("dsread: " + e.getMessage());
      System.err.println(USAGE);
      System.exit(2);
      return;
    }
    PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out),
        false, java.nio.charset.StandardCharsets.UTF_8);
    int code = args.share() ? ShareRead.run(args, out)
        : args.direct() ? DirectRead.run(args, out) : MeshRead.run(args, out);
    out.flush();
    System.exit(code);
  }
}
