package dsclient

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every status the mesh answers with.
const Domain = "dataservice"

// Sentinel errors, for errors.Is. A returned *Error matches the sentinel of its ErrorInfo
// reason and the one of its status code (docs/client-protocol.md §10), so
// errors.Is(err, ErrGroupNotFound) and errors.Is(err, ErrNotFound) both hold for an
// unknown group.
var (
	// ErrGroupNotFound: Bind, WatchBinding or Unbind named a group the assigner does not know.
	ErrGroupNotFound = errors.New("dsclient: group not found")
	// ErrGroupNotServed: a sidecar serves another group than the one asked for.
	ErrGroupNotServed = errors.New("dsclient: group not served by this sidecar")
	// ErrTooManyClients: the group's max_clients_per_group is reached.
	ErrTooManyClients = errors.New("dsclient: too many clients in the group")
	// ErrLeaseEpochStale: every ack of an Ack call named a stale lease epoch.
	ErrLeaseEpochStale = errors.New("dsclient: lease epoch stale")
	// ErrNotLeader: the assigner called is a standby (followed by the library; surfaced
	// only when the attempt budget ran out).
	ErrNotLeader = errors.New("dsclient: assigner is not the leader")

	// ErrInvalidArgument: status INVALID_ARGUMENT (ErrorInfo reason INVALID_FIELD).
	ErrInvalidArgument = errors.New("dsclient: invalid argument")
	// ErrNotFound: status NOT_FOUND.
	ErrNotFound = errors.New("dsclient: not found")
	// ErrUnauthenticated: status UNAUTHENTICATED (no or a bad token or certificate).
	ErrUnauthenticated = errors.New("dsclient: unauthenticated")
	// ErrPermissionDenied: status PERMISSION_DENIED (the identity lacks reader:GROUP).
	ErrPermissionDenied = errors.New("dsclient: permission denied")
	// ErrUnavailable: status UNAVAILABLE after every retry the protocol allows.
	ErrUnavailable = errors.New("dsclient: unavailable")
	// ErrResourceExhausted: status RESOURCE_EXHAUSTED.
	ErrResourceExhausted = errors.New("dsclient: resource exhausted")

	// ErrClosed: the client was closed.
	ErrClosed = errors.New("dsclient: client closed")
	// ErrInsecureToken: a bearer token was configured without TLS (the protocol forbids
	// sending a token in plaintext, §11).
	ErrInsecureToken = errors.New("dsclient: a bearer token needs TLS")
)

var byReason = map[string]error{
	"GROUP_NOT_FOUND":   ErrGroupNotFound,
	"GROUP_NOT_SERVED":  ErrGroupNotServed,
	"TOO_MANY_CLIENTS":  ErrTooManyClients,
	"LEASE_EPOCH_STALE": ErrLeaseEpochStale,
	"NOT_LEADER":        ErrNotLeader,
}

var byCode = map[codes.Code]error{
	codes.InvalidArgument:   ErrInvalidArgument,
	codes.NotFound:          ErrNotFound,
	codes.Unauthenticated:   ErrUnauthenticated,
	codes.PermissionDenied:  ErrPermissionDenied,
	codes.Unavailable:       ErrUnavailable,
	codes.ResourceExhausted: ErrResourceExhausted,
}

// Error is a status the mesh answered that the library surfaces to the application: the
// gRPC code, the ErrorInfo reason and metadata (empty when the status carried none), and
// the call it answered.
type Error struct {
	Op       string            // the RPC, e.g. "Bind", "Fetch"
	Code     codes.Code        // the gRPC status code
	Reason   string            // the ErrorInfo reason, "" when none
	Metadata map[string]string // the ErrorInfo metadata
	Message  string            // the status message
	status   *status.Status
}

func (e *Error) Error() string {
	reason := e.Reason
	if reason == "" {
		reason = "-"
	}
	return fmt.Sprintf("dsclient: %s: %s %s: %s", e.Op, e.Code, reason, e.Message)
}

// Is matches the sentinel of the reason and the one of the code.
func (e *Error) Is(target error) bool {
	if s, ok := byReason[e.Reason]; ok && s == target {
		return true
	}
	s, ok := byCode[e.Code]
	return ok && s == target
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(e.Code, e.Message)
	}
	return e.status
}

// errorInfo is the ErrorInfo of a status (domain dataservice), or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// reasonOf is the ErrorInfo reason of err's status, "" when it has none.
func reasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	if info := errorInfo(st); info != nil {
		return info.GetReason()
	}
	return ""
}

// asError turns an RPC error into an *Error for the application; context errors and
// errors that already are *Error pass through unchanged.
func asError(op string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) || errors.Is(err, ErrClosed) || errors.Is(err, ErrInsecureToken) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("dsclient: %s: %w", op, err)
	}
	e := &Error{Op: op, Code: st.Code(), Message: st.Message(), status: st}
	if info := errorInfo(st); info != nil {
		e.Reason = info.GetReason()
		e.Metadata = info.GetMetadata()
	}
	return e
}
