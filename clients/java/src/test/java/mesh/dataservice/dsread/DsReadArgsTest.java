package mesh.dataservice.dsread;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * dsread's TLS flags (docs/client-protocol.md §16): what they build, and the combinations that
 * are bad arguments (exit 2: {@link DsRead#parse} throws IllegalArgumentException).
 */
class DsReadArgsTest {
  @TempDir
  Path dir;
  private String ca;
  private String cert;
  private String key;
  private String token;

  @BeforeEach
  void files() throws IOException {
    ca = Files.writeString(dir.resolve("ca.pem"), "ca").toString();
    cert = Files.writeString(dir.resolve("client.pem"), "cert").toString();
    key = Files.writeString(dir.resolve("client.key"), "key").toString();
    token = Files.writeString(dir.resolve("token"), "t").toString();
  }

  private static DsRead.Args mesh(String... extra) {
    List<String> argv = new ArrayList<>(List.of("--assigner", "localhost:1", "--group", "g",
        "--client-id", "c", "--expect", "1"));
    argv.addAll(List.of(extra));
    return DsRead.parse(argv.toArray(String[]::new));
  }

  private static String refused(String... argv) {
    return assertThrows(IllegalArgumentException.class, () -> DsRead.parse(argv)).getMessage();
  }

  @Test
  void withoutTlsFlagsTheMeshIsPlaintext() {
    assertFalse(mesh().security().tls());
  }

  @Test
  void theTlsFlagsBuildTheSecurityOfEveryChannel() {
    DsRead.Args args = mesh("--ca", ca, "--cert", cert, "--key", key, "--server-name", "mesh",
        "--token-file", token);
    assertTrue(args.security().tls());
    assertEquals(Path.of(ca), args.security().caFile());
    assertEquals(Path.of(cert), args.security().certFile());
    assertEquals(Path.of(key), args.security().keyFile());
    assertEquals("mesh", args.security().serverName());
    assertEquals(Path.of(token), args.security().tokenFile());
    DsRead.Args tlsOnly = mesh("--ca", ca);
    assertNull(tlsOnly.security().certFile());
    assertNull(tlsOnly.security().tokenFile());
  }

  @Test
  void theSidecarsGetTheSidecarTokenAndTheAssignerItsOwn() throws Exception {
    // Issue 37: tokens are scoped by audience; the sidecars' channels carry the sidecar token.
    String sidecar = Files.writeString(dir.resolve("sidecar-token"), "s").toString();
    DsRead.Args args = mesh("--ca", ca, "--token-file", token, "--sidecar-token-file", sidecar);
    assertEquals(Path.of(token), args.security().tokenFile());
    assertEquals(Path.of(sidecar), args.security().forSidecars().tokenFile());
    assertNull(args.security().forSidecars().sidecarTokenFile());
    DsRead.Args one = mesh("--ca", ca, "--token-file", token);
    assertEquals(Path.of(token), one.security().forSidecars().tokenFile());
    assertTrue(assertThrows(IllegalArgumentException.class,
        () -> mesh("--sidecar-token-file", sidecar)).getMessage()
        .contains("never sent over plaintext"));
  }

  @Test
  void aCertificateWithoutItsKeyOrTheKeyAloneIsRefused() {
    assertTrue(assertThrows(IllegalArgumentException.class,
        () -> mesh("--ca", ca, "--cert", cert)).getMessage().contains("both or neither"));
    assertThrows(IllegalArgumentException.class, () -> mesh("--ca", ca, "--key", key));
  }

  @Test
  void aTokenWithoutCaIsRefused() {
    assertTrue(assertThrows(IllegalArgumentException.class,
        () -> mesh("--token-file", token)).getMessage().contains("never sent over plaintext"));
  }

  @Test
  void aClientCertificateOrServerNameWithoutCaIsRefusedRatherThanIgnored() {
    assertThrows(IllegalArgumentException.class, () -> mesh("--cert", cert, "--key", key));
    assertThrows(IllegalArgumentException.class, () -> mesh("--server-name", "mesh"));
  }

  @Test
  void anUnreadableFileIsRefused() {
    assertTrue(assertThrows(IllegalArgumentException.class,
        () -> mesh("--ca", dir.resolve("missing.pem").toString())).getMessage()
        .contains("cannot read"));
  }

  @Test
  void tlsFlagsAreForTheMeshNotDirect() {
    for (String[] flag : List.of(new String[] {"--ca", ca}, new String[] {"--cert", cert},
        new String[] {"--key", key}, new String[] {"--server-name", "mesh"},
        new String[] {"--token-file", token})) {
      String message = refused("--direct", "--bootstrap", "localhost:9092", "--topic", "t",
          "--group", "g", "--expect", "1", flag[0], flag[1]);
      assertTrue(message.contains("TLS flags are for the mesh"), message);
    }
  }

  @Test
  void shareReadsAShareGroupDirectlyAndOnlyItIsStamped() {
    DsRead.Args share = DsRead.parse(new String[] {"--share", "--bootstrap", "localhost:9092",
        "--topic", "t", "--group", "g", "--expect", "5", "--stamped"});
    assertTrue(share.share());
    assertTrue(share.direct());
    assertTrue(share.stamped());
    assertEquals("localhost:9092", share.bootstrap());
    assertTrue(refused("--share", "--topic", "t", "--group", "g", "--expect", "1")
        .contains("--bootstrap is required"));
    assertTrue(refused("--share", "--direct", "--bootstrap", "b:1", "--topic", "t", "--group",
        "g", "--expect", "1").contains("one or the other"));
    assertTrue(refused("--direct", "--stamped", "--bootstrap", "b:1", "--topic", "t", "--group",
        "g", "--expect", "1").contains("--stamped is for --share"));
    assertTrue(refused("--share", "--ca", ca, "--bootstrap", "b:1", "--topic", "t", "--group",
        "g", "--expect", "1").contains("TLS flags are for the mesh"));
  }
}
