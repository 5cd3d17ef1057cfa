package mesh.dataservice.client;

import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.util.function.BooleanSupplier;
import java.util.function.Predicate;
import java.util.logging.Logger;

/**
 * Which target the client dials for a bound sidecar (docs/client-protocol.md §3,
 * {@code local_address}): its Unix domain socket in the pod, or its TCP address. The socket
 * when all of these hold, else TCP:
 *
 * <ul>
 *   <li>the binding names one (a {@code unix:PATH} or {@code unix://ABS_PATH} target);
 *   <li>the client can be told there: it has no client certificate, or it sends a token (a socket
 *       carries no certificate, so a caller known only by its certificate would be refused
 *       UNAUTHENTICATED there; it stays on TCP);
 *   <li>this JVM has the native transport that dials a socket (Netty's epoll, Linux);
 *   <li>the socket is one nobody but its owner could have put there ({@link #untrusted}), so the
 *       token goes to the sidecar and nobody else;
 *   <li>the socket file accepts a connection now (asked last: in another pod there is no such
 *       file, so a client never reaches a sidecar that is not its pod's).
 * </ul>
 *
 * The same rule as the Python client's ({@code clients/python/src/dsclient/transport.py}) and the Go
 * client's ({@code localsocket.go}). A call over the socket that fails UNAVAILABLE moves the
 * sidecar to TCP; the next binding naming the socket tries it again ({@link DsClient}).
 */
final class LocalSocket {
  static final String SCHEME = "unix:";
  private static final Logger LOG = Logger.getLogger(LocalSocket.class.getName());
  private static final int TYPE_MASK = 0170000;
  private static final int SOCKET_TYPE = 0140000;

  private LocalSocket() {}

  /** The file a {@code unix:} target names, or null for any other target (or an empty path). */
  static Path pathOf(String target) {
    if (target == null || !target.startsWith(SCHEME)) {
      return null;
    }
    String rest = target.substring(SCHEME.length());
    if (rest.startsWith("//")) {
      rest = rest.substring(2);
    }
    return rest.isEmpty() ? null : Path.of(rest);
  }

  /**
   * Whether a process accepts connections on the socket file {@code path} now. The connect does
   * not block: a Unix socket connects at once or not at all (a listener whose backlog is full
   * would hold a blocking connect; it counts as not accepting, as the Go client's 250 ms
   * timeout does).
   */
  static boolean acceptsNow(Path path) {
    try (SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX)) {
      channel.configureBlocking(false);
      return channel.connect(UnixDomainSocketAddress.of(path));
    } catch (IOException | UnsupportedOperationException e) {
      return false; // no such file, nobody listening (a killed sidecar's file), not permitted
    }
  }

  /**
   * Why the client must not send its token to the socket file {@code path}, or null when it may
   * (issue 37, finding 1): the file must be a socket, not a link, not writable by every user, in a
   * directory (not a link) that neither its group nor other users may write, owned by root, this
   * process's user or the socket's owner. Otherwise anyone who can write the directory (a
   * world-writable /tmp, a group-writable volume) could put a listener of their own there and
   * collect the tokens sent to it; the client dials TCP instead, where TLS checks who answers.
   * Reads metadata only (lstat). The Python client's rule ({@code local_socket.untrusted}).
   */
  static String untrusted(Path path) {
    Path dir = path.toAbsolutePath().getParent();
    try {
      int fileMode = (Integer) Files.getAttribute(path, "unix:mode", LinkOption.NOFOLLOW_LINKS);
      int dirMode = (Integer) Files.getAttribute(dir, "unix:mode", LinkOption.NOFOLLOW_LINKS);
      if ((fileMode & TYPE_MASK) != SOCKET_TYPE) {
        return path + " is not a socket";
      }
      if ((fileMode & 02) != 0) {
        return path + " is writable by every user";
      }
      if (!Files.isDirectory(dir, LinkOption.NOFOLLOW_LINKS)) {
        return dir + " is not a directory";
      }
      if ((dirMode & 022) != 0) {
        return dir + " is writable by users other than its owner (mode "
            + Integer.toOctalString(dirMode & 0777) + ")";
      }
      int fileUid = (Integer) Files.getAttribute(path, "unix:uid", LinkOption.NOFOLLOW_LINKS);
      int dirUid = (Integer) Files.getAttribute(dir, "unix:uid", LinkOption.NOFOLLOW_LINKS);
      int me = (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid");
      boolean dirOk = dirUid == 0 || dirUid == me || dirUid == fileUid;
      boolean fileOk = fileUid == 0 || fileUid == me || fileUid == dirUid;
      if (!dirOk || !fileOk) {
        return path + " and " + dir + " are owned by users " + fileUid + ", " + dirUid;
      }
      return null;
    } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
      return path + ": " + e;
    }
  }

  /**
   * Whether the client sends its calls (and its token) to the socket {@code path}: trusted
   * ({@link #untrusted}, else logged) and accepting now.
   */
  static boolean usable(Path path) {
    if (!Files.exists(path, LinkOption.NOFOLLOW_LINKS)) {
      return false; // no socket here (the sidecar is in another pod): TCP, nothing to say
    }
    String why = untrusted(path);
    if (why != null) {
      LOG.warning(() -> "not using the sidecar's socket, TCP instead: " + why);
      return false;
    }
    return acceptsNow(path);
  }

  /** Whether this JVM can dial a Unix domain socket with gRPC (Netty's native epoll). */
  static boolean nativeTransport() {
    return Epoll.isAvailable();
  }

  /**
   * {@code localAddress} when the client should dial the sidecar's socket (see the class), else
   * {@code address}. {@code nativeTransport} and {@code reachable} are asked only for a
   * {@code unix:} target the client can be told on, {@code reachable} last (a TCP-only binding
   * never loads the native library).
   */
  static String target(String address, String localAddress, Security security,
      BooleanSupplier nativeTransport, Predicate<Path> reachable) {
    Path path = pathOf(localAddress);
    if (path == null) {
      return address;
    }
    if (security.certFile() != null && security.tokenFile() == null) {
      return address; // known by its certificate only: it has no identity on the socket
    }
    if (!nativeTransport.getAsBoolean() || !reachable.test(path)) {
      return address;
    }
    return localAddress;
  }
}
