package dsclient

import (
	"context"
	"sync"
	"testing"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// streamSidecar is an in-process StreamService whose Stream sends `total` records in
// batches of `per`, within the credit granted, answers acks in order, and ends the first
// stream after `endFirstAfter` batches (0: never): UNAVAILABLE, or cleanly (status OK)
// with `endFirstClean`.
type streamSidecar struct {
	sidecarv1.UnimplementedStreamServiceServer
	addr          string
	total, per    int
	endFirstAfter int
	endFirstClean bool

	mu         sync.Mutex
	next       int64
	opens      []*sidecarv1.StreamOpen
	granted    int32
	overdrawn  bool
	streamAcks []*sidecarv1.StreamAcks
	rpcAcks    int
}

func (f *streamSidecar) Ack(_ context.Context, req *sidecarv1.AckRequest) (*sidecarv1.AckResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rpcAcks++
	return &sidecarv1.AckResponse{AckedCount: int64(len(req.GetRanges()))}, nil
}

func (f *streamSidecar) Stream(s grpc.BidiStreamingServer[sidecarv1.StreamRequest, sidecarv1.StreamResponse]) error {
	first, err := s.Recv()
	if err != nil || first.GetOpen() == nil {
		return status.Error(codes.InvalidArgument, "open first")
	}
	f.mu.Lock()
	f.opens = append(f.opens, first.GetOpen())
	n := len(f.opens)
	f.mu.Unlock()
	credit := first.GetOpen().GetInitialCredit().GetRecords()
	reqs := make(chan *sidecarv1.StreamRequest)
	go func() {
		defer close(reqs)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			reqs <- r
		}
	}()
	sent := 0
	for {
		f.mu.Lock()
		left := int64(f.total) - f.next
		f.mu.Unlock()
		if credit > 0 && left > 0 {
			k := min(int64(f.per), left)
			f.mu.Lock()
			offsets := make([]int64, k)
			lengths := make([]int32, k)
			for i := range offsets {
				offsets[i], lengths[i] = f.next, -1
				f.next++
			}
			f.mu.Unlock()
			credit -= int32(k)
			b := &sidecarv1.RecordBatch{Topic: "t", Partition: 0, LeaseEpoch: 1, Offsets: le64(offsets...), ValueLengths: le32(lengths...)}
			if err := s.Send(&sidecarv1.StreamResponse{Kind: &sidecarv1.StreamResponse_Batch{Batch: &sidecarv1.StreamBatch{Batches: []*sidecarv1.RecordBatch{b}}}}); err != nil {
				return err
			}
			sent++
			if n == 1 && f.endFirstAfter > 0 && sent == f.endFirstAfter {
				if f.endFirstClean {
					return nil
				}
				return status.Error(codes.Unavailable, "going away")
			}
			continue
		}
		select {
		case r, ok := <-reqs:
			if !ok {
				return nil
			}
			switch {
			case r.GetCredit() != nil:
				credit += r.GetCredit().GetRecords()
				f.mu.Lock()
				f.granted += r.GetCredit().GetRecords()
				f.mu.Unlock()
			case r.GetAcks() != nil:
				f.mu.Lock()
				f.streamAcks = append(f.streamAcks, r.GetAcks())
				f.mu.Unlock()
				res := &sidecarv1.StreamAckResult{AckedCount: int64(len(r.GetAcks().GetRanges()))}
				if err := s.Send(&sidecarv1.StreamResponse{Kind: &sidecarv1.StreamResponse_AckResult{AckResult: res}}); err != nil {
					return err
				}
			}
		case <-s.Context().Done():
			return nil
		}
		if credit < 0 {
			f.mu.Lock()
			f.overdrawn = true
			f.mu.Unlock()
		}
	}
}

