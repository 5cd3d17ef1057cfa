// Command sessionload is tests/bench/bench_session.py's load generator (issue 22 item 6):
// N simulated sidecars holding Session streams to one assigner, in one Go process, so that
// the clients cost far less CPU than the assigner they measure.
//
//	sessionload --addr HOST:PORT --group GROUP --sidecars N [--interval S]
//	            [--connections K|per-sidecar]
//
// Each sidecar behaves as bench_session.py's SimSidecar/session()/drive() (and so as
// services/consumer_sidecar does): it joins naming the leases it still holds, heartbeats
// every --interval seconds (the first at a uniform random phase; 0 is a closed loop: the next
// heartbeat as soon as the previous one is acked), holds a grant from its arrival and counts
// it live from the first ack that renews it, gives each renewal the deadline = that
// heartbeat's send time + TTL - safety margin, drops what an ack named but did not renew and
// what passed its deadline, releases a revoked lease (committed_offset 100) in its next
// heartbeat, and re-attaches a broken stream after 1 s.
//
// stdin/stdout: one JSON value a line, the commands of bench_session.py's worker pipe with
// the same meaning. It prints "ready" once its connections are up, then answers
//
//	["baseline", t0, t1]  health Check per sidecar per interval; ["baseline", acks, [lat], {code: n}]
//	["sessions", ramp]    start the sidecars, each after a uniform random delay in [0, ramp) s; null
//	["status"]            [held, lease changes, joined, rejoins]
//	["window", t0, t1]    count acks of heartbeats sent within [t0, t1); null
//	["results"]           [acks, [latency s], {code: n}]
//	["kill"]              the sidecar holding the most is cut (no Leave); [[topic, partition]]
//	["watch", [[t, p]]]   note when each of these is first live on a sidecar; null
//	["live"]              [[topic, partition, at]]
//	["stop"]              null, then exit
//
// Times are CLOCK_MONOTONIC seconds, the clock of Python's time.monotonic(). stderr says
// which connection layout was used.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	"golang.org/x/sys/unix"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The assigner's default lease TTL and the sidecar's default safety margin, as in
// bench_session.py (TTL, SAFETY_MARGIN).
const (
	ttl          = 3.0
	safetyMargin = 0.5
	ackGrace     = 3.0 // acks later than this after the window are missing from the rate
	reattach     = time.Second
)

// monotonic is CLOCK_MONOTONIC in seconds: the clock the bench's windows are given in.
func monotonic() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}

type tp struct {
	Topic     string
	Partition int32
}

type tpEpoch struct {
	tp
	Epoch int64
}

type lease struct {
	epoch     int64
	deadline  float64 // local: nothing is held past it
	confirmed bool    // renewed by an ack at least once (live)
}

type sent struct {
	at    float64
	named []tpEpoch
}

// sidecar is one simulated sidecar's lease state, as SimSidecar keeps it.
type sidecar struct {
	mu       sync.Mutex
	id       string
	group    string
	leases   map[tp]*lease
	released []*assignerv1.ReleasedLease
	seq      int64
	sent     map[int64]sent
	changes  int
	joined   bool
	killed   bool
	rejoins  int
	cancel   context.CancelFunc
}

func newSidecar(id, group string) *sidecar {
	return &sidecar{id: id, group: group, leases: map[tp]*lease{}, sent: map[int64]sent{}}
}

// join names the leases still within their deadline (caller holds mu).
func (s *sidecar) join(now float64) *assignerv1.SessionRequest {
	held := []*assignerv1.LeaseRef{}
	for k, l := range s.leases {
		if now < l.deadline {
			held = append(held, &assignerv1.LeaseRef{Topic: k.Topic, Partition: k.Partition, Epoch: l.epoch})
		}
	}
	return &assignerv1.SessionRequest{Kind: &assignerv1.SessionRequest_Join{Join: &assignerv1.SessionJoin{
		SidecarId: s.id, Group: s.group, Endpoint: "127.0.0.1:1/" + s.id, HeldLeases: held,
	}}}
}

// held counts live leases: confirmed and within their local deadline (caller holds mu).
func (s *sidecar) held(now float64) []tp {
	out := []tp{}
	for k, l := range s.leases {
		if l.confirmed && now < l.deadline {
			out = append(out, k)
		}
	}
	return out
}

