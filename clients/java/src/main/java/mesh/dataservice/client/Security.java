package mesh.dataservice.client;

import java.nio.file.Path;

/**
 * Transport security of every channel (docs/client-protocol.md §11): plaintext, or TLS with the
 * mesh's CA, optionally a client certificate (mTLS), a server name override and a bearer token
 * file. A token without TLS is refused: a token is never sent in the clear.
 *
 * @param caFile the mesh's CA (PEM); null for plaintext
 * @param certFile client certificate for mTLS (PEM), or null
 * @param keyFile its private key (PKCS#8 PEM), or null
 * @param serverName name checked in the server certificate instead of the host, or null
 * @param tokenFile file holding the bearer token, re-read when it changes, or null
 * @param sidecarTokenFile the token sent to sidecars instead (its audience ds-sidecar: each
 *     service accepts only tokens minted for it, so a sidecar cannot replay what it receives at
 *     the assigner or the notifier), or null: tokenFile
 */
public record Security(Path caFile, Path certFile, Path keyFile, String serverName,
    Path tokenFile, Path sidecarTokenFile) {
  /** Plaintext, no token: the dev mesh on loopback. */
  public static final Security PLAINTEXT = new Security(null, null, null, null, null);

  /** The same token to every service. */
  public Security(Path caFile, Path certFile, Path keyFile, String serverName, Path tokenFile) {
    this(caFile, certFile, keyFile, serverName, tokenFile, null);
  }

  public Security {
    if ((tokenFile != null || sidecarTokenFile != null) && caFile == null) {
      throw new IllegalArgumentException(
          "a token is never sent over a plaintext channel: configure a CA file (TLS) with it");
    }
    if ((certFile == null) != (keyFile == null)) {
      throw new IllegalArgumentException("a client certificate needs its key, and the key its certificate");
    }
  }

  /** The settings of a channel to a sidecar: its token is sidecarTokenFile when one is set. */
  public Security forSidecars() {
    return sidecarTokenFile == null ? this
        : new Security(caFile, certFile, keyFile, serverName, sidecarTokenFile, null);
  }

  public boolean tls() {
    return caFile != null;
  }

  /**
   * TLS settings from the mesh's environment: DS_TLS__CA_FILE, __CERT_FILE, __KEY_FILE,
   * __SERVER_NAME, __TOKEN_FILE, __SIDECAR_TOKEN_FILE.
   */
  public static Security fromEnv() {
    return new Security(path("DS_TLS__CA_FILE"), path("DS_TLS__CERT_FILE"),
        path("DS_TLS__KEY_FILE"), blankToNull(System.getenv("DS_TLS__SERVER_NAME")),
        path("DS_TLS__TOKEN_FILE"), path("DS_TLS__SIDECAR_TOKEN_FILE"));
  }

  private static Path path(String name) {
    String value = blankToNull(System.getenv(name));
    return value == null ? null : Path.of(value);
  }

  private static String blankToNull(String value) {
    return value == null || value.isBlank() ? null : value;
  }
}
