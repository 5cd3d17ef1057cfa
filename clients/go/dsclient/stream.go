package dsclient

import (
	"context"
	"errors"
	"io"
	"iter"
	"sync"
	"time"

	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// streamItem is one batch (or the terminal error) of one sidecar's stream, with the
// function that grants its records back as credit.
type streamItem struct {
	records []Record
	grant   func(int)
	err     error
}

// Stream reads over the credit-based Stream RPC (§7): one stream per bound sidecar, each
// opened with a credit of the client's window (WithMaxRecords, default 500) and granted
// back the records of each batch as the loop takes it. Streams follow the binding: a
// sidecar added gets one, one removed loses its; a stream that ends cleanly (status OK)
// or UNAVAILABLE, CANCELLED or DEADLINE_EXCEEDED is opened again (0.1 s doubling to 2 s,
// jittered) while its sidecar is bound. Ack what you processed with Ack (unless WithAutoAck). The
// sequence ends when ctx is done (no error), or with one terminal error (another status
// from a sidecar, a terminal error of the binding watch, ErrClosed).
//
//	for records, err := range client.Stream(ctx) { ... }
func (c *Client) Stream(ctx context.Context) iter.Seq2[[]Record, error] {
	return func(yield func([]Record, error) bool) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(c.ctx, cancel) // Close ends the streams
		defer stop()
		items := make(chan streamItem)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.superviseStreams(sctx, items, &wg)
		}()
		for {
			select {
			case <-sctx.Done():
				if c.ctx.Err() != nil && ctx.Err() == nil {
					yield(nil, ErrClosed)
				}
				return
			case it := <-items:
				if it.err != nil {
					yield(nil, it.err)
					return
				}
				it.grant(len(it.records))
				if !yield(it.records, nil) {
					return
				}
			}
		}
	}
}

// superviseStreams keeps one stream per bound sidecar until ctx ends; a terminal error of
// the binding watch goes to items.
func (c *Client) superviseStreams(ctx context.Context, items chan<- streamItem, wg *sync.WaitGroup) {
	running := map[string]context.CancelFunc{}
	defer func() {
		for _, cancel := range running {
			cancel()
		}
	}()
	for {
		sidecars, changed, err := c.snapshot()
		if err != nil {
			select {
			case items <- streamItem{err: err}:
			case <-ctx.Done():
			}
			return
		}
		bound := map[string]bool{}
		for _, s := range sidecars {
			bound[s.address] = true
			if _, ok := running[s.address]; !ok {
				sctx, cancel := context.WithCancel(ctx)
				running[s.address] = cancel
				wg.Add(1)
				go func(s *sidecar) {
					defer wg.Done()
					c.runStream(sctx, s, items)
				}(s)
			}
		}
		for addr, cancel := range running {
			if !bound[addr] {
				cancel()
				delete(running, addr)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// runStream reads one sidecar's stream, opening it again after a clean end (status OK: a
// clean end says nothing about the binding, §7 step 5) or a retryable one, until ctx ends
// (the sidecar left the binding, the loop stopped) or a terminal status.
func (c *Client) runStream(ctx context.Context, s *sidecar, items chan<- streamItem) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			if sleep(ctx, StreamBackoff.pause(attempt-1)) != nil {
				return
			}
		}
		conn, stub := s.current()
		got, err := c.streamOnce(ctx, s, stub, items)
		if got {
			attempt = 0
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil || reopens(err) {
			c.fallBack(s, conn, err) // over its socket: TCP from the next open on
			c.logger.Debug("dsclient: stream ended; opening it again", "sidecar", s.address, "err", err)
			continue
		}
		select {
		case items <- streamItem{err: asError("Stream", err)}:
		case <-ctx.Done():
		}
		return
	}
}

// reopens says whether a stream that ended with err is opened again (§7 step 5).
func reopens(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return false
}

// streamAckTimeout: an ack on a stream whose result has not come by then is sent again
// with the Ack RPC (§7 step 6).
const streamAckTimeout = 10 * time.Second

// openStream is one Stream call while it is open: sends are serialised, and each acks
// message sent waits in order for its ack_result (§7 step 4).
type openStream struct {
	stream grpc.BidiStreamingClient[sidecarv1.StreamRequest, sidecarv1.StreamResponse]

	mu      sync.Mutex
	ended   bool
	pending []chan *sidecarv1.StreamAckResult // FIFO: one per acks message sent
}

func (o *openStream) send(req *sidecarv1.StreamRequest) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stream.Send(req)
}

// ack sends ranges on the stream and waits for their result; ok is false when the stream
// ended or the result did not come in time (the caller then uses the Ack RPC).
func (o *openStream) ack(ctx context.Context, ranges []*sidecarv1.RangeAck) (*sidecarv1.StreamAckResult, bool) {
	result := make(chan *sidecarv1.StreamAckResult, 1)
	o.mu.Lock()
	if o.ended {
		o.mu.Unlock()
		return nil, false
	}
	req := &sidecarv1.StreamRequest{Kind: &sidecarv1.StreamRequest_Acks{Acks: &sidecarv1.StreamAcks{Ranges: ranges}}}
	if err := o.stream.Send(req); err != nil {
		o.mu.Unlock()
		return nil, false
	}
	o.pending = append(o.pending, result)
	o.mu.Unlock()
	t := time.NewTimer(streamAckTimeout)
	defer t.Stop()
	select {
	case r, open := <-result:
		return r, open && r != nil
	case <-t.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	}
}

// answered hands an ack_result to the oldest acks message waiting.
func (o *openStream) answered(r *sidecarv1.StreamAckResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending) == 0 {
		return
	}
	o.pending[0] <- r
	o.pending = o.pending[1:]
}

