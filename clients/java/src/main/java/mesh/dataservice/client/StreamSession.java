package mesh.dataservice.client;

import dataservice.sidecar.v1.Stream.RangeAck;
import dataservice.sidecar.v1.Stream.StreamAckResult;
import dataservice.sidecar.v1.Stream.StreamAcks;
import dataservice.sidecar.v1.Stream.StreamCredit;
import dataservice.sidecar.v1.Stream.StreamRequest;
import dataservice.sidecar.v1.Stream.StreamResponse;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.util.ArrayDeque;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;

/**
 * One opened {@code Stream} RPC to one sidecar (docs/client-protocol.md §7): sends credit and
 * acks on it, matches each {@code ack_result} to the acks sent, in order. When it ends, the acks
 * waiting for their answer fail (the caller sends them again with the Ack RPC).
 */
final class StreamSession implements StreamObserver<StreamResponse> {
  /** What a session hands to its owner. */
  interface Listener {
    void batch(StreamSession session, StreamResponse response);

    void ended(StreamSession session, Throwable error);
  }

  final String sidecar;
  private final Listener listener;
  private final ArrayDeque<CompletableFuture<StreamAckResult>> pending = new ArrayDeque<>();
  private ClientCallStreamObserver<StreamRequest> requests;
  private boolean open = true;

  StreamSession(String sidecar, Listener listener) {
    this.sidecar = sidecar;
    this.listener = listener;
  }

  /** Binds the request side once the call is started. */
  synchronized void start(StreamObserver<StreamRequest> requests, StreamRequest first) {
    this.requests = (ClientCallStreamObserver<StreamRequest>) requests;
    this.requests.onNext(first);
  }

  synchronized boolean isOpen() {
    return open;
  }

  /** Grants {@code records} more record credit. */
  synchronized void credit(int records) {
    if (open && records > 0) {
      requests.onNext(StreamRequest.newBuilder()
          .setCredit(StreamCredit.newBuilder().setRecords(records)).build());
    }
  }

  /** Sends acks; the future gets their ack_result, or fails when the stream ends first. */
  synchronized CompletableFuture<StreamAckResult> ack(List<RangeAck> ranges) {
    CompletableFuture<StreamAckResult> result = new CompletableFuture<>();
    if (!open) {
      result.completeExceptionally(new IllegalStateException("stream ended"));
      return result;
    }
    pending.add(result);
    requests.onNext(StreamRequest.newBuilder()
        .setAcks(StreamAcks.newBuilder().addAllRanges(ranges)).build());
    return result;
  }

  /** Cancels the stream (the client stops reading this sidecar). */
  void cancel() {
    ClientCallStreamObserver<StreamRequest> r;
    synchronized (this) {
      r = requests;
    }
    if (r != null) {
      r.cancel("client stops reading this sidecar", null);
    }
  }

  @Override
  public void onNext(StreamResponse response) {
    switch (response.getKindCase()) {
      case BATCH -> listener.batch(this, response);
      case ACK_RESULT -> {
        CompletableFuture<StreamAckResult> head;
        synchronized (this) {
          head = pending.poll();
        }
        if (head != null) {
          head.complete(response.getAckResult());
        }
      }
      default -> { } // nack results: this client nacks with the Nack RPC only
    }
  }

  @Override
  public void onError(Throwable error) {
    end(error);
  }

  @Override
  public void onCompleted() {
    end(null);
  }

  private void end(Throwable error) {
    synchronized (this) {
      open = false;
      IllegalStateException ended = new IllegalStateException("stream ended", error);
      for (CompletableFuture<StreamAckResult> f : pending) {
        f.completeExceptionally(ended);
      }
      pending.clear();
    }
    listener.ended(this, error);
  }

  /** Runs {@code action} with this session if it is open. */
  void ifOpen(Consumer<StreamSession> action) {
    if (isOpen()) {
      action.accept(this);
    }
  }
}
