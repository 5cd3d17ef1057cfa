package dsclient

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// LeaderMetadataKey is the trailing metadata in which a standby assigner names the leader.
const LeaderMetadataKey = "ds-leader"

// Backoff is the jittered exponential schedule of docs/client-protocol.md §5: the n-th
// pause (n from 0) is min(Initial · 2^n, Max) times a factor drawn from [0.5, 1.5), so
// clients that failed together do not come back together.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// CallBackoff is the call policy's schedule: 50 ms doubling to 2 s.
var CallBackoff = Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// WatchBackoff is the binding watch's re-watch schedule (§3): 0.1 s doubling to 5 s.
var WatchBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// StreamBackoff is the re-open schedule of a Stream while its sidecar is bound (§7).
var StreamBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// Pause is the n-th pause for a uniform draw u from [0, 1).
func (b Backoff) Pause(n int, u float64) time.Duration {
	base := float64(b.Initial)
	for i := 0; i < n && base < float64(b.Max); i++ {
		base *= 2
	}
	base = min(base, float64(b.Max))
	return time.Duration(base * (0.5 + u))
}

// pause draws the n-th pause.
func (b Backoff) pause(n int) time.Duration { return b.Pause(n, rand.Float64()) }

// sleep waits d or until ctx is done (its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// CallAttempts is the call policy's budget: attempts in all, followed redirects included.
const CallAttempts = 8

// decision is what the call policy does about a failed attempt.
type decision int

const (
	raise  decision = iota // surface the error, at once and unchanged
	retry                  // back off, then call again
	follow                 // switch to the leader named, call again at once
)

// decide is the call policy (§5): UNAVAILABLE is retried; at the assigner, NOT_LEADER
// naming another address is followed and NOT_LEADER without a leader (an election) is
// retried; anything else is raised. current is the address the call went to.
func decide(err error, leader, current string, atAssigner bool) decision {
	switch status.Code(err) {
	case codes.Unavailable:
		return retry
	case codes.FailedPrecondition:
		if !atAssigner || reasonOf(err) != "NOT_LEADER" {
			return raise
		}
		if leader != "" && leader != current {
			return follow
		}
		return retry
	default:
		return raise
	}
}

// leaderOf is the leader a NOT_LEADER answer names: trailing metadata ds-leader, else
// the ErrorInfo metadata "leader" (the same value); "" when none.
func leaderOf(err error, trailer metadata.MD) string {
	if v := trailer.Get(LeaderMetadataKey); len(v) > 0 && v[0] != "" {
		return v[0]
	}
	if st, ok := status.FromError(err); ok {
		if info := errorInfo(st); info != nil {
			return info.GetMetadata()["leader"]
		}
	}
	return ""
}

// retryUnavailable calls fn up to CallAttempts times while it fails UNAVAILABLE, with the
// call backoff between attempts (the Ack and Nack policy: no election waiting).
func retryUnavailable(ctx context.Context, fn func(context.Context) error) error {
	var err error
	for attempt := 0; attempt < CallAttempts; attempt++ {
		if attempt > 0 {
			if serr := sleep(ctx, CallBackoff.pause(attempt-1)); serr != nil {
				return serr
			}
		}
		err = fn(ctx)
		if err == nil || status.Code(err) != codes.Unavailable || errors.Is(ctx.Err(), context.Canceled) {
			return err
		}
	}
	return err
}
