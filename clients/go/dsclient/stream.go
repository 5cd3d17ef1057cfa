package dsclient

import (
	"context"
	"iter"
	"sync"

	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
// sidecar added gets one, one removed loses its; a stream that ends UNAVAILABLE,
// CANCELLED or DEADLINE_EXCEEDED is opened again (0.1 s doubling to 2 s, jittered) while
// its sidecar is bound. Ack what you processed with Ack (unless WithAutoAck). The
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

// runStream reads one sidecar's stream, opening it again after a retryable end, until
// ctx ends (the sidecar left the binding, the loop stopped) or a terminal status.
func (c *Client) runStream(ctx context.Context, s *sidecar, items chan<- streamItem) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			if sleep(ctx, StreamBackoff.pause(attempt-1)) != nil {
				return
			}
		}
		got, err := c.streamOnce(ctx, s, items)
		if got {
			attempt = 0
		}
		if ctx.Err() != nil {
			return
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
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

// streamOnce runs one Stream call: open with the window as credit, hand each batch to
// items with a grant that sends its count back as credit. It says whether any batch came.
func (c *Client) streamOnce(ctx context.Context, s *sidecar, items chan<- streamItem) (bool, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.stub.Stream(sctx)
	if err != nil {
		return false, err
	}
	var sendMu sync.Mutex
	send := func(req *sidecarv1.StreamRequest) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(req)
	}
	open := &sidecarv1.StreamOpen{
		ClientId: c.clientID, Group: c.group, AutoAck: c.cfg.autoAck,
		InitialCredit: &sidecarv1.StreamCredit{Records: c.cfg.window},
		Format:        sidecarv1.DeliveryFormat_DELIVERY_FORMAT_BATCHES,
	}
	if err := send(&sidecarv1.StreamRequest{Kind: &sidecarv1.StreamRequest_Open{Open: open}}); err != nil {
		_, rerr := stream.Recv() // the status the send failed on
		return false, rerr
	}
	grant := func(n int) {
		if n <= 0 {
			return
		}
		credit := &sidecarv1.StreamCredit{Records: int32(n)}
		if err := send(&sidecarv1.StreamRequest{Kind: &sidecarv1.StreamRequest_Credit{Credit: credit}}); err != nil {
			c.logger.Debug("dsclient: credit not sent; the stream ended", "sidecar", s.address, "err", err)
		}
	}
	got := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, err
		}
		b := resp.GetBatch()
		if b == nil {
			continue // ack and nack results: acks go by the Ack RPC in this client
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
		case items <- streamItem{records: records, grant: grant}:
		case <-ctx.Done():
			return got, ctx.Err()
		}
	}
}