// heartbeat drops what lapsed locally and names the rest (caller holds mu).
func (s *sidecar) heartbeat(now float64) *assignerv1.SessionRequest {
	s.seq++
	released := s.released
	s.released = nil
	progress := []*assignerv1.LeaseProgress{}
	named := []tpEpoch{}
	for k, l := range s.leases {
		if now >= l.deadline {
			delete(s.leases, k) // lapsed locally: the sidecar stops and drops it
			s.changes++
			continue
		}
		named = append(named, tpEpoch{k, l.epoch})
		progress = append(progress, &assignerv1.LeaseProgress{
			Topic: k.Topic, Partition: k.Partition, Epoch: l.epoch, Position: 100, CommittedOffset: 100,
		})
	}
	s.sent[s.seq] = sent{now, named}
	return &assignerv1.SessionRequest{Kind: &assignerv1.SessionRequest_Heartbeat{Heartbeat: &assignerv1.SessionHeartbeat{
		Seq: s.seq, Leases: progress, ReleasedLeases: released,
	}}}
}

// onAck renews what the ack renews and drops what it named but did not; the send time
// (ok false for an ack of an unknown seq). Caller holds mu.
func (s *sidecar) onAck(ack *assignerv1.HeartbeatAck) (float64, bool) {
	entry, ok := s.sent[ack.Seq]
	delete(s.sent, ack.Seq)
	for seq := range s.sent {
		if seq < ack.Seq {
			delete(s.sent, seq)
		}
	}
	if !ok {
		return 0, false
	}
	renewed := make(map[tpEpoch]bool, len(ack.RenewedLeases))
	for _, r := range ack.RenewedLeases {
		key := tpEpoch{tp{r.Topic, r.Partition}, r.Epoch}
		renewed[key] = true
		if l := s.leases[key.tp]; l != nil && l.epoch == r.Epoch {
			l.deadline = entry.at + ttl - safetyMargin
			l.confirmed = true
		}
	}
	for _, n := range entry.named {
		if renewed[n] {
			continue
		}
		if l := s.leases[n.tp]; l != nil && l.epoch == n.Epoch {
			delete(s.leases, n.tp) // the assigner no longer counts it ours
			s.changes++
		}
	}
	return entry.at, true
}

// window counts acks of calls sent within [start, end) that arrive by end + ackGrace.
type window struct {
	start, end float64
	acks       int
	latencies  []float64
}

func (w *window) record(sentAt, now float64) {
	if w.start <= sentAt && sentAt < w.end && now <= w.end+ackGrace {
		w.acks++
		w.latencies = append(w.latencies, now-sentAt)
	}
}

// load is the state the sidecars share: the window, failed calls, the re-place watch.
type load struct {
	mu       sync.Mutex
	interval float64
	win      window
	errors   map[string]int
	watching map[tp]bool
	liveAt   map[tp]float64
}

func (g *load) record(sentAt, now float64) {
	g.mu.Lock()
	g.win.record(sentAt, now)
	g.mu.Unlock()
}

func (g *load) failed(err error) {
	g.mu.Lock()
	g.errors[status.Code(err).String()]++
	g.mu.Unlock()
}

// checkWatch notes watched partitions this sidecar now holds live (caller holds s.mu).
func (g *load) checkWatch(s *sidecar, now float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k := range g.watching {
		if l := s.leases[k]; l != nil && l.confirmed {
			if _, seen := g.liveAt[k]; !seen {
				g.liveAt[k] = now
			}
		}
	}
}

// drive runs session after session until the sidecar is killed: a broken stream (the
// assigner dropped a member it found lost) is re-attached after a second, and a refused
// join (JOIN_THROTTLED) retried after its retry-after plus up to half of it again, as the
// sidecar's session loop does (dsclient.connection.pause_before_retry).
func drive(s *sidecar, client assignerv1.AssignerServiceClient, g *load) {
	for {
		err := session(s, client, g)
		s.mu.Lock()
		killed := s.killed
		s.joined = false
		s.mu.Unlock()
		if killed {
			return
		}
		if err != nil {
			g.failed(err)
		}
		s.mu.Lock()
		s.rejoins++
		s.mu.Unlock()
		time.Sleep(pauseBeforeRetry(err, rand.Float64()))
	}
}