func streamClient(t *testing.T, f *streamSidecar, window int32, opts ...Option) *Client {
	f.addr = serve(t, func(s *grpc.Server) { sidecarv1.RegisterStreamServiceServer(s, f) })
	asg := newFakeAssigner(t, bound(&assignerv1.Binding{Version: 1, Endpoints: []*assignerv1.SidecarEndpoint{{Address: f.addr}}}))
	opts = append([]Option{WithAssigners(asg.addr), WithClientID("me"), WithMaxRecords(window)}, opts...)
	c, err := New(testContext(t), "g", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// C24, C25, §8: the stream opens with the window as credit, each batch taken is granted
// back, and acks go on the stream, each answered in order.
func TestStreamGrantsBackWhatWasTakenAndAcksOnTheStream(t *testing.T) {
	f := &streamSidecar{total: 10, per: 2}
	c := streamClient(t, f, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, accepted := 0, 0
	for records, err := range c.Stream(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.Ack(ctx, records)
		if err != nil {
			t.Fatal(err)
		}
		got, accepted = got+len(records), accepted+n
		if got == 10 {
			break
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if accepted != 10 || len(f.opens) != 1 || f.opens[0].GetInitialCredit().GetRecords() != 4 || f.opens[0].GetClientId() != "me" {
		t.Errorf("accepted %d, opens %v", accepted, f.opens)
	}
	if f.opens[0].GetFormat() != sidecarv1.DeliveryFormat_DELIVERY_FORMAT_BATCHES {
		t.Errorf("format %v", f.opens[0].GetFormat())
	}
	if len(f.streamAcks) != 5 || f.rpcAcks != 0 {
		t.Errorf("acks on the stream %d, by RPC %d; want 5 and 0", len(f.streamAcks), f.rpcAcks)
	}
	if f.granted < 8 || f.overdrawn {
		t.Errorf("credit granted back %d (want at least 8 of the 10 taken), overdrawn %v", f.granted, f.overdrawn)
	}
}

// C26: a stream that ends UNAVAILABLE is opened again while its sidecar is bound, and
// reading goes on without the application's help.
func TestAStreamThatEndsUnavailableIsOpenedAgain(t *testing.T) {
	f := &streamSidecar{total: 6, per: 1, endFirstAfter: 2}
	c := streamClient(t, f, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := 0
	for records, err := range c.Stream(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Ack(ctx, records)
		if got += len(records); got == 6 {
			break
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.opens) != 2 {
		t.Errorf("%d opens, want 2", len(f.opens))
	}
}

// C53 (O12): a stream that ends cleanly (status OK, io.EOF on the client) is opened again
// while its sidecar is bound, as one that ends UNAVAILABLE; nothing reaches the
// application's loop but records.
func TestAStreamThatEndsCleanlyIsOpenedAgain(t *testing.T) {
	f := &streamSidecar{total: 6, per: 1, endFirstAfter: 2, endFirstClean: true}
	c := streamClient(t, f, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := 0
	for records, err := range c.Stream(ctx) {
		if err != nil {
			t.Fatalf("after %d records: %v", got, err)
		}
		_, _ = c.Ack(ctx, records)
		if got += len(records); got == 6 {
			break
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got != 6 || len(f.opens) != 2 {
		t.Errorf("%d records, %d opens; want 6 and 2", got, len(f.opens))
	}
}

// StreamOpen.linger: WithStreamLinger asks the sidecar to batch in time; without it the
// opening carries none (each batch at once).
func TestStreamOpensWithTheLingerAskedFor(t *testing.T) {
	for _, linger := range []time.Duration{0, 50 * time.Millisecond} {
		f := &streamSidecar{total: 2, per: 2}
		c := streamClient(t, f, 4, WithStreamLinger(linger))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for records, err := range c.Stream(ctx) {
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Ack(ctx, records); err != nil {
				t.Fatal(err)
			}
			break
		}
		cancel()
		f.mu.Lock()
		open := f.opens[0]
		f.mu.Unlock()
		if got := open.GetLinger().AsDuration(); got != linger || (linger == 0) != (open.GetLinger() == nil) {
			t.Errorf("linger %v: the opening carries %v", linger, open.GetLinger())
		}
	}
}