// end fails every ack waiting (they go again by the Ack RPC, §7 step 5).
func (o *openStream) end() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = true
	for _, p := range o.pending {
		close(p)
	}
	o.pending = nil
}

// streamAt is the stream open to the sidecar at address, or nil.
func (c *Client) streamAt(address string) *openStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.streams[address]
}

func (c *Client) setStream(address string, o *openStream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o != nil {
		c.streams[address] = o
	} else {
		delete(c.streams, address)
	}
}

// streamOnce runs one Stream call: open with the window as credit, hand each batch to
// items with a grant that sends its count back as credit, answer acks sent on it. It says
// whether any batch came, and how the stream ended: nil when cleanly (status OK, which
// Recv reports as io.EOF).
func (c *Client) streamOnce(ctx context.Context, s *sidecar, stub sidecarv1.StreamServiceClient, items chan<- streamItem) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.Stream(sctx)
	if err != nil {
		return false, err
	}
	o := &openStream{stream: stream}
	open := &sidecarv1.StreamOpen{
		ClientId: c.clientID, Group: c.group, AutoAck: c.cfg.autoAck,
		InitialCredit: &sidecarv1.StreamCredit{Records: c.cfg.window},
		Format:        sidecarv1.DeliveryFormat_DELIVERY_FORMAT_BATCHES,
	}
	if c.cfg.linger > 0 {
		open.Linger = durationpb.New(c.cfg.linger)
	}
	if err := o.send(&sidecarv1.StreamRequest{Kind: &sidecarv1.StreamRequest_Open{Open: open}}); err != nil {
		_, rerr := stream.Recv() // the status the send failed on
		return false, cleanEnd(rerr)
	}
	c.setStream(s.address, o)
	defer func() {
		c.setStream(s.address, nil)
		o.end()
	}()
	grant := func(n int) {
		if n <= 0 {
			return
		}
		credit := &sidecarv1.StreamCredit{Records: int32(n)}
		if err := o.send(&sidecarv1.StreamRequest{Kind: &sidecarv1.StreamRequest_Credit{Credit: credit}}); err != nil {
			c.logger.Debug("dsclient: credit not sent; the stream ended", "sidecar", s.address, "err", err)
		}
	}
	// Batches wait here for the application, so that this loop keeps receiving (ack
	// results above all) while the application handles a batch; credit bounds them to
	// the window.
	queue := make(chan streamItem, max(c.cfg.window, 1)+1)
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for it := range queue {
			select {
			case items <- it:
			case <-sctx.Done():
				return
			}
		}
	}()
	defer func() {
		o.end() // first: an ack waiting on this stream goes by the RPC at once
		close(queue)
		<-forwarded
	}()
	got := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, cleanEnd(err)
		}
		if r := resp.GetAckResult(); r != nil {
			o.answered(r)
			continue
		}
		b := resp.GetBatch()
		if b == nil {
			continue // nack results: nacks go by the Nack RPC in this client
		}
		records, err := decodeResponse(b.GetBatches(), b.GetRecords(), s.address)
		if err != nil {
			return got, status.Error(codes.Internal, err.Error())
		}
		if len(records) == 0 {
			continue
		}
		got = true
		select {
		case queue <- streamItem{records: records, grant: grant}:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}

// cleanEnd is err, or nil when the stream ended with status OK (io.EOF from Recv).
func cleanEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