// pauseBeforeRetry is the pause after a failed session: at least the assigner's
// retry-after (ErrorInfo metadata retry_after_ms) plus up to half of it again for a draw
// in [0, 1), else the fixed re-attach pause.
func pauseBeforeRetry(err error, draw float64) time.Duration {
	asked, ok := retryAfter(err)
	if !ok {
		return reattach
	}
	return max(reattach, time.Duration(float64(asked)*(1+draw/2)))
}

// retryAfter reads a JOIN_THROTTLED refusal's retry_after_ms.
func retryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return 0, false
	}
	for _, detail := range st.Details() {
		info, isInfo := detail.(*errdetails.ErrorInfo)
		if !isInfo {
			continue
		}
		ms, convErr := strconv.Atoi(info.GetMetadata()["retry_after_ms"])
		if convErr != nil {
			return 0, false
		}
		return time.Duration(ms) * time.Millisecond, true
	}
	return 0, false
}

// session is one Session stream: a sender (join, then paced heartbeats) beside the
// receive loop, which applies grants, revokes and acks.
func session(s *sidecar, client assignerv1.AssignerServiceClient, g *load) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.mu.Lock()
	if s.killed {
		s.mu.Unlock()
		return nil
	}
	s.seq, s.sent, s.cancel = 0, map[int64]sent{}, cancel
	s.mu.Unlock()
	stream, err := client.Session(ctx)
	if err != nil {
		return err
	}
	wake := make(chan struct{}, 1)  // a grant or revoke: heartbeat now (paced mode)
	kick := make(chan struct{}, 1)  // closed loop: the previous heartbeat was acked
	accepted := make(chan struct{}) // the join was accepted
	done := make(chan struct{})     // the receive loop ended
	signal := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	sendErr := make(chan error, 1)
	go func() { sendErr <- pace(s, stream, g.interval, wake, kick, accepted, done) }()

	var recvErr error
	acceptedOnce := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		now := monotonic()
		s.mu.Lock()
		switch kind := resp.Kind.(type) {
		case *assignerv1.SessionResponse_Accepted:
			s.joined = true
			if !acceptedOnce {
				acceptedOnce = true
				close(accepted)
			}
		case *assignerv1.SessionResponse_Grant:
			gr := kind.Grant
			// Held from now; live from the first ack renewing it (sent at once).
			s.leases[tp{gr.Topic, gr.Partition}] = &lease{epoch: gr.Epoch, deadline: now + ttl - safetyMargin}
			s.changes++
			signal(wake)
		case *assignerv1.SessionResponse_Revoke:
			r := kind.Revoke
			key := tp{r.Topic, r.Partition}
			epoch := r.Epoch
			if l := s.leases[key]; l != nil {
				epoch = l.epoch
				delete(s.leases, key)
			}
			s.released = append(s.released, &assignerv1.ReleasedLease{
				Topic: r.Topic, Partition: r.Partition, Epoch: epoch, CommittedOffset: 100,
			})
			s.changes++
			signal(wake)
		case *assignerv1.SessionResponse_HeartbeatAck:
			if at, ok := s.onAck(kind.HeartbeatAck); ok {
				g.record(at, now)
				g.checkWatch(s, now)
				if g.interval <= 0 && kind.HeartbeatAck.Seq == s.seq {
					signal(kick)
				}
			}
		}
		s.mu.Unlock()
	}
	close(done)
	cancel()
	<-sendErr
	s.mu.Lock()
	killed := s.killed
	s.mu.Unlock()
	if killed {
		return nil
	}
	return recvErr
}

// pace sends the join, then a heartbeat every interval at a random phase (or at once on a
// grant or revoke), or in a closed loop at interval 0.
func pace(
	s *sidecar,
	stream grpc.BidiStreamingClient[assignerv1.SessionRequest, assignerv1.SessionResponse],
	interval float64,
	wake, kick, accepted, done chan struct{},
) error {
	send := func() error {
		s.mu.Lock()
		req := s.heartbeat(monotonic())
		s.mu.Unlock()
		return stream.Send(req)
	}
	s.mu.Lock()
	join := s.join(monotonic())
	s.mu.Unlock()
	if err := stream.Send(join); err != nil {
		return err
	}
	select {
	case <-accepted:
	case <-done:
		return nil
	}
	period := time.Duration(interval * float64(time.Second))
	if interval <= 0 {
		for {
			if err := send(); err != nil {
				return err
			}
			select {
			case <-kick:
			case <-done:
				return nil
			}
		}
	}
	// Spread the sidecars' heartbeats over the interval, as independent sidecars are.
	phase := time.NewTimer(time.Duration(rand.Float64() * float64(period)))
	select {
	case <-phase.C:
	case <-done:
		return nil
	}
	timer := time.NewTimer(period)
	for {
		select {
		case <-wake:
			timer.Stop()
		case <-timer.C:
		case <-done:
			return nil
		}
		if err := send(); err != nil {
			return err
		}
		timer.Reset(period)
	}
}

