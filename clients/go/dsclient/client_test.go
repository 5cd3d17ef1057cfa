package dsclient

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// fakeAssigner is an in-process BindingService: bind answers Bind, watch feeds every
// WatchBinding stream, unbinds are counted.
type fakeAssigner struct {
	assignerv1.UnimplementedBindingServiceServer
	addr string

	mu      sync.Mutex
	bind    func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error)
	binds   int
	unbinds int
	watch   chan *assignerv1.Binding
	ends    chan error // ends the open WatchBinding stream with this status
	known   []int64    // the known_version of each WatchBinding
}

func (f *fakeAssigner) Bind(ctx context.Context, req *assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
	f.mu.Lock()
	f.binds++
	bind := f.bind
	f.mu.Unlock()
	resp, err := bind(req)
	if err != nil && reasonOf(err) == "NOT_LEADER" {
		st, _ := status.FromError(err)
		if info := errorInfo(st); info != nil {
			_ = grpc.SetTrailer(ctx, metadata.Pairs(LeaderMetadataKey, info.GetMetadata()["leader"]))
		}
	}
	return resp, err
}

func (f *fakeAssigner) WatchBinding(req *assignerv1.WatchBindingRequest, s grpc.ServerStreamingServer[assignerv1.WatchBindingResponse]) error {
	f.mu.Lock()
	f.known = append(f.known, req.GetKnownVersion())
	f.mu.Unlock()
	for {
		select {
		case <-s.Context().Done():
			return nil
		case err := <-f.ends:
			if st, ok := status.FromError(err); ok {
				if info := errorInfo(st); info != nil && info.GetReason() == "NOT_LEADER" {
					s.SetTrailer(metadata.Pairs(LeaderMetadataKey, info.GetMetadata()["leader"]))
				}
			}
			return err
		case b := <-f.watch:
			if err := s.Send(&assignerv1.WatchBindingResponse{Binding: b}); err != nil {
				return err
			}
		}
	}
}

func (f *fakeAssigner) Unbind(context.Context, *assignerv1.UnbindRequest) (*assignerv1.UnbindResponse, error) {
	f.mu.Lock()
	f.unbinds++
	f.mu.Unlock()
	return &assignerv1.UnbindResponse{}, nil
}

func (f *fakeAssigner) calls() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.binds, f.unbinds
}

// fakeSidecar is an in-process StreamService: fetch answers Fetch; acks and nacks are kept.
type fakeSidecar struct {
	sidecarv1.UnimplementedStreamServiceServer
	addr string

	mu      sync.Mutex
	fetch   func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error)
	fetches []time.Duration // the max_wait of each Fetch
	present []bool          // whether each Fetch had max_wait set
	acks    []*sidecarv1.AckRequest
	nacks   []*sidecarv1.NackRequest
}

func (f *fakeSidecar) Fetch(_ context.Context, req *sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
	f.mu.Lock()
	f.fetches = append(f.fetches, req.GetMaxWait().AsDuration())
	f.present = append(f.present, req.MaxWait != nil)
	fetch := f.fetch
	f.mu.Unlock()
	if fetch == nil {
		time.Sleep(min(req.GetMaxWait().AsDuration(), 50*time.Millisecond))
		return &sidecarv1.FetchResponse{}, nil
	}
	return fetch(req)
}

func (f *fakeSidecar) Ack(_ context.Context, req *sidecarv1.AckRequest) (*sidecarv1.AckResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acks = append(f.acks, req)
	resp := &sidecarv1.AckResponse{}
	for _, r := range req.GetRanges() {
		if r.GetLeaseEpoch() < 0 {
			resp.RejectedRanges = append(resp.RejectedRanges, &sidecarv1.RejectedRangeAck{Ack: r, Reason: sidecarv1.RejectReason_REJECT_REASON_STALE_EPOCH})
		} else {
			resp.AckedCount++
		}
	}
	return resp, nil
}

