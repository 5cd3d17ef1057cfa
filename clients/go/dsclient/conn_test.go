package dsclient

import (
	"encoding/json"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// C9: the service config every channel is dialled with lets gRPC retry UNAVAILABLE only,
// 4 attempts, backoff from 0.05 s to 0.5 s, for every method.
func TestTheServiceConfigRetriesUnavailableOnly(t *testing.T) {
	var sc struct {
		MethodConfig []struct {
			Name        []map[string]string `json:"name"`
			RetryPolicy struct {
				MaxAttempts          int      `json:"maxAttempts"`
				InitialBackoff       string   `json:"initialBackoff"`
				MaxBackoff           string   `json:"maxBackoff"`
				BackoffMultiplier    float64  `json:"backoffMultiplier"`
				RetryableStatusCodes []string `json:"retryableStatusCodes"`
			} `json:"retryPolicy"`
		} `json:"methodConfig"`
	}
	if err := json.Unmarshal([]byte(serviceConfig), &sc); err != nil {
		t.Fatal(err)
	}
	if len(sc.MethodConfig) != 1 || len(sc.MethodConfig[0].Name) != 1 || len(sc.MethodConfig[0].Name[0]) != 0 {
		t.Fatalf("method config %+v; want one, for every method", sc.MethodConfig)
	}
	p := sc.MethodConfig[0].RetryPolicy
	if p.MaxAttempts != 4 || p.InitialBackoff != "0.05s" || p.MaxBackoff != "0.5s" || p.BackoffMultiplier != 2 ||
		len(p.RetryableStatusCodes) != 1 || p.RetryableStatusCodes[0] != "UNAVAILABLE" {
		t.Errorf("retry policy %+v", p)
	}
}

// failingSidecar answers Fetch with the statuses of fail, one per call, then with one
// record; it counts the calls.
func failingSidecar(t *testing.T, fail ...error) (*fakeSidecar, func() int) {
	f := newFakeSidecar(t)
	var mu sync.Mutex
	calls := 0
	f.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= len(fail) {
			return nil, fail[calls-1]
		}
		return batchFrom(9), nil
	}
	return f, func() int { mu.Lock(); defer mu.Unlock(); return calls }
}

// C9: gRPC retries UNAVAILABLE by itself, within one call of the library (a Fetch with
// max_wait 0 calls its one sidecar once, and the library never retries a Fetch), at most
// 4 times; another status is not retried.
func TestGrpcRetriesUnavailableByItselfAndNothingElse(t *testing.T) {
	fetchOnce := func(f *fakeSidecar) ([]Record, error) {
		asg := newFakeAssigner(t, bound(binding(1, f.addr)))
		c, err := New(testContext(t), "g", WithAssigners(asg.addr), WithMaxWait(0))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.Fetch(testContext(t))
	}
	unavailable := status.Error(codes.Unavailable, "restarting")

	f, calls := failingSidecar(t, unavailable, unavailable)
	if records, err := fetchOnce(f); err != nil || len(records) != 1 || calls() != 3 {
		t.Errorf("UNAVAILABLE twice: Fetch = %v, %v after %d calls; want the record after 3", records, err, calls())
	}

	f, calls = failingSidecar(t, unavailable, unavailable, unavailable, unavailable, unavailable)
	if records, err := fetchOnce(f); err != nil || len(records) != 0 || calls() != 4 {
		t.Errorf("UNAVAILABLE always: Fetch = %v, %v after %d calls; want nothing (skipped) after 4", records, err, calls())
	}

	f, calls = failingSidecar(t, status.Error(codes.Aborted, "no"))
	records, err := fetchOnce(f)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Aborted || len(records) != 0 || calls() != 1 {
		t.Errorf("ABORTED: Fetch = %v, %v after %d calls; want ABORTED after 1", records, err, calls())
	}
}

