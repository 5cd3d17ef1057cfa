package dsclient

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fetchCallSlack is what a Fetch deadline adds to its max_wait (call_timeout of §5): a
// response that never reaches the client is delivered again, so a short deadline only
// causes redelivery.
const fetchCallSlack = 35 * time.Second

// closeDeadline bounds each best-effort call of Close (Nack(all), Unbind).
const closeDeadline = 2 * time.Second

// sidecar is one bound sidecar: its channel and stub. address (TCP) is its key (acks,
// streams) whatever the channel dials: target, the address or its local socket (local,
// the unix: target the binding names, "" for none). The channel changes when a call over
// the socket fails UNAVAILABLE (to TCP) and when a later binding lets the client dial
// the socket again (§3); calls under way keep the channel they started on, which is
// closed with the sidecar.
type sidecar struct {
	address string
	local   string // written under Client.mu

	mu      sync.Mutex
	target  string
	conn    *grpc.ClientConn
	stub    sidecarv1.StreamServiceClient
	retired []*grpc.ClientConn
}

func newSidecar(address, local, target string, conn *grpc.ClientConn) *sidecar {
	return &sidecar{address: address, local: local, target: target, conn: conn, stub: sidecarv1.NewStreamServiceClient(conn)}
}

// client is the stub of the sidecar's channel now.
func (s *sidecar) client() sidecarv1.StreamServiceClient {
	_, stub := s.current()
	return stub
}

// current is the sidecar's channel now and its stub: a call's failure moves the sidecar
// off its socket only if the call went over the channel it still dials (fallBack).
func (s *sidecar) current() (*grpc.ClientConn, sidecarv1.StreamServiceClient) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn, s.stub
}

// dials is what the sidecar's channel dials now: its address or its socket.
func (s *sidecar) dials() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.target
}

// attach calls the sidecar over conn (dialing target) from now on.
func (s *sidecar) attach(conn *grpc.ClientConn, target string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired = append(s.retired, s.conn)
	s.conn, s.target, s.stub = conn, target, sidecarv1.NewStreamServiceClient(conn)
}

// close closes every channel of the sidecar (calls on them end CANCELLED).
func (s *sidecar) close() {
	s.mu.Lock()
	conns := append(s.retired, s.conn)
	s.retired = nil
	s.mu.Unlock()
	for _, conn := range conns {
		_ = conn.Close()
	}
}

// Client reads one group through the mesh (docs/client-protocol.md): it binds through
// the assigner, follows the binding by itself in the background, fetches or streams from
// the bound sidecars, and acks each record at the sidecar that delivered it. Safe for
// concurrent use; Close it when done.
type Client struct {
	group       string
	clientID    string
	cfg         config
	dialOpts    []grpc.DialOption // of the assigner's channels
	sidecarOpts []grpc.DialOption // of a TCP channel to a sidecar (the sidecars' token)
	localOpts   []grpc.DialOption // of a channel to a sidecar's Unix domain socket
	logger      *slog.Logger
	asg         *assigner

	mu       sync.Mutex
	state    bindingState
	sidecars map[string]*sidecar
	streams  map[string]*openStream // the Stream open to each sidecar, for acks on it
	changed  chan struct{}          // closed (and replaced) on every applied binding change
	fatal    error                  // a terminal error of the watch, surfaced by Fetch and Stream
	cursor   int
	closed   bool

	ctx    context.Context // the client's own life: cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New binds client WithClientID to group through the assigners named WithAssigners,
// following the leader (8 attempts, elections waited out), and starts watching the
// binding. It returns the terminal error of Bind (errors.Is ErrGroupNotFound,
// ErrTooManyClients, ErrInvalidArgument, ErrPermissionDenied, ...) as an *Error.
func New(ctx context.Context, group string, opts ...Option) (*Client, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.assigners) == 0 {
		return nil, fmt.Errorf("%w: no assigner address (WithAssigners)", ErrInvalidArgument)
	}
	if cfg.clientID == "" {
		cfg.clientID = randomClientID()
	}
	dialOpts, err := cfg.dialOptions()
	if err != nil {
		return nil, err
	}
	sidecarOpts, err := cfg.sidecarDialOptions()
	if err != nil {
		return nil, err
	}
	dial := func(address string) (*grpc.ClientConn, error) { return grpc.NewClient(address, dialOpts...) }
	asg, err := newAssigner(cfg.assigners, dial, cfg.logger)
	if err != nil {
		return nil, fmt.Errorf("dsclient: assigner channel: %w", err)
	}
	c := &Client{
		group: group, clientID: cfg.clientID, cfg: cfg, dialOpts: dialOpts, sidecarOpts: sidecarOpts, localOpts: cfg.localDialOptions(), logger: cfg.logger, asg: asg,
		sidecars: map[string]*sidecar{}, streams: map[string]*openStream{}, changed: make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	b, err := c.bind(ctx)
	if err != nil {
		c.cancel()
		asg.close()
		return nil, err
	}
	c.mu.Lock()
	c.applyLocked(c.state.replace(b))
	c.mu.Unlock()
	c.wg.Add(1)
	go c.watch()
	return c, nil
}

// ClientID is the client's id.
func (c *Client) ClientID() string { return c.clientID }

// Group is the group the client reads.
func (c *Client) Group() string { return c.group }

// Endpoints are the sidecars the client is bound to now, sorted by address.
func (c *Client) Endpoints() []Endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Endpoint, 0, len(c.state.endpoints))
	for _, a := range c.state.addresses() {
		out = append(out, c.state.endpoints[a])
	}
	return out
}