// healthLoop is the baseline: a health Check every interval until `until`.
func healthLoop(client healthpb.HealthClient, g *load, until float64) {
	time.Sleep(time.Duration(rand.Float64() * max(g.interval, 0.001) * float64(time.Second)))
	for {
		sentAt := monotonic()
		if sentAt >= until {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			g.failed(err)
			continue
		}
		g.record(sentAt, monotonic())
		if g.interval > 0 {
			time.Sleep(time.Duration(max(0, sentAt+g.interval-monotonic()) * float64(time.Second)))
		}
	}
}

// openWindow starts counting acks in the window [t0, t1) a command [name, t0, t1] gives;
// its end, and whether the command had one.
func (g *load) openWindow(cmd []json.RawMessage) (float64, bool) {
	var t0, t1 float64
	if len(cmd) != 3 || json.Unmarshal(cmd[1], &t0) != nil || json.Unmarshal(cmd[2], &t1) != nil {
		return 0, false
	}
	g.mu.Lock()
	g.win = window{start: t0, end: t1}
	g.mu.Unlock()
	return t1, true
}

type options struct {
	addr        string
	group       string
	sidecars    int
	interval    float64
	connections int // 0: one per sidecar
}

func parseArgs(argv []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("sessionload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "", "the assigner's gRPC address HOST:PORT")
	fs.StringVar(&o.group, "group", "", "the consumer group the sidecars join")
	fs.IntVar(&o.sidecars, "sidecars", 0, "simulated sidecars")
	fs.Float64Var(&o.interval, "interval", 1.0, "heartbeat interval in seconds; 0: closed loop")
	conns := fs.String("connections", "48", "HTTP/2 connections the sidecars share, or per-sidecar")
	if err := fs.Parse(argv); err != nil {
		return o, err
	}
	if o.addr == "" || o.group == "" || o.sidecars < 1 || o.interval < 0 {
		return o, errors.New("--addr, --group and --sidecars >= 1 are required, --interval >= 0")
	}
	if *conns == "per-sidecar" {
		o.connections = 0
	} else {
		n, err := strconv.Atoi(*conns)
		if err != nil || n < 1 {
			return o, fmt.Errorf("--connections %q: a count >= 1 or per-sidecar", *conns)
		}
		o.connections = min(n, o.sidecars)
	}
	return o, nil
}

// dial opens the connections and waits until each is ready.
func dial(addr string, n int) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		c, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithSharedWriteBuffer(true))
		if err != nil {
			return nil, err
		}
		c.Connect()
		conns[i] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, c := range conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				return nil, fmt.Errorf("connecting to %s: %v", addr, ctx.Err())
			}
		}
	}
	return conns, nil
}

type pair struct {
	Topic     string
	Partition int32
}

func (p pair) MarshalJSON() ([]byte, error) { return json.Marshal([]any{p.Topic, p.Partition}) }

func (p *pair) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 2 {
		return fmt.Errorf("a partition is [topic, partition]: %s", b)
	}
	if err := json.Unmarshal(raw[0], &p.Topic); err != nil {
		return err
	}
	return json.Unmarshal(raw[1], &p.Partition)
}