func (f *fakeSidecar) Nack(_ context.Context, req *sidecarv1.NackRequest) (*sidecarv1.NackResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nacks = append(f.nacks, req)
	return &sidecarv1.NackResponse{NackedCount: int64(len(req.GetRanges()))}, nil
}

func (f *fakeSidecar) snapshot() ([]time.Duration, []*sidecarv1.AckRequest, []*sidecarv1.NackRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.fetches...), append([]*sidecarv1.AckRequest(nil), f.acks...), append([]*sidecarv1.NackRequest(nil), f.nacks...)
}

// serve runs register's services on a loopback port (ds-leader names real addresses).
func serve(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	s := grpc.NewServer()
	register(s)
	return serveOn(t, s, "tcp", "127.0.0.1:0")
}

// serveOn runs s on a new listener (network "tcp" or "unix") until the test ends, and
// returns the listener's address.
func serveOn(t *testing.T, s *grpc.Server, network, address string) string {
	t.Helper()
	lis, err := net.Listen(network, address)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func newFakeAssigner(t *testing.T, bind func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error)) *fakeAssigner {
	f := &fakeAssigner{bind: bind, watch: make(chan *assignerv1.Binding, 16), ends: make(chan error, 4)}
	f.addr = serve(t, func(s *grpc.Server) { assignerv1.RegisterBindingServiceServer(s, f) })
	return f
}

func newFakeSidecar(t *testing.T) *fakeSidecar {
	f := &fakeSidecar{}
	f.addr = serve(t, func(s *grpc.Server) { sidecarv1.RegisterStreamServiceServer(s, f) })
	return f
}

func bound(b *assignerv1.Binding) func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
	return func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
		return &assignerv1.BindResponse{Binding: proto.Clone(b).(*assignerv1.Binding)}, nil
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// C4: a standby's NOT_LEADER naming the leader is followed at once, and the client then
// talks to the leader.
func TestBindFollowsTheLeaderNamedByAStandby(t *testing.T) {
	leader := newFakeAssigner(t, bound(binding(1)))
	standby := newFakeAssigner(t, func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
		return nil, statusWith(codes.FailedPrecondition, "NOT_LEADER", map[string]string{"leader": leader.addr})
	})
	started := time.Now()
	c, err := New(testContext(t), "g", WithAssigners(standby.addr), WithClientID("c1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took := time.Since(started); took > 2*time.Second {
		t.Errorf("following took %v", took)
	}
	if c.Assigner() != leader.addr {
		t.Errorf("talks to %s, want the leader %s", c.Assigner(), leader.addr)
	}
	if sb, _ := standby.calls(); sb != 1 {
		t.Errorf("the standby was called %d times", sb)
	}
}

