package dsclient

import (
	"context"
	"log/slog"
	"sync"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// unaryDeadline is the deadline of each attempt of a unary call (Bind, Ack, Nack).
const unaryDeadline = 10 * time.Second

// assigner is the connection to the assigner leader: the address called now, its channel,
// and the switch to another address (a leader named by ds-leader, or the next configured
// replica while none answers). Switching closes the old channel and signals `switched`,
// on which the binding watch re-binds (§4).
type assigner struct {
	dial   func(string) (*grpc.ClientConn, error)
	logger *slog.Logger

	mu       sync.Mutex
	known    []string // the configured replicas
	next     int      // the replica tried after the current one
	current  string
	conn     *grpc.ClientConn
	switched chan struct{} // closed (and replaced) on every switch
}

func newAssigner(addresses []string, dial func(string) (*grpc.ClientConn, error), logger *slog.Logger) (*assigner, error) {
	a := &assigner{dial: dial, logger: logger, known: addresses, switched: make(chan struct{})}
	conn, err := dial(addresses[0])
	if err != nil {
		return nil, err
	}
	a.current, a.conn, a.next = addresses[0], conn, 1%len(addresses)
	return a, nil
}

// client is the stub of the current channel, its address, and the channel that is
// closed when the address changes.
func (a *assigner) client() (assignerv1.BindingServiceClient, string, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return assignerv1.NewBindingServiceClient(a.conn), a.current, a.switched
}

// address is the address called now.
func (a *assigner) address() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.current
}

// switchTo makes address current (a no-op if it already is), closing the old channel.
func (a *assigner) switchTo(address string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if address == a.current || a.conn == nil {
		return
	}
	conn, err := a.dial(address)
	if err != nil {
		a.logger.Warn("dsclient: cannot dial assigner", "address", address, "err", err)
		return
	}
	old := a.conn
	a.current, a.conn = address, conn
	close(a.switched)
	a.switched = make(chan struct{})
	a.logger.Info("dsclient: following assigner", "address", address)
	_ = old.Close()
}

// tryNext switches to the next configured replica (no leader known, §4); a no-op with
// a single address.
func (a *assigner) tryNext() {
	a.mu.Lock()
	if len(a.known) < 2 {
		a.mu.Unlock()
		return
	}
	address := a.known[a.next]
	a.next = (a.next + 1) % len(a.known)
	a.mu.Unlock()
	a.switchTo(address)
}

func (a *assigner) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn = nil
	}
}

// call runs one unary call to the leader under the call policy (§5): at most
// CallAttempts attempts with a deadline of unaryDeadline each; NOT_LEADER naming a leader
// is followed at once, an election or UNAVAILABLE waited out with the backoff (trying
// the next replica between attempts); a call cut by a switch made elsewhere (CANCELLED
// while the address changed) goes again on the new channel; anything else is returned.
func (a *assigner) call(ctx context.Context, op string, fn func(context.Context, assignerv1.BindingServiceClient, ...grpc.CallOption) error) error {
	var err error
	pauses := 0
	for attempt := 0; attempt < CallAttempts; attempt++ {
		c, address, _ := a.client()
		var trailer metadata.MD
		actx, cancel := context.WithTimeout(ctx, unaryDeadline)
		err = fn(actx, c, grpc.Trailer(&trailer))
		cancel()
		if err == nil || ctx.Err() != nil {
			return asError(op, err)
		}
		if status.Code(err) == codes.Canceled && a.address() != address {
			continue
		}
		leader := leaderOf(err, trailer)
		switch decide(err, leader, address, true) {
		case follow:
			a.switchTo(leader)
		case retry:
			if attempt == CallAttempts-1 {
				break
			}
			a.logger.Debug("dsclient: assigner call retried", "op", op, "err", err)
			if serr := sleep(ctx, CallBackoff.pause(pauses)); serr != nil {
				return serr
			}
			pauses++
			if leader != "" {
				a.switchTo(leader)
			} else {
				a.tryNext()
			}
		default:
			return asError(op, err)
		}
	}
	return asError(op, err)
}
