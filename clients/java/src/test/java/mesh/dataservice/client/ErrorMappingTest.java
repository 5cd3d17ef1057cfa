package mesh.dataservice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.google.protobuf.Any;
import com.google.rpc.Code;
import com.google.rpc.ErrorInfo;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/** Status + ErrorInfo to DsClientException (§10), ds-leader, and the security rules (§11). */
class ErrorMappingTest {
  static StatusRuntimeException failure(Code code, String reason, String message,
      Metadata trailers) {
    com.google.rpc.Status status = com.google.rpc.Status.newBuilder().setCode(code.getNumber())
        .setMessage(message).addDetails(Any.pack(ErrorInfo.newBuilder().setReason(reason)
            .setDomain("dataservice").putMetadata("group", "nope").build()))
        .build();
    return StatusProto.toStatusRuntimeException(status, trailers);
  }

  @Test
  void theReasonAndMetadataOfTheErrorInfoAreKept() {
    DsClientException e = DsClientException.of(
        failure(Code.NOT_FOUND, "GROUP_NOT_FOUND", "no group nope", new Metadata()));
    assertEquals(Status.Code.NOT_FOUND, e.code());
    assertEquals("GROUP_NOT_FOUND", e.reason());
    assertEquals("nope", e.metadata().get("group"));
    assertEquals("NOT_FOUND GROUP_NOT_FOUND: no group nope", e.getMessage());
  }

  @Test
  void aStatusWithoutErrorInfoHasNoReason() {
    DsClientException e = DsClientException.of(Status.UNAVAILABLE.withDescription("down")
        .asRuntimeException());
    assertEquals(Status.Code.UNAVAILABLE, e.code());
    assertEquals("", e.reason());
  }

  @Test
  void theLeaderIsReadFromTheDsLeaderTrailer() {
    Metadata trailers = new Metadata();
    trailers.put(CallPolicy.DS_LEADER, "10.0.0.2:50051");
    StatusRuntimeException e = failure(Code.FAILED_PRECONDITION, "NOT_LEADER", "standby",
        trailers);
    assertEquals("10.0.0.2:50051", CallPolicy.leaderOf(e));
    assertEquals("NOT_LEADER", DsClientException.reasonOf(e));
    assertEquals("", CallPolicy.leaderOf(Status.UNAVAILABLE.asRuntimeException()));
  }

  @Test
  void aTokenWithoutTlsIsRefused() {
    assertThrows(IllegalArgumentException.class,
        () -> new Security(null, null, null, null, Path.of("/tmp/token")));
    assertThrows(IllegalArgumentException.class,
        () -> new Security(Path.of("ca.pem"), Path.of("c.pem"), null, null, null));
  }

  @Test
  void aRotatedTokenIsSentFromTheNextCallOn() throws Exception {
    Path file = java.nio.file.Files.createTempFile("token", "");
    java.nio.file.Files.writeString(file, "one\n");
    TokenCredentials credentials = new TokenCredentials(file);
    assertEquals("one", credentials.token());
    java.nio.file.Files.writeString(file, "two");
    java.nio.file.Files.setLastModifiedTime(file,
        java.nio.file.attribute.FileTime.fromMillis(System.currentTimeMillis() + 5000));
    assertEquals("two", credentials.token());
  }

  @Test
  void aConnectionResetReportedUnknownIsReadAsUnavailable() {
    StatusRuntimeException reset = Status.UNKNOWN.withDescription("channel closed")
        .withCause(new java.nio.channels.ClosedChannelException()).asRuntimeException();
    assertEquals(Status.Code.UNAVAILABLE, CallPolicy.codeOf(reset));
    assertEquals(Status.Code.UNKNOWN,
        CallPolicy.codeOf(Status.UNKNOWN.withDescription("a server's answer").asRuntimeException()));
    assertEquals(Status.Code.NOT_FOUND, CallPolicy.codeOf(Status.NOT_FOUND.asRuntimeException()));
  }
}