// C49: the channels receive a 5 MiB message (gRPC's default limit is 4 MiB), ping every
// 20 s also without calls, and reconnect after 0.1 s growing to 1 s at most.
func TestTheChannelSettings(t *testing.T) {
	if keepaliveParams.Time != 20*time.Second || !keepaliveParams.PermitWithoutStream {
		t.Errorf("keepalive %+v", keepaliveParams)
	}
	b := connectParams.Backoff
	if b.BaseDelay != 100*time.Millisecond || b.MaxDelay != time.Second || b.Multiplier <= 1 || b.Jitter > 0.5 {
		t.Errorf("reconnect backoff %+v", b)
	}

	big := make([]byte, 5<<20)
	for i := range big {
		big[i] = byte(i)
	}
	f := newFakeSidecar(t)
	f.fetch = func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
		return &sidecarv1.FetchResponse{Batches: []*sidecarv1.RecordBatch{{
			Topic: "t", LeaseEpoch: 1, Offsets: le64(0), ValueLengths: le32(int32(len(big))), Values: big,
		}}}, nil
	}
	asg := newFakeAssigner(t, bound(binding(1, f.addr)))
	c, err := New(testContext(t), "g", WithAssigners(asg.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	records, err := c.Fetch(testContext(t))
	if err != nil || len(records) != 1 || len(records[0].Value) != len(big) || records[0].Value[len(big)-1] != big[len(big)-1] {
		t.Fatalf("Fetch of a 5 MiB record = %d records, %v", len(records), err)
	}
}

// C49: a channel whose peer keeps failing tries again every second at most (the dial
// options' reconnect backoff, 0.1 s growing to 1 s), not after gRPC's default backoff
// (1 s growing by 1.6x to 120 s), so a sidecar that comes back is reached within about
// a second. Counted, not timed (a single pause is no measure on a loaded machine): a
// listener accepts each connection and closes it at once, and the pauses between the
// attempts of 8 s are counted.
func TestAFailingPeerIsTriedMoreOftenThanGrpcsOwnBackoffAllows(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var accepted []time.Time
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, time.Now())
			mu.Unlock()
			_ = c.Close()
		}
	}()
	cfg := defaults()
	opts, err := cfg.dialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	time.Sleep(8 * time.Second)
	_ = conn.Close()
	_ = lis.Close()
	mu.Lock()
	defer mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(accepted); i++ {
		gaps = append(gaps, accepted[i].Sub(accepted[i-1]).Round(time.Millisecond))
	}
	// gRPC's own backoff: 1 s, 1.6 s, 2.56 s, 4.1 s (each +-20%): within 8 s at most 4
	// pauses. The dial options' (0.1 s growing to 1 s) make about 11; 8 leave room for a
	// slow machine and are 2x what the default could give.
	if len(gaps) < 8 {
		t.Errorf("pauses between connection attempts in 8 s: %v; want at least 8", gaps)
	}
}

// C50: a sweep asks each sidecar with max_wait present and zero (absent would be the
// sidecar's default wait); the long poll of the last one has it present too.
func TestASweepSendsMaxWaitPresentAndZero(t *testing.T) {
	a, b := newFakeSidecar(t), newFakeSidecar(t)
	asg := newFakeAssigner(t, bound(binding(1, a.addr, b.addr)))
	c, err := New(testContext(t), "g", WithAssigners(asg.addr), WithMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Fetch(testContext(t)); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]*fakeSidecar{"a": a, "b": b} {
		f.mu.Lock()
		waits, present := append([]time.Duration(nil), f.fetches...), append([]bool(nil), f.present...)
		f.mu.Unlock()
		sweeps := 0
		for i, w := range waits {
			if !present[i] {
				t.Errorf("%s: Fetch %d without max_wait", name, i)
			}
			if w == 0 {
				sweeps++
			}
		}
		if len(waits) == 0 || waits[0] != 0 || !present[0] || sweeps == 0 {
			t.Errorf("%s: max_wait %v, present %v; want the first pass's sweep present and 0", name, waits, present)
		}
	}
}
