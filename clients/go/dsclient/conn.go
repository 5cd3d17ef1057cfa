package dsclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/credentials/local"
	"google.golang.org/grpc/keepalive"
)

// maxMessageBytes: Fetch batches can be large (up to 64 MiB); the sidecar bounds them.
const maxMessageBytes = 64 << 20

// serviceConfig lets gRPC retry UNAVAILABLE by itself, and nothing else (§5 layer 1, C9):
// 4 attempts, random(0, min(0.05 s · 2^(n-1), 0.5 s)).
const serviceConfig = `{"methodConfig":[{"name":[{}],"retryPolicy":{` +
	`"maxAttempts":4,"initialBackoff":"0.05s","maxBackoff":"0.5s",` +
	`"backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// keepaliveParams: a ping every 20 s, also without calls, so that a dead peer is noticed
// on an idle watch or stream (§5 channel settings, C49).
var keepaliveParams = keepalive.ClientParameters{Time: 20 * time.Second, PermitWithoutStream: true}

// connectParams: reconnect after 0.1 s growing to 1 s at most (gRPC's own grows to 120 s),
// so that a restarted assigner or a new sidecar is reached within a lease TTL (C49).
var connectParams = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
}

type tlsConfig struct {
	caFile, certFile, keyFile, serverName string
	tokenFile, token                      string
	// The token sent to sidecars instead (its audience ds-sidecar: a sidecar cannot replay
	// it at the assigner or the notifier); "": tokenFile / token.
	sidecarTokenFile string
}

// forSidecars is the configuration of a channel to a sidecar: its token is
// sidecarTokenFile when one is set.
func (t tlsConfig) forSidecars() tlsConfig {
	if t.sidecarTokenFile != "" {
		t.tokenFile, t.token = t.sidecarTokenFile, ""
	}
	return t
}

func (t tlsConfig) enabled() bool { return t.caFile != "" }

// channelOptions are the options of every channel but its credentials: retries, message
// sizes, keepalive, a reconnect backoff of 0.1 s to 1 s (gRPC's own grows to 120 s).
func channelOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
		grpc.WithKeepaliveParams(keepaliveParams),
		grpc.WithConnectParams(connectParams),
	}
}

// dialOptions are the options of every TCP channel: channelOptions and the credentials
// (TLS, the client certificate, the bearer token).
func (c *config) dialOptions() ([]grpc.DialOption, error) { return c.dialOptionsWith(c.tls) }

// sidecarDialOptions are dialOptions with the sidecars' token (WithSidecarTokenFile).
func (c *config) sidecarDialOptions() ([]grpc.DialOption, error) {
	return c.dialOptionsWith(c.tls.forSidecars())
}

func (c *config) dialOptionsWith(t tlsConfig) ([]grpc.DialOption, error) {
	opts := channelOptions()
	if !t.enabled() {
		if t.token != "" || t.tokenFile != "" {
			return nil, ErrInsecureToken
		}
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
		return append(opts, c.dialOpts...), nil
	}
	pem, err := os.ReadFile(t.caFile)
	if err != nil {
		return nil, fmt.Errorf("dsclient: read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("dsclient: no certificate in CA file %s", t.caFile)
	}
	tc := &tls.Config{RootCAs: pool, ServerName: t.serverName, MinVersion: tls.VersionTLS12}
	if t.certFile != "" || t.keyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
		if err != nil {
			return nil, fmt.Errorf("dsclient: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if t.token != "" || t.tokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(&bearer{token: t.token, file: t.tokenFile}))
	}
	return append(opts, c.dialOpts...), nil
}

// localDialOptions are the options of a channel to a sidecar's Unix domain socket (§3,
// local_address): channelOptions, gRPC's local credentials (no TLS: the bytes never leave
// the kernel; the sidecar serves the socket with local credentials too) and the bearer
// token, which gRPC sends over them as it does over TLS (the sidecar authorizes every call
// on the socket as on TCP). A socket carries no client certificate: see sidecarTarget.
func (c *config) localDialOptions() []grpc.DialOption {
	opts := append(channelOptions(), grpc.WithTransportCredentials(local.NewCredentials()))
	if t := c.tls.forSidecars(); t.token != "" || t.tokenFile != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(&bearer{token: t.token, file: t.tokenFile}))
	}
	return append(opts, c.dialOpts...)
}

// bearer sends "authorization: Bearer <token>" on every call, over TLS only; a token file
// is read again when its modification time or size changes (a rotated token is sent from
// the next call on).
type bearer struct {
	mu      sync.Mutex
	token   string
	file    string
	modTime time.Time
	size    int64
}

func (b *bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := b.current()
	if err != nil {
		return nil, err
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (b *bearer) RequireTransportSecurity() bool { return true }

func (b *bearer) current() (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.file == "" {
		return b.token, nil
	}
	info, err := os.Stat(b.file)
	if err != nil {
		return "", fmt.Errorf("dsclient: token file: %w", err)
	}
	if b.token != "" && info.ModTime().Equal(b.modTime) && info.Size() == b.size {
		return b.token, nil
	}
	data, err := os.ReadFile(b.file)
	if err != nil {
		return "", fmt.Errorf("dsclient: token file: %w", err)
	}
	b.token = strings.TrimSpace(string(data))
	b.modTime, b.size = info.ModTime(), info.Size()
	return b.token, nil
}
