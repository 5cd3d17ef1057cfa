package dsclient

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"time"

	"google.golang.org/grpc"
)

// Option configures a Client.
type Option func(*config)

type config struct {
	clientID   string
	assigners  []string
	maxRecords int32
	maxBytes   int64
	maxWait    time.Duration
	window     int32
	linger     time.Duration
	autoAck    bool
	tls        tlsConfig
	logger     *slog.Logger
	dialOpts   []grpc.DialOption
}

func defaults() config {
	return config{
		maxRecords: 500,
		maxWait:    500 * time.Millisecond,
		window:     500,
		logger:     slog.New(slog.DiscardHandler),
	}
}

// WithAssigners names the assigner replicas (host:port); at least one is required. The
// library follows the leader from any of them (ds-leader), and tries the next one while
// none answers (§4).
func WithAssigners(addresses ...string) Option {
	return func(c *config) { c.assigners = append(c.assigners, addresses...) }
}

// WithClientID sets the client id: stable per application instance (the pod name), the
// same on every call. Default: "client-" and 12 random hex digits.
func WithClientID(id string) Option { return func(c *config) { c.clientID = id } }

// WithMaxRecords bounds the records of one Fetch (default 500) and is the Stream's
// credit window.
func WithMaxRecords(n int32) Option {
	return func(c *config) { c.maxRecords, c.window = n, n }
}

// WithStreamLinger lets each sidecar hold a Stream's next batch up to d (at most 1 s)
// after the last one unless a whole batch is buffered, so at low rates records share
// messages and acks (less CPU for up to d more latency while records keep coming). 0 (the
// default): each batch at once. The protocol's StreamOpen.linger.
func WithStreamLinger(d time.Duration) Option { return func(c *config) { c.linger = d } }

// WithMaxBytes bounds the keys and values of one Fetch (0: the sidecar's default, 1 MiB).
func WithMaxBytes(n int64) Option { return func(c *config) { c.maxBytes = n } }

// WithMaxWait is how long one Fetch waits for records (default 0.5 s, at most 30 s).
func WithMaxWait(d time.Duration) Option { return func(c *config) { c.maxWait = d } }

// WithAutoAck lets the sidecars count records as acked once written to the client: the
// application acks nothing, and loses what it received but did not process if it crashes.
func WithAutoAck() Option { return func(c *config) { c.autoAck = true } }

// WithTLS makes every channel (assigner and sidecars) use TLS with the mesh's CA
// (PEM file; DS_TLS__CA_FILE of the services).
func WithTLS(caFile string) Option { return func(c *config) { c.tls.caFile = caFile } }

// WithClientCertificate adds the client certificate and key (PEM files) for mTLS.
func WithClientCertificate(certFile, keyFile string) Option {
	return func(c *config) { c.tls.certFile, c.tls.keyFile = certFile, keyFile }
}

// WithServerName overrides the name checked in the servers' certificates.
func WithServerName(name string) Option { return func(c *config) { c.tls.serverName = name } }

// WithTokenFile sends "authorization: Bearer <token>" on every call, the token read from
// path and read again whenever the file changes (rotation). Requires WithTLS.
func WithTokenFile(path string) Option { return func(c *config) { c.tls.tokenFile = path } }

// WithSidecarTokenFile sends the token of path to the sidecars instead of WithTokenFile's
// (read again when the file changes). Each service accepts only tokens minted for it (their
// aud: ds-assigner, ds-sidecar, ds-notifier), so the token a sidecar receives cannot be
// replayed at the assigner. Requires WithTLS.
func WithSidecarTokenFile(path string) Option {
	return func(c *config) { c.tls.sidecarTokenFile = path }
}

// WithToken sends a fixed bearer token on every call. Requires WithTLS.
func WithToken(token string) Option { return func(c *config) { c.tls.token = token } }

// WithLogger sets where the library logs (default: nowhere).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithDialOptions adds gRPC dial options to every channel (tests, interceptors).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.dialOpts = append(c.dialOpts, opts...) }
}

func randomClientID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "client-" + hex.EncodeToString(b)
}