// C5: NOT_LEADER without a leader (an election) is waited out with backoff.
func TestAnElectionIsWaitedOut(t *testing.T) {
	var n int
	var mu sync.Mutex
	asg := newFakeAssigner(t, func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n < 3 {
			return nil, statusWith(codes.FailedPrecondition, "NOT_LEADER", map[string]string{"leader": ""})
		}
		return &assignerv1.BindResponse{Binding: binding(1)}, nil
	})
	c, err := New(testContext(t), "g", WithAssigners(asg.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if binds, _ := asg.calls(); binds != 3 {
		t.Errorf("%d Bind calls, want 3", binds)
	}
}

// C2, C6: an unknown group is surfaced at once, typed, and not retried.
func TestAnUnknownGroupIsSurfacedAtOnce(t *testing.T) {
	asg := newFakeAssigner(t, func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
		return nil, statusWith(codes.NotFound, "GROUP_NOT_FOUND", map[string]string{"group": "nope"})
	})
	_, err := New(testContext(t), "nope", WithAssigners(asg.addr))
	if !errors.Is(err, ErrGroupNotFound) {
		t.Fatalf("New = %v, want ErrGroupNotFound", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.NotFound || e.Reason != "GROUP_NOT_FOUND" {
		t.Errorf("error: %#v", err)
	}
	if binds, _ := asg.calls(); binds != 1 {
		t.Errorf("%d Bind calls, want 1 (no retry)", binds)
	}
}

// C8: an endless election ends after 8 attempts.
func TestTheAttemptBudgetEndsAnEndlessElection(t *testing.T) {
	asg := newFakeAssigner(t, func(*assignerv1.BindRequest) (*assignerv1.BindResponse, error) {
		return nil, status.Error(codes.Unavailable, "starting")
	})
	_, err := New(testContext(t), "g", WithAssigners(asg.addr))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New = %v, want ErrUnavailable", err)
	}
	// gRPC retries UNAVAILABLE by itself (4 attempts per call) under the 8 of the policy.
	if binds, _ := asg.calls(); binds != 8*4 {
		t.Errorf("%d Bind calls, want %d", binds, 8*4)
	}
}

// C18: the rotation sweeps with max_wait 0, then long-polls the last one; one sidecar is
// long-polled at once.
func TestFetchSweepsThenLongPollsTheLastOfTheRotation(t *testing.T) {
	a, b := newFakeSidecar(t), newFakeSidecar(t)
	asg := newFakeAssigner(t, bound(binding(1, a.addr, b.addr)))
	c, err := New(testContext(t), "g", WithAssigners(asg.addr), WithMaxWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	records, err := c.Fetch(testContext(t))
	if err != nil || len(records) != 0 {
		t.Fatalf("Fetch = %v, %v", records, err)
	}
	// Pass 1 sweeps both with max_wait 0; each later pass sweeps the first of the rotation
	// and long-polls the last, and the rotation moves on, so both get long polls.
	for name, f := range map[string]*fakeSidecar{"a": a, "b": b} {
		waits, _, _ := f.snapshot()
		long := 0
		for _, w := range waits {
			if w > 300*time.Millisecond {
				t.Errorf("%s: a max_wait of %v past the fetch's 300 ms", name, w)
			}
			if w > 0 {
				long++
			}
		}
		if len(waits) < 2 || waits[0] != 0 || long == 0 || long == len(waits) {
			t.Errorf("%s: max_wait per call %v; want a sweep at 0 first, then long polls and sweeps", name, waits)
		}
	}

	one := newFakeSidecar(t)
	asg1 := newFakeAssigner(t, bound(binding(1, one.addr)))
	c1, err := New(testContext(t), "g", WithAssigners(asg1.addr), WithMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	_, _ = c1.Fetch(testContext(t))
	if f, _, _ := one.snapshot(); len(f) == 0 || f[0] < 150*time.Millisecond {
		t.Errorf("a single sidecar is long-polled at once: %v", f)
	}
}

func batchFrom(offsets ...int64) *sidecarv1.FetchResponse {
	lengths := make([]int32, len(offsets))
	for i := range lengths {
		lengths[i] = -1
	}
	return &sidecarv1.FetchResponse{Batches: []*sidecarv1.RecordBatch{{Topic: "t", Partition: 1, LeaseEpoch: 5, Offsets: le64(offsets...), ValueLengths: le32(lengths...)}}}
}

// C17, C19, C28: an unavailable sidecar is skipped; a new binding moves reading to the
// new sidecar; acks go to the sidecar that delivered the records, dropped once it left.
func TestTheClientFollowsTheBindingAndAcksWhereTheRecordsCameFrom(t *testing.T) {
	a, b := newFakeSidecar(t), newFakeSidecar(t)
	a.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) { return batchFrom(0, 1, 2), nil }
	b.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) { return batchFrom(3, 4), nil }
	asg := newFakeAssigner(t, bound(binding(1, a.addr)))
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(asg.addr), WithClientID("me"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fromA, err := c.Fetch(ctx)
	if err != nil || len(fromA) != 3 {
		t.Fatalf("Fetch from a = %v, %v", fromA, err)
	}
	asg.watch <- binding(2, b.addr)
	deadline := time.Now().Add(5 * time.Second)
	for len(c.Endpoints()) != 1 || c.Endpoints()[0].Address != b.addr {
		if time.Now().After(deadline) {
			t.Fatalf("binding not followed: %v", c.Endpoints())
		}
		time.Sleep(10 * time.Millisecond)
	}
	fromB, err := c.Fetch(ctx)
	if err != nil || len(fromB) != 2 || fromB[0].Offset != 3 {
		t.Fatalf("Fetch from b = %v, %v", fromB, err)
	}
	if n, err := c.Ack(ctx, fromB); n != 2 || err != nil {
		t.Errorf("Ack of b's records = %d, %v", n, err)
	}
	if n, err := c.Ack(ctx, fromA); n != 0 || err != nil {
		t.Errorf("Ack of the records of a sidecar no longer bound = %d, %v; want 0 (dropped)", n, err)
	}
	_, aAcks, _ := a.snapshot()
	_, bAcks, _ := b.snapshot()
	if len(aAcks) != 0 || len(bAcks) != 1 {
		t.Fatalf("acks: a %d, b %d", len(aAcks), len(bAcks))
	}
	r := bAcks[0].GetRanges()
	if bAcks[0].GetClientId() != "me" || len(r) != 1 || r[0].GetFromOffset() != 3 || r[0].GetToOffset() != 5 || r[0].GetLeaseEpoch() != 5 {
		t.Errorf("ack sent: %v", bAcks[0])
	}
	// A refused range is not counted (C31).
	stale := append([]Record(nil), fromB...)
	for i := range stale {
		stale[i].LeaseEpoch = -1
	}
	if n, _ := c.Ack(ctx, stale); n != 0 {
		t.Errorf("refused records counted: %d", n)
	}
}

// C19: an unavailable sidecar is skipped, nothing surfaced; another status is surfaced typed.
func TestFetchSkipsAnUnavailableSidecarAndSurfacesOtherStatuses(t *testing.T) {
	down := newFakeSidecar(t)
	down.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
		return nil, status.Error(codes.Unavailable, "gone")
	}
	up := newFakeSidecar(t)
	up.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) { return batchFrom(7), nil }
	asg := newFakeAssigner(t, bound(binding(1, down.addr, up.addr)))
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(asg.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		rs, err := c.Fetch(ctx)
		if err != nil || len(rs) != 1 || rs[0].Offset != 7 {
			t.Fatalf("Fetch = %v, %v", rs, err)
		}
	}
	up.mu.Lock()
	up.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
		return nil, statusWith(codes.NotFound, "GROUP_NOT_SERVED", map[string]string{"served_group": "other"})
	}
	up.mu.Unlock()
	if _, err := c.Fetch(ctx); !errors.Is(err, ErrGroupNotServed) {
		t.Errorf("Fetch = %v, want ErrGroupNotServed", err)
	}
}