func run(argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseArgs(argv, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	n := o.connections
	layout := fmt.Sprintf("%d shared connections", n)
	if n == 0 {
		n, layout = o.sidecars, "one connection per sidecar"
	}
	conns, err := dial(o.addr, n)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stderr, "sessionload: %d sidecars, %s\n", o.sidecars, layout)
	g := &load{interval: o.interval, errors: map[string]int{}, watching: map[tp]bool{}, liveAt: map[tp]float64{}}
	out := json.NewEncoder(stdout)
	reply := func(v any) {
		if err := out.Encode(v); err != nil {
			os.Exit(1) // the bench is gone
		}
	}
	reply("ready")
	var sims []*sidecar
	lines := bufio.NewScanner(stdin)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	for lines.Scan() {
		var cmd []json.RawMessage
		var name string
		if err := json.Unmarshal(lines.Bytes(), &cmd); err != nil || len(cmd) == 0 || json.Unmarshal(cmd[0], &name) != nil {
			fmt.Fprintf(stderr, "not a command: %s\n", lines.Text())
			return 2
		}
		now := monotonic()
		switch name {
		case "baseline":
			t1, ok := g.openWindow(cmd)
			if !ok {
				fmt.Fprintf(stderr, "baseline needs t0 t1: %s\n", lines.Text())
				return 2
			}
			var wg sync.WaitGroup
			for i := range o.sidecars {
				wg.Go(func() { healthLoop(healthpb.NewHealthClient(conns[i%len(conns)]), g, t1) })
			}
			wg.Wait()
			g.mu.Lock()
			reply([]any{"baseline", g.win.acks, nonNil(g.win.latencies), g.errors})
			g.win, g.errors = window{}, map[string]int{}
			g.mu.Unlock()
		case "sessions":
			var ramp float64
			if len(cmd) > 1 && json.Unmarshal(cmd[1], &ramp) != nil {
				fmt.Fprintf(stderr, "sessions takes a ramp in seconds: %s\n", lines.Text())
				return 2
			}
			for i := range o.sidecars {
				s := newSidecar(fmt.Sprintf("sim-%05d", i), o.group)
				sims = append(sims, s)
				delay := time.Duration(rand.Float64() * ramp * float64(time.Second))
				client := assignerv1.NewAssignerServiceClient(conns[i%len(conns)])
				go func() {
					time.Sleep(delay)
					drive(s, client, g)
				}()
			}
			reply(nil)
		case "status":
			held, changes, joined, rejoins := 0, 0, 0, 0
			for _, s := range sims {
				s.mu.Lock()
				held += len(s.held(now))
				changes += s.changes
				rejoins += s.rejoins
				if s.joined {
					joined++
				}
				s.mu.Unlock()
			}
			reply([]int{held, changes, joined, rejoins})
		case "window":
			if _, ok := g.openWindow(cmd); !ok {
				fmt.Fprintf(stderr, "window needs t0 t1: %s\n", lines.Text())
				return 2
			}
			reply(nil)
		case "results":
			g.mu.Lock()
			reply([]any{g.win.acks, nonNil(g.win.latencies), g.errors})
			g.mu.Unlock()
		case "kill":
			var victim *sidecar
			var lost []tp
			for _, s := range sims {
				s.mu.Lock()
				if h := s.held(now); victim == nil || len(h) > len(lost) {
					victim, lost = s, h
				}
				s.mu.Unlock()
			}
			out := []pair{}
			if victim != nil {
				victim.mu.Lock()
				victim.killed = true
				if victim.cancel != nil {
					victim.cancel() // the stream breaks; no Leave: the assigner finds it lost
				}
				victim.mu.Unlock()
				for _, k := range lost {
					out = append(out, pair(k))
				}
			}
			reply(out)
		case "watch":
			var watch []pair
			if len(cmd) != 2 || json.Unmarshal(cmd[1], &watch) != nil {
				fmt.Fprintf(stderr, "watch needs [[topic, partition]]: %s\n", lines.Text())
				return 2
			}
			g.mu.Lock()
			g.watching, g.liveAt = map[tp]bool{}, map[tp]float64{}
			for _, p := range watch {
				g.watching[tp(p)] = true
			}
			g.mu.Unlock()
			reply(nil)
		case "live":
			g.mu.Lock()
			live := [][]any{}
			for k, at := range g.liveAt {
				live = append(live, []any{k.Topic, k.Partition, at})
			}
			g.mu.Unlock()
			reply(live)
		case "stop":
			for _, c := range conns {
				c.Close()
			}
			reply(nil)
			return 0
		default:
			fmt.Fprintf(stderr, "unknown command %q\n", name)
			return 2
		}
	}
	return 0 // stdin closed: the bench is gone
}

func nonNil(xs []float64) []float64 {
	if xs == nil {
		return []float64{}
	}
	return xs
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
