package mesh.dataservice.client;

import com.google.rpc.ErrorInfo;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.util.Map;

/**
 * A failure the protocol says to surface to the application (docs/client-protocol.md §10): the
 * gRPC status code and the ErrorInfo reason and metadata of the mesh's answer. The cause is the
 * gRPC exception it came from.
 */
public final class DsClientException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The domain every mesh ErrorInfo carries. */
  public static final String DOMAIN = "dataservice";

  private final Status.Code code;
  private final String reason;
  private final Map<String, String> metadata;

  DsClientException(Status.Code code, String reason, Map<String, String> metadata, String message,
      Throwable cause) {
    super(message, cause);
    this.code = code;
    this.reason = reason;
    this.metadata = Map.copyOf(metadata);
  }

  /** Wraps a failed call: its status code, and the reason of the ErrorInfo in its details. */
  public static DsClientException of(Throwable error) {
    Status status = Status.fromThrowable(error);
    ErrorInfo info = errorInfo(error);
    String reason = info == null ? "" : info.getReason();
    Map<String, String> metadata = info == null ? Map.of() : info.getMetadataMap();
    String description = status.getDescription() == null ? "" : status.getDescription();
    return new DsClientException(status.getCode(), reason, metadata,
        status.getCode() + (reason.isEmpty() ? "" : " " + reason) + ": " + description, error);
  }

  /** The ErrorInfo among the status details of a failed call, or null when it has none. */
  static ErrorInfo errorInfo(Throwable error) {
    if (!(error instanceof StatusRuntimeException) && !(error instanceof StatusException)) {
      return null;
    }
    com.google.rpc.Status details = StatusProto.fromThrowable(error);
    if (details == null) {
      return null;
    }
    for (com.google.protobuf.Any any : details.getDetailsList()) {
      if (any.is(ErrorInfo.class)) {
        try {
          return any.unpack(ErrorInfo.class);
        } catch (com.google.protobuf.InvalidProtocolBufferException e) {
          return null;
        }
      }
    }
    return null;
  }

  /** The ErrorInfo reason of a failed call ("" when none). */
  static String reasonOf(Throwable error) {
    ErrorInfo info = errorInfo(error);
    return info == null ? "" : info.getReason();
  }

  /** The gRPC status code of the failure. */
  public Status.Code code() {
    return code;
  }

  /** The ErrorInfo reason (e.g. {@code GROUP_NOT_FOUND}), or "" when the status had none. */
  public String reason() {
    return reason;
  }

  /** The ErrorInfo metadata (e.g. {@code field} for INVALID_FIELD). */
  public Map<String, String> metadata() {
    return metadata;
  }
}