// C38: Close gives back what was not acked (Nack all) and unbinds.
func TestCloseGivesBackAndUnbinds(t *testing.T) {
	a := newFakeSidecar(t)
	asg := newFakeAssigner(t, bound(binding(1, a.addr)))
	c, err := New(testContext(t), "g", WithAssigners(asg.addr), WithClientID("me"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, nacks := a.snapshot()
	if len(nacks) != 1 || !nacks[0].GetAll() || nacks[0].GetClientId() != "me" {
		t.Errorf("nacks at close: %v", nacks)
	}
	if _, unbinds := asg.calls(); unbinds != 1 {
		t.Errorf("%d unbinds", unbinds)
	}
	if _, err := c.Fetch(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Fetch after Close = %v", err)
	}
	_ = c.Close()
}

// C46: a token is never sent over plaintext: the configuration is refused.
func TestATokenWithoutTLSIsRefused(t *testing.T) {
	_, err := New(context.Background(), "g", WithAssigners("127.0.0.1:1"), WithToken("secret"))
	if !errors.Is(err, ErrInsecureToken) {
		t.Errorf("New = %v, want ErrInsecureToken", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// C14: a watch that ends (WATCHER_TOO_SLOW) is opened again with the held version.
// C15: a watch ended by NOT_LEADER naming another assigner re-binds there and takes its
// binding whatever its version.
func TestTheWatchIsOpenedAgainAndFollowsANewLeader(t *testing.T) {
	a, b := newFakeSidecar(t), newFakeSidecar(t)
	first := newFakeAssigner(t, bound(binding(7, a.addr)))
	c, err := New(testContext(t), "g", WithAssigners(first.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "the first watch", func() bool { first.mu.Lock(); defer first.mu.Unlock(); return len(first.known) == 1 })
	first.ends <- statusWith(codes.ResourceExhausted, "WATCHER_TOO_SLOW", nil)
	waitFor(t, "the watch again", func() bool { first.mu.Lock(); defer first.mu.Unlock(); return len(first.known) == 2 })
	first.mu.Lock()
	if first.known[0] != 7 || first.known[1] != 7 {
		t.Errorf("known versions %v, want the held 7 both times", first.known)
	}
	first.mu.Unlock()

	second := newFakeAssigner(t, bound(binding(1, b.addr)))
	first.ends <- statusWith(codes.FailedPrecondition, "NOT_LEADER", map[string]string{"leader": second.addr})
	waitFor(t, "the new leader's binding", func() bool {
		eps := c.Endpoints()
		return len(eps) == 1 && eps[0].Address == b.addr
	})
	if c.Assigner() != second.addr {
		t.Errorf("talks to %s, want %s", c.Assigner(), second.addr)
	}
	waitFor(t, "a watch on the new leader", func() bool { second.mu.Lock(); defer second.mu.Unlock(); return len(second.known) == 1 })
	second.mu.Lock()
	defer second.mu.Unlock()
	if second.known[0] != 1 {
		t.Errorf("watch on the new leader with known version %d, want 1 (its binding's)", second.known[0])
	}
}

// C54: a watch ended by NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED or UNAUTHENTICATED
// stops (no watch is opened again), and the next Fetch and Stream return that error, typed.
func TestATerminalWatchErrorStopsTheWatchAndIsSurfacedByTheNextRead(t *testing.T) {
	for _, tc := range []struct {
		code   codes.Code
		reason string
		is     error
	}{
		{codes.NotFound, "GROUP_NOT_FOUND", ErrGroupNotFound},
		{codes.InvalidArgument, "INVALID_FIELD", ErrInvalidArgument},
		{codes.PermissionDenied, "FORBIDDEN", ErrPermissionDenied},
		{codes.Unauthenticated, "", ErrUnauthenticated},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			a := newFakeSidecar(t)
			asg := newFakeAssigner(t, bound(binding(3, a.addr)))
			ctx := testContext(t)
			c, err := New(ctx, "g", WithAssigners(asg.addr), WithMaxWait(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Fetch(ctx); err != nil {
				t.Fatalf("Fetch before the watch ended: %v", err)
			}
			waitFor(t, "the watch", func() bool { asg.mu.Lock(); defer asg.mu.Unlock(); return len(asg.known) == 1 })
			var end error = status.Error(tc.code, "refused")
			if tc.reason != "" {
				end = statusWith(tc.code, tc.reason, nil)
			}
			asg.ends <- end
			var fetchErr error
			waitFor(t, "Fetch to surface the watch's error", func() bool {
				_, fetchErr = c.Fetch(ctx)
				return fetchErr != nil
			})
			var e *Error
			if !errors.Is(fetchErr, tc.is) || !errors.As(fetchErr, &e) || e.Code != tc.code || e.Reason != tc.reason || e.Op != "WatchBinding" {
				t.Errorf("Fetch = %#v, want %v from WatchBinding with reason %q", fetchErr, tc.code, tc.reason)
			}
			for _, err := range c.Stream(ctx) {
				if !errors.Is(err, tc.is) {
					t.Errorf("Stream = %v, want %v", err, tc.is)
				}
				break
			}
			// Stopped: no watch again, however long the re-watch backoff (0.1 s first).
			time.Sleep(500 * time.Millisecond)
			asg.mu.Lock()
			defer asg.mu.Unlock()
			if len(asg.known) != 1 {
				t.Errorf("%d watches; want 1 (the watch stops)", len(asg.known))
			}
		})
	}
}
