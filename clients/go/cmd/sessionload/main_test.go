package main

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
)

func TestAckRenewsFromSendTimeAndDropsWhatItDidNotRenew(t *testing.T) {
	s := newSidecar("sim-00000", "g")
	a, b := tp{"t", 0}, tp{"t", 1}
	s.leases[a] = &lease{epoch: 1, deadline: 10}
	s.leases[b] = &lease{epoch: 2, deadline: 10}
	hb := s.heartbeat(5).GetHeartbeat()
	if hb.Seq != 1 || len(hb.Leases) != 2 {
		t.Fatalf("heartbeat %v", hb)
	}
	at, ok := s.onAck(&assignerv1.HeartbeatAck{Seq: 1, RenewedLeases: []*assignerv1.LeaseRef{
		{Topic: "t", Partition: 0, Epoch: 1},
	}})
	if !ok || at != 5 {
		t.Fatalf("ack: %v %v", at, ok)
	}
	if l := s.leases[a]; l == nil || !l.confirmed || l.deadline != 5+ttl-safetyMargin {
		t.Fatalf("renewed lease %+v", l)
	}
	if _, held := s.leases[b]; held {
		t.Fatal("a lease the ack named but did not renew is still held")
	}
	if got := s.held(6); len(got) != 1 || got[0] != a {
		t.Fatalf("held %v", got)
	}
	if _, ok := s.onAck(&assignerv1.HeartbeatAck{Seq: 1}); ok {
		t.Fatal("an ack of a seq already acked was applied twice")
	}
}

func TestHeartbeatDropsLeasesPastTheirDeadline(t *testing.T) {
	s := newSidecar("sim-00000", "g")
	s.leases[tp{"t", 0}] = &lease{epoch: 1, deadline: 4, confirmed: true}
	if n := len(s.heartbeat(4).GetHeartbeat().Leases); n != 0 || len(s.leases) != 0 || s.changes != 1 {
		t.Fatalf("named %d, kept %v", n, s.leases)
	}
	if j := s.join(4).GetJoin(); j.SidecarId != "sim-00000" || len(j.HeldLeases) != 0 {
		t.Fatalf("join %v", j)
	}
}

func TestWindowCountsAcksOfCallsSentWithinIt(t *testing.T) {
	w := window{start: 10, end: 20}
	w.record(9.9, 10.1)         // sent before
	w.record(10, 10.2)          // counted
	w.record(19.9, 20+ackGrace) // counted: within the grace
	w.record(19.9, 20+ackGrace+0.1)
	w.record(20, 20.1) // sent after
	if w.acks != 2 || len(w.latencies) != 2 {
		t.Fatalf("window %+v", w)
	}
}

func TestBadArguments(t *testing.T) {
	for _, argv := range [][]string{
		{},
		{"--addr", "a:1", "--group", "g"},
		{"--addr", "a:1", "--group", "g", "--sidecars", "2", "--connections", "0"},
		{"--addr", "a:1", "--group", "g", "--sidecars", "2", "--connections", "some"},
	} {
		var out, errb bytes.Buffer
		if code := run(argv, &bytes.Buffer{}, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", argv, code)
		}
	}
	o, err := parseArgs([]string{"--addr", "a:1", "--group", "g", "--sidecars", "5", "--connections", "per-sidecar"}, &bytes.Buffer{})
	if err != nil || o.connections != 0 {
		t.Fatalf("per-sidecar: %+v %v", o, err)
	}
	o, err = parseArgs([]string{"--addr", "a:1", "--group", "g", "--sidecars", "5", "--connections", "48"}, &bytes.Buffer{})
	if err != nil || o.connections != 5 {
		t.Fatalf("48 shared by 5 sidecars: %+v %v", o, err)
	}
}

func TestAThrottledJoinWaitsItsRetryAfterWithJitter(t *testing.T) {
	st, err := status.New(codes.Unavailable, "join throttled").WithDetails(&errdetails.ErrorInfo{
		Reason: "JOIN_THROTTLED", Metadata: map[string]string{"retry_after_ms": "3000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	throttled := st.Err()
	if got := pauseBeforeRetry(throttled, 0); got != 3*time.Second {
		t.Fatalf("draw 0: %v, want the retry-after", got)
	}
	if got := pauseBeforeRetry(throttled, 0.999); got <= 4400*time.Millisecond || got > 4500*time.Millisecond {
		t.Fatalf("draw ~1: %v, want up to half again", got)
	}
	if got := pauseBeforeRetry(status.Error(codes.Unavailable, "gone"), 0.5); got != reattach {
		t.Fatalf("no retry-after: %v, want the re-attach pause", got)
	}
}
