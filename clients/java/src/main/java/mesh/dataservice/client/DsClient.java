package mesh.dataservice.client;

import dataservice.assigner.v1.Binding.BindRequest;
import dataservice.assigner.v1.Binding.UnbindRequest;
import dataservice.assigner.v1.Binding.WatchBindingRequest;
import dataservice.assigner.v1.Binding.WatchBindingResponse;
import dataservice.assigner.v1.Types;
import dataservice.sidecar.v1.Stream.AckRequest;
import dataservice.sidecar.v1.Stream.AckResponse;
import dataservice.sidecar.v1.Stream.DeliveryFormat;
import dataservice.sidecar.v1.Stream.FetchRequest;
import dataservice.sidecar.v1.Stream.FetchResponse;
import dataservice.sidecar.v1.Stream.NackRequest;
import dataservice.sidecar.v1.Stream.RangeAck;
import dataservice.sidecar.v1.Stream.RecordBatch;
import dataservice.sidecar.v1.Stream.RejectedRangeAck;
import dataservice.sidecar.v1.Stream.StreamAckResult;
import dataservice.sidecar.v1.Stream.StreamCredit;
import dataservice.sidecar.v1.Stream.StreamOpen;
import dataservice.sidecar.v1.Stream.StreamRequest;
import dataservice.sidecar.v1.Stream.StreamResponse;
import dataservice.sidecar.v1.StreamServiceGrpc;
import io.grpc.Context;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * Reads one group's records through the mesh, as docs/client-protocol.md says: binds through the
 * assigner (following its leader), watches the binding and follows rebinds by itself, fetches
 * (the fetch rotation) or streams (credits) from every bound sidecar, acks each record at the
 * sidecar that delivered it, and on {@link #close()} gives back what was not acked and unbinds.
 *
 * <pre>{@code
 * try (DsClient client = DsClient.builder("orders").assigner("localhost:50051").build()) {
 *   List<DsRecord> batch = client.fetch(Duration.ofSeconds(1));
 *   client.ack(batch);
 * }
 * }</pre>
 *
 * Failures the protocol surfaces (an unknown group, bad arguments, refused credentials) are
 * thrown as {@link DsClientException}; a killed sidecar, a rebind or an assigner failover are
 * handled inside.
 */
public final class DsClient implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(DsClient.class.getName());
  static final Duration UNARY_DEADLINE = Duration.ofSeconds(10);
  static final Duration CLOSE_DEADLINE = Duration.ofSeconds(2);
  static final Duration FETCH_EXTRA = Duration.ofSeconds(35);
  static final Duration STREAM_ACK_TIMEOUT = Duration.ofSeconds(10);
  static final int MAX_RANGES = 100_000;

  /**
   * One bound sidecar: its channel and, when streaming, its open Stream. {@code address} (TCP)
   * is its key (acks, streams) whatever the channel dials: {@code target}, the address or its
   * socket ({@code localAddress}, the {@code unix:} target the binding names, "" for none). The
   * channel changes when a call over the socket fails UNAVAILABLE (to TCP) and when a later
   * binding lets the client dial the socket again (§3); calls under way keep the channel they
   * started on ({@code retired}: it ends when they have, or with the sidecar). Fields but
   * {@code channel} are written under the client's lock.
   */
  private static final class Sidecar {
    final String address;
    String localAddress;
    String target;
    volatile ManagedChannel channel;
    final List<ManagedChannel> retired = new ArrayList<>();
    StreamSession session;
    ManagedChannel sessionChannel; // the channel the session was opened on
    int reopenFailures;

    Sidecar(String address, String localAddress, String target, ManagedChannel channel) {
      this.address = address;
      this.localAddress = localAddress;
      this.target = target;
      this.channel = channel;
    }

    boolean local() {
      return !target.equals(address);
    }

    /**
     * Calls the sidecar over {@code next} (dialing {@code to}) from now on. The channel replaced
     * takes no new call and ends once its calls have (shutdown), or with the sidecar.
     */
    void attach(ManagedChannel next, String to) {
      retired.removeIf(ManagedChannel::isTerminated);
      retired.add(channel);
      channel.shutdown();
      channel = next;
      target = to;
    }

    /** Closes every channel of the sidecar (calls on them end CANCELLED). */
    void shutdownNow() {
      for (ManagedChannel c : retired) {
        c.shutdownNow();
      }
      retired.clear();
      channel.shutdownNow();
    }
  }

  /** A streamed batch handed to the application, or the failure that ended a stream. */
  private record Delivered(List<DsRecord> records, StreamSession session,
      DsClientException error) {}

  private final String group;
  private final String clientId;
  private final int maxRecords;
  private final long maxBytes;
  private final Duration streamLinger;
  private final Channels channels;
  // Channels to sidecars: the sidecars' token (Security.sidecarTokenFile).
  private final Channels sidecarChannels;
  private final Security sidecarSecurity; // what a sidecar gets (LocalSocket.target)
  private final AssignerConnection assigner;
  private final BindingState state = new BindingState();
  private final FetchRotation rotation = new FetchRotation();
  private final Map<String, Sidecar> sidecars = new LinkedHashMap<>();
  private final BlockingQueue<Delivered> streamed = new LinkedBlockingQueue<>();
  private final Thread watcher;
  private volatile boolean streaming;
  private volatile boolean closed;
  private volatile DsClientException failure;
  private Context.CancellableContext watchContext;
  private long boundGeneration;

  private DsClient(Builder b) {
    this.group = b.group;
    this.clientId = b.clientId;
    this.maxRecords = b.maxRecords;
    this.maxBytes = b.maxBytes;
    this.streamLinger = b.streamLinger;
    this.channels = b.channels != null ? b.channels : new Channels(b.security);
    this.sidecarChannels =
        b.channels != null ? b.channels : new Channels(b.security.forSidecars());
    this.sidecarSecurity = b.security.forSidecars();
    this.assigner = new AssignerConnection(channels, b.assigners);
    try {
      Types.Binding binding = bind();
      synchronized (this) {
        boundGeneration = assigner.generation();
        if (state.offer(binding, false, System.nanoTime())) {
          apply(binding);
        }
      }
    } catch (RuntimeException e) {
      assigner.close();
      throw e;
    }
    this.watcher = new Thread(this::watchLoop, "ds-watch-" + group);
    watcher.setDaemon(true);
    watcher.start();
  }

  /** A builder for a client of {@code group}. */
  public static Builder builder(String group) {
    return new Builder(group);
  }

  /** Builds a {@link DsClient}. */
  public static final class Builder {
    private final String group;
    private List<String> assigners = List.of();
    private String clientId = "client-" + UUID.randomUUID().toString().replace("-", "")
        .substring(0, 12);
    private Security security = Security.PLAINTEXT;
    private int maxRecords = 500;
    private long maxBytes;
    private Duration streamLinger = Duration.ZERO;
    private Channels channels;

    private Builder(String group) {
      this.group = Objects.requireNonNull(group);
    }

    /** Assigner addresses ({@code host:port}), any replica; comma-separated accepted. */
    public Builder assigner(String... addresses) {
      List<String> all = new ArrayList<>();
      for (String a : addresses) {
        for (String part : a.split(",")) {
          if (!part.isBlank()) {
            all.add(part.strip());
          }
        }
      }
      this.assigners = all;
      return this;
    }

    /** This application instance's stable id (e.g. the pod name). */
    public Builder clientId(String clientId) {
      this.clientId = Objects.requireNonNull(clientId);
      return this;
    }

    /** TLS, mTLS and token settings (default plaintext). */
    public Builder security(Security security) {
      this.security = Objects.requireNonNull(security);
      return this;
    }

    /** Records per fetch, and the stream's credit window (default 500). */
    public Builder maxRecords(int maxRecords) {
      this.maxRecords = maxRecords;
      return this;
    }

    /**
     * Lets each sidecar hold a stream's next batch up to {@code linger} (at most 1 s) after
     * the last one unless a whole batch is buffered, so at low rates records share messages
     * and acks: less CPU for up to that much more latency while records keep coming. Zero
     * (the default): each batch at once. The protocol's {@code StreamOpen.linger}.
     */
    public Builder streamLinger(Duration linger) {
      if (linger.isNegative() || linger.compareTo(Duration.ofSeconds(1)) > 0) {
        throw new IllegalArgumentException("streamLinger must be between 0 and 1 s: " + linger);
      }
      this.streamLinger = linger;
      return this;
    }

    /** Bytes per fetch (0: the sidecar's default, 1 MiB). */
    public Builder maxBytes(long maxBytes) {
      this.maxBytes = maxBytes;
      return this;
    }

    /** How channels are opened (tests: in-process channels). */
    Builder channels(Channels channels) {
      this.channels = channels;
      return this;
    }

    /**
     * Binds and starts watching the binding.
     *
     * @throws DsClientException when Bind is refused (e.g. NOT_FOUND / GROUP_NOT_FOUND) or the
     *     assigner cannot be reached within the call policy's 8 attempts
     */
    public DsClient build() {
      return new DsClient(this);
    }
  }

  public String clientId() {
    return clientId;
  }

  public String group() {
    return group;
  }

  /** The addresses of the sidecars bound now, sorted. */
  public synchronized List<String> boundSidecars() {
    List<String> out = new ArrayList<>(sidecars.keySet());
    out.sort(null);
    return out;
  }

  /** What the channel to the bound sidecar at {@code address} dials now, or null (tests). */
  synchronized String dials(String address) {
    Sidecar s = sidecars.get(address);
    return s == null ? null : s.target;
  }

  // ---- binding --------------------------------------------------------------------------

  private Types.Binding bind() {
    return assigner.call(CallPolicy.assigner(), UNARY_DEADLINE, stub -> stub.bind(
        BindRequest.newBuilder().setClientId(clientId).setGroup(group).build()).getBinding());
  }

  /**
   * Opens channels to new sidecars, closes those no longer named, and chooses again the target
   * of a sidecar on TCP whose binding names a socket (it may serve again: a restarted sidecar)
   * or whose socket the binding changed (§3). Caller holds the lock.
   */
  private void apply(Types.Binding binding) {
    Map<String, String> named = new HashMap<>();
    for (Types.SidecarEndpoint e : binding.getEndpointsList()) {
      named.put(e.getAddress(), e.getLocalAddress());
    }
    for (Iterator<Sidecar> it = sidecars.values().iterator(); it.hasNext(); ) {
      Sidecar s = it.next();
      if (!named.containsKey(s.address)) {
        it.remove();
        LOG.info(() -> "binding v" + binding.getVersion() + ": sidecar " + s.address + " left");
        if (s.session != null) {
          s.session.cancel();
        }
        s.shutdownNow();
      }
    }
    for (Map.Entry<String, String> e : named.entrySet()) {
      String address = e.getKey();
      String local = e.getValue();
      Sidecar s = sidecars.get(address);
      if (s == null) {
        String target = target(address, local);
        Sidecar joined = new Sidecar(address, local, target, open(address, target));
        sidecars.put(address, joined);
        LOG.info(() -> "binding v" + binding.getVersion() + ": sidecar " + address + " joined"
            + (joined.local() ? " (over its socket " + target + ")" : ""));
        if (streaming) {
          openStream(joined);
        }
      } else if (!local.equals(s.localAddress) || (!local.isEmpty() && !s.local())) {
        s.localAddress = local;
        String target = target(address, local);
        if (!target.equals(s.target)) {
          s.attach(open(address, target), target);
          LOG.info(() -> "sidecar " + address + " now over " + target);
        }
      }
    }
    notifyAll();
  }

  /** What the client dials for the sidecar at {@code address}: its socket or its address. */
  private String target(String address, String localAddress) {
    return LocalSocket.target(address, localAddress, sidecarSecurity, LocalSocket::nativeTransport,
        LocalSocket::usable);
  }

  /** A channel to the sidecar at {@code address} over {@code target}. */
  private ManagedChannel open(String address, String target) {
    return target.equals(address) ? sidecarChannels.open(address)
        : sidecarChannels.openLocal(LocalSocket.pathOf(target));
  }

  /**
   * A call to {@code s} over {@code used} failed with {@code code}: after UNAVAILABLE over its
   * socket (the channel it dials now), the sidecar
   * is called over TCP from the next call on (its socket is gone: a killed or restarted sidecar
   * leaves its file, while its TCP address may still serve); the next binding naming the socket
   * tries it again (§3).
   */
  private synchronized void fallBack(Sidecar s, ManagedChannel used, Status.Code code) {
    if (code != Status.Code.UNAVAILABLE || closed || sidecars.get(s.address) != s || !s.local()
        || s.channel != used) {
      return; // not over the socket, or over a channel already replaced (its end says nothing)
    }
    s.attach(sidecarChannels.open(s.address), s.address);
    LOG.info(() -> "sidecar " + s.address + ": socket unavailable; over TCP until a binding"
        + " names it again");
  }

  private void offer(Types.Binding binding, boolean fromNewLeader) {
    synchronized (this) {
      if (closed) {
        return;
      }
      if (state.offer(binding, fromNewLeader, System.nanoTime())) {
        apply(binding);
      }
    }
  }

  private static boolean terminal(StatusRuntimeException e) {
    Status.Code code = CallPolicy.codeOf(e);
    return code == Status.Code.NOT_FOUND || code == Status.Code.INVALID_ARGUMENT
        || code == Status.Code.PERMISSION_DENIED || code == Status.Code.UNAUTHENTICATED;
  }

  /** The binding watch (§3), on its own thread until close. */
  private void watchLoop() {
    int failures = 0;
    while (!closed) {
      if (assigner.generation() != boundGeneration) {
        long generation = assigner.generation();
        try {
          Types.Binding binding = bind(); // the new leader's binding, taken as is
          boundGeneration = generation;
          offer(binding, true);
          failures = 0;
        } catch (DsClientException e) {
          if (closed) {
            return;
          }
          if (e.getCause() instanceof StatusRuntimeException s && terminal(s)) {
            failure = e;
            return;
          }
          sleepQuietly(Backoff.WATCH.pause(failures++, ThreadLocalRandom.current()::nextDouble));
          continue;
        }
      }
      StatusRuntimeException ended = null;
      Context.CancellableContext context = Context.current().withCancellation();
      synchronized (this) {
        if (closed) {
          return;
        }
        watchContext = context;
      }
      long known = state();
      try {
        Context previous = context.attach();
        try {
          Iterator<WatchBindingResponse> it = assigner.stub().watchBinding(
              WatchBindingRequest.newBuilder().setClientId(clientId).setGroup(group)
                  .setKnownVersion(known).build());
          while (it.hasNext()) {
            offer(it.next().getBinding(), false);
            failures = 0;
          }
        } finally {
          context.detach(previous);
        }
      } catch (StatusRuntimeException e) {
        ended = e;
      } finally {
        context.cancel(null);
      }
      if (closed) {
        return;
      }
      String leader = ended == null ? "" : CallPolicy.leaderOf(ended);
      if (ended != null && terminal(ended)) {
        failure = DsClientException.of(ended);
        LOG.warning(() -> "binding watch refused: " + failure.getMessage());
        return;
      }
      if (!leader.isEmpty() && !leader.equals(assigner.current())) {
        assigner.switchTo(leader); // the next pass re-binds there at once
        continue;
      }
      String why = ended == null ? "ended" : CallPolicy.codeOf(ended) + " "
          + DsClientException.reasonOf(ended);
      LOG.fine(() -> "binding watch " + why + "; watching again");
      sleepQuietly(Backoff.WATCH.pause(failures++, ThreadLocalRandom.current()::nextDouble));
      if (ended != null && (CallPolicy.codeOf(ended) == Status.Code.UNAVAILABLE
          || "NOT_LEADER".equals(DsClientException.reasonOf(ended)))) {
        assigner.next(); // an election or an unreachable replica: try the next address
      }
    }
  }

  private synchronized long state() {
    return state.version();
  }

  private void sleepQuietly(Duration pause) {
    try {
      Thread.sleep(pause.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private void checkFailure() {
    DsClientException f = failure;
    if (f != null) {
      throw f;
    }
    if (closed) {
      throw new IllegalStateException("client closed");
    }
  }

  // ---- fetch ----------------------------------------------------------------------------

  /**
   * Long-polls the bound sidecars for up to {@code maxWait} (§6): sweeps them with max_wait 0,
   * then long-polls the last of the rotation; returns the first non-empty batch (the records of
   * one sidecar), or an empty list once {@code maxWait} is used up.
   */
  public List<DsRecord> fetch(Duration maxWait) {
    long deadline = System.nanoTime() + maxWait.toNanos();
    while (true) {
      checkFailure();
      List<String> order = rotation.next(boundSidecars());
      long left = deadline - System.nanoTime();
      if (order.isEmpty()) {
        if (left <= 0) {
          return List.of();
        }
        awaitBindingChange(Math.min(left, TimeUnit.MILLISECONDS.toNanos(100)));
        continue;
      }
      String lastAnswered = null;
      if (order.size() > 1) {
        for (String address : order) {
          List<DsRecord> got = fetchFrom(address, Duration.ZERO);
          if (got == null) {
            continue; // skipped for this sweep
          }
          if (!got.isEmpty()) {
            return got;
          }
          lastAnswered = address;
        }
      } else {
        lastAnswered = order.get(0);
      }
      left = deadline - System.nanoTime();
      if (left <= 0) {
        return List.of();
      }
      if (lastAnswered == null) { // every sidecar failed: wait for the assigner's new binding
        awaitBindingChange(Math.min(left, TimeUnit.MILLISECONDS.toNanos(100)));
        continue;
      }
      List<DsRecord> got = fetchFrom(lastAnswered, Duration.ofNanos(left));
      if (got != null && !got.isEmpty()) {
        return got;
      }
      if (got == null) {
        awaitBindingChange(Math.min(deadline - System.nanoTime(),
            TimeUnit.MILLISECONDS.toNanos(100)));
      }
      if (deadline - System.nanoTime() <= 0) {
        return List.of();
      }
    }
  }

  private synchronized void awaitBindingChange(long nanos) {
    if (nanos <= 0) {
      return;
    }
    try {
      TimeUnit.NANOSECONDS.timedWait(this, nanos);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted", e);
    }
  }

  private synchronized Sidecar sidecar(String address) {
    return sidecars.get(address);
  }

  /** One Fetch; null when the sidecar is to be skipped (gone, unavailable, timed out). */
  private List<DsRecord> fetchFrom(String address, Duration wait) {
    Sidecar s = sidecar(address);
    if (s == null) {
      return null;
    }
    FetchRequest request = FetchRequest.newBuilder().setClientId(clientId).setGroup(group)
        .setMaxRecords(maxRecords).setMaxBytes(maxBytes)
        .setMaxWait(protoDuration(wait.toNanos()))
        .setFormat(DeliveryFormat.DELIVERY_FORMAT_BATCHES).build();
    FetchResponse response;
    ManagedChannel channel = s.channel;
    try {
      response = StreamServiceGrpc.newBlockingStub(channel)
          .withDeadlineAfter(wait.plus(FETCH_EXTRA).toNanos(), TimeUnit.NANOSECONDS)
          .fetch(request);
    } catch (StatusRuntimeException e) {
      Status.Code code = CallPolicy.codeOf(e);
      if (code == Status.Code.UNAVAILABLE || code == Status.Code.DEADLINE_EXCEEDED
          || code == Status.Code.CANCELLED) {
        fallBack(s, channel, code); // over its socket: TCP from the next call on
        LOG.fine(() -> "fetch from " + address + ": " + code + "; skipped");
        return null;
      }
      throw DsClientException.of(e);
    }
    return decode(response.getBatchesList(), response.getRecordsList(), address, null);
  }

  private static List<DsRecord> decode(List<RecordBatch> batches,
      List<dataservice.common.v1.Common.Record> records, String address, Object via) {
    if (batches.isEmpty()) {
      return BatchDecoder.decode(records, address, via);
    }
    List<DsRecord> out = new ArrayList<>();
    for (RecordBatch batch : batches) {
      out.addAll(BatchDecoder.decode(batch, address, via));
    }
    if (!records.isEmpty()) {
      out.addAll(BatchDecoder.decode(records, address, via));
    }
    return out;
  }

  // ---- stream ---------------------------------------------------------------------------

  /**
   * Switches the client to the Stream RPC (§7): one stream per bound sidecar, each granted
   * {@code maxRecords} of credit, credit given back as the application takes batches with
   * {@link #poll(Duration)}. Sidecars bound later are streamed too; a stream that ends
   * UNAVAILABLE is re-opened while its sidecar is bound.
   */
  public synchronized void stream() {
    if (streaming) {
      return;
    }
    streaming = true;
    for (Sidecar s : sidecars.values()) {
      openStream(s);
    }
  }

  /** The next streamed batch, or an empty list after {@code timeout}. */
  public List<DsRecord> poll(Duration timeout) {
    if (!streaming) {
      throw new IllegalStateException("call stream() first");
    }
    checkFailure();
    Delivered d;
    try {
      d = streamed.poll(timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted", e);
    }
    if (d == null) {
      return List.of();
    }
    if (d.error != null) {
      failure = d.error;
      throw d.error;
    }
    d.session.credit(d.records.size());
    return d.records;
  }

  private final StreamSession.Listener listener = new StreamSession.Listener() {
    @Override
    public void batch(StreamSession session, StreamResponse response) {
      List<DsRecord> records = decode(response.getBatch().getBatchesList(),
          response.getBatch().getRecordsList(), session.sidecar, session);
      if (!records.isEmpty()) {
        streamed.add(new Delivered(records, session, null));
      }
    }

    @Override
    public void ended(StreamSession session, Throwable error) {
      streamEnded(session, error);
    }
  };

  /** Opens a Stream to {@code s}. Caller holds the lock. */
  private void openStream(Sidecar s) {
    StreamSession session = new StreamSession(s.address, listener);
    s.session = session;
    StreamOpen.Builder opening = StreamOpen.newBuilder()
        .setClientId(clientId).setGroup(group)
        .setInitialCredit(StreamCredit.newBuilder().setRecords(maxRecords))
        .setFormat(DeliveryFormat.DELIVERY_FORMAT_BATCHES);
    if (!streamLinger.isZero()) {
      opening.setLinger(protoDuration(streamLinger.toNanos()));
    }
    StreamRequest open = StreamRequest.newBuilder().setOpen(opening).build();
    s.sessionChannel = s.channel;
    session.start(StreamServiceGrpc.newStub(s.sessionChannel).stream(session), open);
  }

  private void streamEnded(StreamSession session, Throwable error) {
    Status.Code code = error == null ? Status.Code.OK : CallPolicy.codeOf(error);
    boolean reopen = code == Status.Code.OK || code == Status.Code.UNAVAILABLE
        || code == Status.Code.CANCELLED || code == Status.Code.DEADLINE_EXCEEDED;
    Sidecar s;
    ManagedChannel used;
    synchronized (this) {
      s = sidecars.get(session.sidecar);
      if (closed || s == null || s.session != session) {
        return; // the sidecar left the binding, or the client closes
      }
      used = s.sessionChannel;
      if (!reopen) {
        streamed.add(new Delivered(List.of(), session, DsClientException.of(error)));
        return;
      }
    }
    fallBack(s, used, code); // over its socket: re-opened over TCP
    Duration pause = Backoff.STREAM.pause(s.reopenFailures++,
        ThreadLocalRandom.current()::nextDouble);
    LOG.fine(() -> "stream from " + session.sidecar + " ended " + code + "; re-open in " + pause);
    Thread reopener = new Thread(() -> {
      sleepQuietly(pause);
      synchronized (this) {
        if (!closed && sidecars.get(s.address) == s && s.session == session) {
          openStream(s);
        }
      }
    }, "ds-stream-reopen");
    reopener.setDaemon(true);
    reopener.start();
  }

  // ---- ack, nack ------------------------------------------------------------------------

  /**
   * Acks {@code records} at the sidecars that delivered them (§8), on the stream that carried
   * them if it is still open, else with the Ack RPC (8 attempts on UNAVAILABLE). Returns how many
   * of them the sidecars accepted; refused ones (stale epoch, sidecar gone) come again. Never
   * throws for a refusal.
   */
  public long ack(List<DsRecord> records) {
    long accepted = 0;
    for (Map.Entry<String, List<AckPlan.Range>> e : AckPlan.plan(records).entrySet()) {
      Sidecar s = sidecar(e.getKey());
      if (s == null) {
        LOG.fine(() -> "ack: sidecar " + e.getKey() + " no longer bound; dropped");
        continue;
      }
      Map<Object, List<AckPlan.Range>> byVia = new LinkedHashMap<>();
      for (AckPlan.Range r : e.getValue()) {
        Object via = r.via() instanceof StreamSession ss && ss.isOpen() ? ss : s;
        byVia.computeIfAbsent(via, k -> new ArrayList<>()).add(r);
      }
      for (Map.Entry<Object, List<AckPlan.Range>> group : byVia.entrySet()) {
        if (group.getKey() instanceof StreamSession session) {
          accepted += ackOnStream(s, session, group.getValue());
        } else {
          accepted += ackRpc(s, group.getValue());
        }
      }
    }
    return accepted;
  }

  private long ackOnStream(Sidecar s, StreamSession session, List<AckPlan.Range> ranges) {
    List<RangeAck> acks = new ArrayList<>(ranges.size());
    for (AckPlan.Range r : ranges) {
      acks.add(r.ack());
    }
    try {
      StreamAckResult result = session.ack(acks)
          .get(STREAM_ACK_TIMEOUT.toNanos(), TimeUnit.NANOSECONDS);
      return acceptedOf(ranges, result.getRejectedRangesList());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return 0;
    } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
      return ackRpc(s, ranges); // the stream ended, or no answer in 10 s: the Ack RPC
    }
  }

  private long ackRpc(Sidecar s, List<AckPlan.Range> ranges) {
    long accepted = 0;
    for (int from = 0; from < ranges.size(); from += MAX_RANGES) {
      List<AckPlan.Range> chunk = ranges.subList(from, Math.min(ranges.size(), from + MAX_RANGES));
      AckRequest.Builder request = AckRequest.newBuilder().setClientId(clientId).setGroup(group);
      for (AckPlan.Range r : chunk) {
        request.addRanges(r.ack());
      }
      try {
        AckResponse response = sidecarCall(s, stub -> stub.ack(request.build()));
        accepted += acceptedOf(chunk, response.getRejectedRangesList());
      } catch (DsClientException e) {
        LOG.log(Level.WARNING, "ack at " + s.address + " not accepted: " + e.getMessage());
      }
    }
    return accepted;
  }

  /** Records of {@code ranges} less those of the ranges refused. */
  static long acceptedOf(List<AckPlan.Range> ranges, List<RejectedRangeAck> rejected) {
    Map<RangeAck, Integer> sizes = new HashMap<>();
    long total = 0;
    for (AckPlan.Range r : ranges) {
      sizes.merge(r.ack(), r.records(), Integer::sum);
      total += r.records();
    }
    for (RejectedRangeAck r : rejected) {
      Integer n = sizes.remove(r.getAck());
      if (n != null) {
        total -= n;
      }
    }
    return total;
  }

  /**
   * A unary call to a sidecar: 8 attempts on UNAVAILABLE, 10 s each, while the sidecar is bound
   * (an ack to a sidecar that left is dropped: its records come again from the new owner).
   */
  private <T> T sidecarCall(Sidecar s,
      java.util.function.Function<StreamServiceGrpc.StreamServiceBlockingStub, T> call) {
    CallPolicy policy = CallPolicy.sidecar();
    for (int attempt = 1; ; attempt++) {
      ManagedChannel channel = s.channel;
      Connecting.await(channel, Connecting.MAX_WAIT);
      try {
        return call.apply(StreamServiceGrpc.newBlockingStub(channel)
            .withDeadlineAfter(UNARY_DEADLINE.toNanos(), TimeUnit.NANOSECONDS));
      } catch (StatusRuntimeException e) {
        fallBack(s, channel, CallPolicy.codeOf(e)); // over its socket: next attempt over TCP
        if (policy.decide(attempt, CallPolicy.codeOf(e), DsClientException.reasonOf(e),
            "", s.address) != CallPolicy.Decision.RETRY || sidecar(s.address) != s) {
          throw DsClientException.of(e); // refused, out of attempts, or no longer bound
        }
        sleepQuietly(Backoff.CALLS.pause(attempt - 1, ThreadLocalRandom.current()::nextDouble));
      }
    }
  }

  /**
   * Gives {@code records} back to be delivered again after {@code delay} (Duration.ZERO: now).
   * Returns how many the sidecars took back.
   */
  public long nack(List<DsRecord> records, Duration delay) {
    long taken = 0;
    for (Map.Entry<String, List<AckPlan.Range>> e : AckPlan.plan(records).entrySet()) {
      Sidecar s = sidecar(e.getKey());
      if (s == null) {
        continue;
      }
      NackRequest.Builder request = NackRequest.newBuilder().setClientId(clientId)
          .setGroup(group).setDelay(protoDuration(delay.toNanos()));
      for (AckPlan.Range r : e.getValue()) {
        request.addRanges(r.ack());
      }
      try {
        taken += sidecarCall(s, stub -> stub.nack(request.build())).getRecords();
      } catch (DsClientException ex) {
        LOG.log(Level.WARNING, "nack at " + s.address + " not accepted: " + ex.getMessage());
      }
    }
    return taken;
  }

  static com.google.protobuf.Duration protoDuration(long nanos) {
    return com.google.protobuf.Duration.newBuilder().setSeconds(nanos / 1_000_000_000L)
        .setNanos((int) (nanos % 1_000_000_000L)).build();
  }

  // ---- close ----------------------------------------------------------------------------

  /**
   * Stops reading, gives back every record delivered and not acked ({@code Nack(all)}, 2 s, best
   * effort) so the next reader need not wait for the visibility timeout, unbinds (2 s, best
   * effort) and closes every channel.
   */
  @Override
  public void close() {
    List<Sidecar> bound;
    synchronized (this) {
      if (closed) {
        return;
      }
      closed = true;
      if (watchContext != null) {
        watchContext.cancel(null);
      }
      bound = new ArrayList<>(sidecars.values());
      sidecars.clear();
      notifyAll();
    }
    watcher.interrupt();
    for (Sidecar s : bound) {
      if (s.session != null) {
        s.session.cancel();
      }
      try {
        StreamServiceGrpc.newBlockingStub(s.channel)
            .withDeadlineAfter(CLOSE_DEADLINE.toNanos(), TimeUnit.NANOSECONDS)
            .nack(NackRequest.newBuilder().setClientId(clientId).setGroup(group).setAll(true)
                .build());
      } catch (StatusRuntimeException e) {
        LOG.fine(() -> "close: Nack(all) at " + s.address + ": " + CallPolicy.codeOf(e));
      }
      synchronized (this) {
        s.shutdownNow();
      }
    }
    try {
      assigner.stub().withDeadlineAfter(CLOSE_DEADLINE.toNanos(), TimeUnit.NANOSECONDS)
          .unbind(UnbindRequest.newBuilder().setClientId(clientId).setGroup(group).build());
    } catch (StatusRuntimeException e) {
      LOG.fine(() -> "close: Unbind: " + CallPolicy.codeOf(e));
    }
    assigner.close();
  }
}