// Assigner is the address of the assigner the client talks to now (the leader it follows).
func (c *Client) Assigner() string { return c.asg.address() }

func (c *Client) bind(ctx context.Context) (*assignerv1.Binding, error) {
	var resp *assignerv1.BindResponse
	err := c.asg.call(ctx, "Bind", func(ctx context.Context, s assignerv1.BindingServiceClient, o ...grpc.CallOption) error {
		var err error
		resp, err = s.Bind(ctx, &assignerv1.BindRequest{ClientId: c.clientID, Group: c.group}, o...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.GetBinding(), nil
}

// applyLocked opens channels to the sidecars added and closes those of the sidecars
// removed (their acks are dropped: the partition's new owner redelivers, §3).
func (c *Client) applyLocked(ch change) {
	if !ch.applied {
		return
	}
	for _, addr := range ch.removed {
		if s, ok := c.sidecars[addr]; ok {
			s.close()
			delete(c.sidecars, addr)
		}
	}
	for _, addr := range c.state.addresses() {
		local := c.state.endpoints[addr].LocalAddress
		s, ok := c.sidecars[addr]
		if ok && local == s.local && (local == "" || s.dials() != addr) {
			continue // on the socket the binding names, or TCP with no socket named
		}
		// New, or on TCP while the binding names a socket (it may serve again: a
		// restarted sidecar), or the binding names another socket (or none): choose.
		target := sidecarTarget(addr, local, c.cfg.tls.forSidecars(), c.socketUsable)
		if ok && target == s.dials() {
			s.local = local
			continue
		}
		conn, err := c.dial(target, addr)
		if err != nil {
			c.logger.Warn("dsclient: cannot dial sidecar", "address", addr, "target", target, "err", err)
			continue
		}
		if ok {
			s.local = local
			s.attach(conn, target)
			c.logger.Info("dsclient: sidecar transport", "sidecar", addr, "target", target)
		} else {
			c.sidecars[addr] = newSidecar(addr, local, target, conn)
		}
	}
	c.logger.Info("dsclient: binding applied", "version", c.state.version, "sidecars", c.state.addresses())
	close(c.changed)
	c.changed = make(chan struct{})
}

// socketUsable says whether the client sends its calls (and its token) to the sidecar's
// socket file path: one only its owner could have placed (untrustedSocket, else logged and
// TCP), accepting connections now.
func (c *Client) socketUsable(path string) bool {
	if _, err := os.Lstat(path); err != nil {
		return false // no socket here (the sidecar is in another pod): TCP, nothing to say
	}
	if why := untrustedSocket(path); why != "" {
		c.logger.Warn("dsclient: not using the sidecar's socket, TCP instead", "why", why)
		return false
	}
	return acceptsNow(path)
}

// dial opens a channel to a sidecar at address over target: its TCP address, or its
// socket (local credentials, §3).
func (c *Client) dial(target, address string) (*grpc.ClientConn, error) {
	if target != address {
		return grpc.NewClient(target, c.localOpts...)
	}
	return grpc.NewClient(target, c.sidecarOpts...)
}

// fallBack moves s to TCP after a call over its socket (the channel used, which s still
// dials) failed err, if err is UNAVAILABLE (§3): the sidecar's socket is gone (a killed or
// restarted sidecar leaves its file), while its TCP address may still serve or be
// re-bound. The next binding naming the socket tries it again. The end of a call over a
// channel already replaced says nothing about the one s dials now.
func (c *Client) fallBack(s *sidecar, used *grpc.ClientConn, err error) {
	if status.Code(err) != codes.Unavailable {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, _ := s.current(); c.closed || c.sidecars[s.address] != s || s.dials() == s.address || conn != used {
		return
	}
	conn, derr := c.dial(s.address, s.address)
	if derr != nil {
		c.logger.Warn("dsclient: cannot dial sidecar", "address", s.address, "err", derr)
		return
	}
	s.attach(conn, s.address)
	c.logger.Info("dsclient: sidecar socket unavailable; over TCP until a binding names it again", "sidecar", s.address, "err", err)
}

// watch follows the binding until the client closes (§3): re-watch with the held version
// after a pause when the stream ends; on a leader change, Bind there and take its binding.
func (c *Client) watch() {
	defer c.wg.Done()
	pauses := 0
	for c.ctx.Err() == nil {
		stub, address, switched := c.asg.client()
		c.mu.Lock()
		held := c.state.version
		c.mu.Unlock()
		wctx, cancel := context.WithCancel(c.ctx)
		go func() {
			select {
			case <-switched:
				cancel()
			case <-wctx.Done():
			}
		}()
		stream, err := stub.WatchBinding(wctx, &assignerv1.WatchBindingRequest{ClientId: c.clientID, Group: c.group, KnownVersion: held})
		if err == nil {
			for {
				var resp *assignerv1.WatchBindingResponse
				if resp, err = stream.Recv(); err != nil {
					break
				}
				pauses = 0
				c.mu.Lock()
				c.applyLocked(c.state.apply(resp.GetBinding(), time.Now()))
				c.mu.Unlock()
			}
		}
		var leader string
		if stream != nil {
			leader = leaderOf(err, stream.Trailer())
		} else {
			leader = leaderOf(err, nil)
		}
		cancel()
		if c.ctx.Err() != nil {
			return
		}
		if leader != "" && leader != address {
			c.asg.switchTo(leader)
		} else if d := decide(err, leader, address, true); d == retry {
			c.asg.tryNext()
		} else if c.terminal(err) {
			return
		}
		if c.asg.address() != address {
			c.rebind()
			continue
		}
		c.logger.Debug("dsclient: binding watch ended; watching again", "err", err)
		if sleep(c.ctx, WatchBackoff.pause(pauses)) != nil {
			return
		}
		pauses++
	}
}

// terminal records a watch error the application must see (an unknown group, a refused
// identity, a bad request) and says whether the watch stops.
func (c *Client) terminal(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
		c.mu.Lock()
		c.fatal = asError("WatchBinding", err)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		return true
	}
	return false
}

// rebind binds on the new leader and takes its binding whatever its version (§3 step 2).
func (c *Client) rebind() {
	b, err := c.bind(c.ctx)
	if err != nil {
		if c.ctx.Err() == nil && !c.terminal(err) {
			c.logger.Warn("dsclient: re-bind failed; watching again", "err", err)
		}
		return
	}
	c.mu.Lock()
	c.applyLocked(c.state.rebound(b, time.Now()))
	c.mu.Unlock()
}

// snapshot is the fetch rotation (moved on by one), the change signal and the state.
func (c *Client) snapshot() ([]*sidecar, <-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	if c.fatal != nil {
		return nil, nil, c.fatal
	}
	addrs := make([]string, 0, len(c.sidecars))
	for _, a := range c.state.addresses() {
		if _, ok := c.sidecars[a]; ok {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > 0 {
		c.cursor = (c.cursor + 1) % len(addrs)
	}
	out := make([]*sidecar, 0, len(addrs))
	for _, a := range rotation(addrs, c.cursor) {
		out = append(out, c.sidecars[a])
	}
	return out, c.changed, nil
}

// sidecarAt is the bound sidecar at address, or nil.
func (c *Client) sidecarAt(address string) *sidecar {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sidecars[address]
}

// Fetch returns the next records from any bound sidecar, or none when none arrived
// within the client's max wait (§6): each sidecar is asked without waiting, in a rotation
// that moves on at every pass, then the last one long-polls for what is left of the wait;
// with one sidecar it long-polls at once. A sidecar that is unavailable is skipped (the
// assigner pushes a new binding). The records come from one sidecar; ack them with Ack
// (unless WithAutoAck). Errors: a status other than UNAVAILABLE, DEADLINE_EXCEEDED or
// CANCELLED from a sidecar (ErrGroupNotServed, ErrInvalidArgument, ...), a terminal error
// of the binding watch, ErrClosed, or ctx's error.
func (c *Client) Fetch(ctx context.Context) ([]Record, error) {
	deadline := time.Now().Add(c.cfg.maxWait)
	firstPass := true
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sidecars, changed, err := c.snapshot()
		if err != nil {
			return nil, err
		}
		if len(sidecars) == 0 {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, nil
			}
			t := time.NewTimer(min(left, 100*time.Millisecond))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-changed:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		for i, s := range sidecars {
			wait := time.Duration(0)
			if (i == len(sidecars)-1 && !firstPass) || len(sidecars) == 1 {
				wait = max(0, time.Until(deadline))
			}
			records, err := c.fetchFrom(ctx, s, wait)
			if err != nil {
				return nil, err
			}
			if len(records) > 0 {
				return records, nil
			}
		}
		firstPass = false
		if !time.Now().Before(deadline) {
			return nil, nil
		}
	}
}

func (c *Client) fetchFrom(ctx context.Context, s *sidecar, wait time.Duration) ([]Record, error) {
	cctx, cancel := context.WithTimeout(ctx, wait+fetchCallSlack)
	defer cancel()
	conn, stub := s.current()
	resp, err := stub.Fetch(cctx, &sidecarv1.FetchRequest{
		ClientId: c.clientID, Group: c.group, MaxRecords: c.cfg.maxRecords, MaxBytes: c.cfg.maxBytes,
		MaxWait: durationpb.New(wait), AutoAck: c.cfg.autoAck, Format: sidecarv1.DeliveryFormat_DELIVERY_FORMAT_BATCHES,
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			// The sidecar is gone or going (or its channel was closed by a binding
			// change): skip it; the assigner pushes a new binding (C19). Over its
			// socket: TCP from the next call on.
			c.fallBack(s, conn, err)
			c.logger.Debug("dsclient: sidecar unavailable; skipped", "sidecar", s.address, "err", err)
			return nil, nil
		}
		return nil, asError("Fetch", err)
	}
	return decodeResponse(resp.GetBatches(), resp.GetRecords(), s.address)
}

// Ack acknowledges delivered records and waits until their sidecars committed them
// (§8). Each run of records goes as one range to the sidecar that delivered it, under its
// lease epoch; records whose sidecar is no longer bound are not sent (the partition's new
// owner delivers them again). It returns how many records the sidecars accepted: the
// others were refused (a stale epoch, a lease that lapsed) or the call failed after its
// retries, and come again. Refusals are logged, never returned (as the Python client, O9);
// the error is ctx's or ErrClosed.
func (c *Client) Ack(ctx context.Context, records []Record) (int, error) {
	return c.settle(ctx, "Ack", spansOf(records), func(ctx context.Context, s sidecarv1.StreamServiceClient, ranges []*sidecarv1.RangeAck) (rejected []*sidecarv1.RejectedRangeAck, err error) {
		resp, err := s.Ack(ctx, &sidecarv1.AckRequest{ClientId: c.clientID, Group: c.group, Ranges: ranges})
		return resp.GetRejectedRanges(), err
	})
}

// ackOnStream acks ranges on the stream open to sc, if any (§8: on a Stream, ack on the
// stream that delivered the records); ok is false when there is none, it ended, or the
// result did not come within 10 s: the caller then uses the Ack RPC.
func (c *Client) ackOnStream(ctx context.Context, sc *sidecar, ranges []*sidecarv1.RangeAck) ([]*sidecarv1.RejectedRangeAck, bool) {
	o := c.streamAt(sc.address)
	if o == nil {
		return nil, false
	}
	r, ok := o.ack(ctx, ranges)
	if !ok {
		c.logger.Debug("dsclient: ack on the stream not answered; sent with the Ack RPC", "sidecar", sc.address)
		return nil, false
	}
	return r.GetRejectedRanges(), true
}

// Nack gives delivered records back, to be delivered again now or after delay (0 to
// 12 h; until then they stay in flight to this client). It returns how many records the
// sidecars took back; the error is ctx's or ErrClosed.
func (c *Client) Nack(ctx context.Context, records []Record, delay time.Duration) (int, error) {
	return c.settle(ctx, "Nack", spansOf(records), func(ctx context.Context, s sidecarv1.StreamServiceClient, ranges []*sidecarv1.RangeAck) (rejected []*sidecarv1.RejectedRangeAck, err error) {
		resp, err := s.Nack(ctx, &sidecarv1.NackRequest{ClientId: c.clientID, Group: c.group, Ranges: ranges, Delay: durationpb.New(delay)})
		return resp.GetRejectedRanges(), err
	})
}

// settleFunc sends ranges over a sidecar's stub.
type settleFunc func(context.Context, sidecarv1.StreamServiceClient, []*sidecarv1.RangeAck) ([]*sidecarv1.RejectedRangeAck, error)

// settle sends spans by sidecar with send (8 attempts on UNAVAILABLE, 10 s each) and
// counts the records of the ranges not refused.
func (c *Client) settle(ctx context.Context, op string, spans []span, send settleFunc) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	bySidecar := map[string][]span{}
	var order []string
	for _, s := range spans {
		if _, ok := bySidecar[s.sidecar]; !ok {
			order = append(order, s.sidecar)
		}
		bySidecar[s.sidecar] = append(bySidecar[s.sidecar], s)
	}
	total := 0
	for _, address := range order {
		sc := c.sidecarAt(address)
		if sc == nil {
			c.logger.Info("dsclient: sidecar no longer bound; its records come again", "op", op, "sidecar", address)
			continue
		}
		n, err := c.settleAt(ctx, op, sc, bySidecar[address], send)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (c *Client) settleAt(ctx context.Context, op string, sc *sidecar, spans []span, send settleFunc) (int, error) {
	ranges := make([]*sidecarv1.RangeAck, len(spans))
	for i, s := range spans {
		ranges[i] = s.rangeAck()
	}
	var rejected []*sidecarv1.RejectedRangeAck
	if op == "Ack" {
		if rejected, ok := c.ackOnStream(ctx, sc, ranges); ok {
			return acceptedCount(spans, rejected, c.logger, op), nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	err := retryUnavailable(ctx, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, unaryDeadline)
		defer cancel()
		var err error
		conn, stub := sc.current()
		rejected, err = send(actx, stub, ranges)
		c.fallBack(sc, conn, err) // over its socket: the next attempt goes over TCP
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		c.logger.Warn("dsclient: no answer; records counted as not accepted (they come again unless the sidecar committed them before it failed)",
			"op", op, "sidecar", sc.address, "err", asError(op, err))
		return 0, nil
	}
	return acceptedCount(spans, rejected, c.logger, op), nil
}

// acceptedCount is the records of the spans whose range was not refused.
func acceptedCount(spans []span, rejected []*sidecarv1.RejectedRangeAck, logger *slog.Logger, op string) int {
	type key struct {
		topic     string
		partition int32
		from, to  int64
		epoch     int64
	}
	refused := map[key]bool{}
	for _, r := range rejected {
		a := r.GetAck()
		refused[key{a.GetTopic(), a.GetPartition(), a.GetFromOffset(), a.GetToOffset(), a.GetLeaseEpoch()}] = true
		logger.Info("dsclient: range refused; its records come again", "op", op, "topic", a.GetTopic(),
			"partition", a.GetPartition(), "from", a.GetFromOffset(), "to", a.GetToOffset(), "reason", r.GetReason().String())
	}
	n := 0
	for _, s := range spans {
		if !refused[key{s.topic, s.partition, s.from, s.to, s.epoch}] {
			n += s.count
		}
	}
	return n
}

// Close gives back what the client did not ack (Nack(all) to every bound sidecar, so the
// next reader need not wait for the visibility timeout), unbinds, and closes every
// channel; each call best effort, 2 s. Safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sidecars := make([]*sidecar, 0, len(c.sidecars))
	for _, s := range c.sidecars {
		sidecars = append(sidecars, s)
	}
	c.mu.Unlock()
	c.cancel() // stops the watch and the streams
	c.wg.Wait()
	for _, s := range sidecars {
		ctx, cancel := context.WithTimeout(context.Background(), closeDeadline)
		if _, err := s.client().Nack(ctx, &sidecarv1.NackRequest{ClientId: c.clientID, Group: c.group, All: true}); err != nil {
			c.logger.Debug("dsclient: give-back at close failed", "sidecar", s.address, "err", err)
		}
		cancel()
	}
	stub, _, _ := c.asg.client()
	ctx, cancel := context.WithTimeout(context.Background(), closeDeadline)
	if _, err := stub.Unbind(ctx, &assignerv1.UnbindRequest{ClientId: c.clientID, Group: c.group}); err != nil {
		c.logger.Debug("dsclient: unbind at close failed", "err", err)
	}
	cancel()
	c.mu.Lock()
	for addr, s := range c.sidecars {
		s.close()
		delete(c.sidecars, addr)
	}
	c.mu.Unlock()
	c.asg.close()
	return nil
}
