package dsclient

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	commonv1 "dataservice/clients/go/gen/dataservice/common/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// statusWith is a status error carrying an ErrorInfo of domain dataservice.
func statusWith(code codes.Code, reason string, md map[string]string) error {
	st, err := status.New(code, "test").WithDetails(&errdetails.ErrorInfo{Domain: Domain, Reason: reason, Metadata: md})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// C7: the n-th pause is min(0.05 s · 2^n, 2 s) × [0.5, 1.5).
func TestBackoffDoublesToItsMaximumAndJittersByHalf(t *testing.T) {
	for n, want := range []time.Duration{50, 100, 200, 400, 800, 1600, 2000, 2000, 2000} {
		want *= time.Millisecond
		if got := CallBackoff.Pause(n, 0.5); got != want {
			t.Errorf("pause %d at the middle draw = %v, want %v", n, got, want)
		}
		if lo := CallBackoff.Pause(n, 0); lo != want/2 {
			t.Errorf("pause %d at the lowest draw = %v, want %v", n, lo, want/2)
		}
		if hi := CallBackoff.Pause(n, 0.999999); hi >= want*3/2 || hi < want*3/2-time.Millisecond {
			t.Errorf("pause %d at the highest draw = %v, want just under %v", n, hi, want*3/2)
		}
	}
	for n := range 100 {
		if p := CallBackoff.pause(n); p < 25*time.Millisecond || p >= 3*time.Second {
			t.Fatalf("pause %d = %v out of [25 ms, 3 s)", n, p)
		}
	}
	if got := WatchBackoff.Pause(10, 0.5); got != 5*time.Second {
		t.Errorf("watch backoff caps at 5 s, got %v", got)
	}
}

// C4, C5, C6: follow a named leader, wait out an election and UNAVAILABLE, raise the rest.
func TestDecide(t *testing.T) {
	notLeader := statusWith(codes.FailedPrecondition, "NOT_LEADER", nil)
	cases := []struct {
		name       string
		err        error
		leader     string
		atAssigner bool
		want       decision
	}{
		{"unavailable", status.Error(codes.Unavailable, "x"), "", true, retry},
		{"unavailable at a sidecar", status.Error(codes.Unavailable, "x"), "", false, retry},
		{"not leader naming another", notLeader, "b:2", true, follow},
		{"not leader naming itself", notLeader, "a:1", true, retry},
		{"election", notLeader, "", true, retry},
		{"not leader at a sidecar", notLeader, "b:2", false, raise},
		{"another precondition", statusWith(codes.FailedPrecondition, "LEASE_EPOCH_STALE", nil), "", true, raise},
		{"unknown group", statusWith(codes.NotFound, "GROUP_NOT_FOUND", nil), "", true, raise},
		{"deadline", status.Error(codes.DeadlineExceeded, "x"), "", true, raise},
		{"invalid", statusWith(codes.InvalidArgument, "INVALID_FIELD", nil), "", true, raise},
		{"too many clients", statusWith(codes.ResourceExhausted, "TOO_MANY_CLIENTS", nil), "", true, raise},
	}
	for _, c := range cases {
		if got := decide(c.err, c.leader, "a:1", c.atAssigner); got != c.want {
			t.Errorf("%s: decide = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestTheLeaderIsReadFromDsLeaderElseFromErrorInfo(t *testing.T) {
	err := statusWith(codes.FailedPrecondition, "NOT_LEADER", map[string]string{"leader": "info:1"})
	if got := leaderOf(err, metadata.Pairs(LeaderMetadataKey, "trailer:1")); got != "trailer:1" {
		t.Errorf("leader = %q, want the trailer's", got)
	}
	if got := leaderOf(err, nil); got != "info:1" {
		t.Errorf("leader = %q, want the ErrorInfo's", got)
	}
	if got := leaderOf(status.Error(codes.FailedPrecondition, "x"), metadata.Pairs(LeaderMetadataKey, "")); got != "" {
		t.Errorf("leader = %q, want none", got)
	}
}

// §10: statuses become *Error with their reason; errors.Is matches reason and code.
func TestStatusesMapToTypedErrors(t *testing.T) {
	err := asError("Bind", statusWith(codes.NotFound, "GROUP_NOT_FOUND", map[string]string{"group": "g"}))
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.NotFound || e.Reason != "GROUP_NOT_FOUND" || e.Metadata["group"] != "g" || e.Op != "Bind" {
		t.Fatalf("asError = %#v", err)
	}
	for _, target := range []error{ErrGroupNotFound, ErrNotFound} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(%v, %v) is false", err, target)
		}
	}
	for _, target := range []error{ErrGroupNotServed, ErrUnavailable, ErrInvalidArgument} {
		if errors.Is(err, target) {
			t.Errorf("errors.Is(%v, %v) is true", err, target)
		}
	}
	if status.Code(err) != codes.NotFound {
		t.Errorf("status.Code of the *Error = %v", status.Code(err))
	}
	cases := map[error]error{
		statusWith(codes.ResourceExhausted, "TOO_MANY_CLIENTS", nil):   ErrTooManyClients,
		statusWith(codes.NotFound, "GROUP_NOT_SERVED", nil):            ErrGroupNotServed,
		statusWith(codes.InvalidArgument, "INVALID_FIELD", nil):        ErrInvalidArgument,
		statusWith(codes.PermissionDenied, "PERMISSION_DENIED", nil):   ErrPermissionDenied,
		statusWith(codes.Unauthenticated, "UNAUTHENTICATED", nil):      ErrUnauthenticated,
		statusWith(codes.FailedPrecondition, "LEASE_EPOCH_STALE", nil): ErrLeaseEpochStale,
		status.Error(codes.Unavailable, "no ErrorInfo"):                ErrUnavailable,
	}
	for in, want := range cases {
		if got := asError("X", in); !errors.Is(got, want) {
			t.Errorf("asError(%v) is not %v", in, want)
		}
	}
	var noInfo *Error
	if errors.As(asError("X", status.Error(codes.Internal, "m")), &noInfo); noInfo.Reason != "" || noInfo.Code != codes.Internal {
		t.Errorf("a status without ErrorInfo: %#v", noInfo)
	}
}

func le64(vs ...int64) []byte {
	b := make([]byte, 8*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

func le32(vs ...int32) []byte {
	b := make([]byte, 4*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return b
}

// C22: little-endian columns, -1 = null, empty key lengths = null keys, epoch per batch.
func TestABatchDecodesToItsRecords(t *testing.T) {
	b := &sidecarv1.RecordBatch{
		Topic: "t", Partition: 3, LeaseEpoch: 7, DeliveryCount: 2,
		Offsets:      le64(10, 11, 15),
		Timestamps:   le64(1_700_000_000_123, -1, 5),
		ValueLengths: le32(2, -1, 0),
		Values:       []byte("ab"),
		KeyLengths:   le32(-1, 1, 3),
		Keys:         []byte("kxyz"),
		Headers:      []*sidecarv1.RecordBatchHeaders{{Index: 2, Headers: []*commonv1.Header{{Key: "h", Value: []byte("v")}}}},
	}
	rs, err := decodeBatch(b, "sc:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("%d records", len(rs))
	}
	r0, r1, r2 := rs[0], rs[1], rs[2]
	if r0.Offset != 10 || string(r0.Value) != "ab" || r0.Key != nil || r0.Timestamp.UnixMilli() != 1_700_000_000_123 {
		t.Errorf("record 0: %+v", r0)
	}
	if r1.Offset != 11 || r1.Value != nil || string(r1.Key) != "k" || !r1.Timestamp.IsZero() {
		t.Errorf("record 1: %+v", r1)
	}
	if r2.Offset != 15 || r2.Value == nil || len(r2.Value) != 0 || string(r2.Key) != "xyz" || len(r2.Headers) != 1 || r2.Headers[0].Key != "h" {
		t.Errorf("record 2: %+v", r2)
	}
	for _, r := range rs {
		if r.Topic != "t" || r.Partition != 3 || r.LeaseEpoch != 7 || r.DeliveryCount != 2 || r.sidecar != "sc:1" {
			t.Errorf("batch fields not carried: %+v", r)
		}
	}
	noKeys := &sidecarv1.RecordBatch{Offsets: le64(1, 2), ValueLengths: le32(1, 1), Values: []byte("xy")}
	rs, err = decodeBatch(noKeys, "s")
	if err != nil || rs[0].Key != nil || rs[1].Key != nil || string(rs[1].Value) != "y" || !rs[0].Timestamp.IsZero() {
		t.Errorf("a batch without keys or timestamps: %+v %v", rs, err)
	}
	bad := &sidecarv1.RecordBatch{Offsets: le64(1), ValueLengths: le32(5), Values: []byte("x")}
	if _, err := decodeBatch(bad, "s"); err == nil {
		t.Error("a batch whose values are shorter than their lengths decoded")
	}
}

func TestRecordsFromAnOlderSidecarAreConverted(t *testing.T) {
	rs := decodeRecords([]*commonv1.Record{
		{Topic: "t", Partition: 1, Offset: 4, Value: []byte("v"), LeaseEpoch: 2, DeliveryCount: 1},
		{Topic: "t", Partition: 1, Offset: 6, LeaseEpoch: 2},
	}, "s")
	if rs[0].Offset != 4 || string(rs[0].Value) != "v" || rs[1].Value != nil || rs[0].next != 6 || rs[1].next != -1 {
		t.Errorf("converted: %+v", rs)
	}
}

func spanString(ss []span) string {
	out := ""
	for _, s := range ss {
		out += fmt.Sprintf("%s/%s-%d@%d[%d,%d)#%d ", s.sidecar, s.topic, s.partition, s.epoch, s.from, s.to, s.count)
	}
	return out
}

// C29: a whole batch is one range per partition run; a subset runs that cover exactly it.
func TestAcksCoverExactlyTheRecordsGiven(t *testing.T) {
	b := &sidecarv1.RecordBatch{Topic: "t", Partition: 0, LeaseEpoch: 3, Offsets: le64(10, 11, 15, 16, 20), ValueLengths: le32(-1, -1, -1, -1, -1)}
	rs, _ := decodeBatch(b, "a")
	if got := spanString(spansOf(rs)); got != "a/t-0@3[10,21)#5 " {
		t.Errorf("whole batch: %s", got)
	}
	subset := []Record{rs[0], rs[1], rs[3], rs[4]} // 15 delivered and not given
	if got := spanString(spansOf(subset)); got != "a/t-0@3[10,12)#2 a/t-0@3[16,21)#2 " {
		t.Errorf("subset: %s", got)
	}
	if got := spanString(spansOf([]Record{rs[4], rs[0], rs[0]})); got != "a/t-0@3[10,11)#1 a/t-0@3[20,21)#1 " {
		t.Errorf("unordered with a duplicate: %s", got)
	}
	other, _ := decodeBatch(&sidecarv1.RecordBatch{Topic: "t", Partition: 0, LeaseEpoch: 4, Offsets: le64(21), ValueLengths: le32(-1)}, "b")
	if got := spanString(spansOf(append(rs[3:], other...))); got != "a/t-0@3[16,21)#2 b/t-0@4[21,22)#1 " {
		t.Errorf("two sidecars and epochs: %s", got)
	}
}

func binding(version int64, addresses ...string) *assignerv1.Binding {
	b := &assignerv1.Binding{Version: version}
	for _, a := range addresses {
		b.Endpoints = append(b.Endpoints, &assignerv1.SidecarEndpoint{Address: a, Partitions: []*commonv1.TopicPartition{{Topic: "t", Partition: 1}}})
	}
	return b
}

// C13, C16, C17: a lower version is ignored; an empty binding within the grace after a
// leader change is not applied; added and removed sidecars are named.
func TestBindingUpdates(t *testing.T) {
	now := time.Now()
	var s bindingState
	c := s.apply(binding(3, "b:1", "a:1"), now)
	if !c.applied || fmt.Sprint(c.added) != "[a:1 b:1]" || len(c.removed) != 0 || s.version != 3 {
		t.Fatalf("first binding: %+v, version %d", c, s.version)
	}
	if c := s.apply(binding(2, "c:1"), now); c.applied || s.version != 3 {
		t.Errorf("an older binding was applied: %+v", c)
	}
	c = s.apply(binding(4, "b:1", "c:1"), now)
	if fmt.Sprint(c.added) != "[c:1]" || fmt.Sprint(c.removed) != "[a:1]" || fmt.Sprint(s.addresses()) != "[b:1 c:1]" {
		t.Errorf("a change: %+v, now %v", c, s.addresses())
	}
	if s.endpoints["b:1"].Partitions[0] != (TopicPartition{"t", 1}) {
		t.Errorf("partitions not recorded: %+v", s.endpoints["b:1"])
	}
	if c := s.apply(binding(0, "d:1"), now); !c.applied || s.version != 0 {
		t.Errorf("a version-0 binding is applied (as the Python client): %+v", c)
	}
	// A leader change: its Bind answer is taken whatever its version; an empty one within
	// the grace is not applied, but its version is held.
	s.apply(binding(9, "a:1"), now)
	if c := s.rebound(binding(1), now); c.applied || s.version != 1 || len(s.endpoints) != 1 {
		t.Errorf("an empty binding at the leader change was applied: %+v", c)
	}
	if c := s.apply(binding(2), now.Add(EmptyBindingGrace/2)); c.applied || s.version != 2 {
		t.Errorf("an empty binding within the grace was applied: %+v", c)
	}
	if c := s.apply(binding(3), now.Add(EmptyBindingGrace)); !c.applied || len(s.endpoints) != 0 || fmt.Sprint(c.removed) != "[a:1]" {
		t.Errorf("an empty binding past the grace was not applied: %+v", c)
	}
	if c := s.rebound(binding(1, "e:1"), now); !c.applied || s.version != 1 {
		t.Errorf("the new leader's binding of a lower version was not taken: %+v", c)
	}
}

// C18: sorted by address, starting one further at each pass.
func TestRotation(t *testing.T) {
	addrs := []string{"a", "b", "c"}
	for cursor, want := range []string{"[a b c]", "[b c a]", "[c a b]", "[a b c]"} {
		if got := fmt.Sprint(rotation(addrs, cursor)); got != want {
			t.Errorf("rotation at %d = %s, want %s", cursor, got, want)
		}
	}
	if rotation(nil, 3) != nil {
		t.Error("no sidecars, no rotation")
	}
}
