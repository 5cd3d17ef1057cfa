package mesh.dataservice.client;

import io.grpc.CallCredentials;
import io.grpc.Metadata;
import io.grpc.Status;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.util.concurrent.Executor;

/**
 * Adds {@code authorization: Bearer <token>} to every call, the token read from a file and read
 * again when the file changes (a rotated token is sent from the next call on).
 */
final class TokenCredentials extends CallCredentials {
  static final Metadata.Key<String> AUTHORIZATION =
      Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

  private final Path file;
  private FileTime readAt;
  private String token;

  TokenCredentials(Path file) {
    this.file = file;
  }

  /** The token now in the file (cached while its modification time stays the same). */
  synchronized String token() throws IOException {
    FileTime modified = Files.getLastModifiedTime(file);
    if (token == null || !modified.equals(readAt)) {
      token = Files.readString(file, StandardCharsets.UTF_8).strip();
      readAt = modified;
    }
    return token;
  }

  @Override
  public void applyRequestMetadata(RequestInfo info, Executor executor, MetadataApplier applier) {
    try {
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + token());
      applier.apply(headers);
    } catch (IOException e) {
      applier.fail(Status.UNAUTHENTICATED.withDescription("cannot read token file " + file)
          .withCause(e));
    }
  }
}
