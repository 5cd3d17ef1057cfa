package dsclient

import (
	"net"
	"strings"
	"time"
)

// localScheme starts a gRPC target naming a Unix domain socket: "unix:PATH" or
// "unix://ABS_PATH".
const localScheme = "unix:"

// acceptTimeout bounds the check that a socket file accepts a connection now.
const acceptTimeout = 250 * time.Millisecond

// socketPath is the file a "unix:" target names, or "" for any other target.
func socketPath(target string) string {
	rest, ok := strings.CutPrefix(target, localScheme)
	if !ok {
		return ""
	}
	if p, ok := strings.CutPrefix(rest, "//"); ok {
		return p
	}
	return rest
}

// acceptsNow says whether a process accepts connections on the socket file path now.
func acceptsNow(path string) bool {
	conn, err := net.DialTimeout("unix", path, acceptTimeout)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// sidecarTarget is what the client dials for a bound sidecar (§3, local_address): its
// local socket when all of these hold, else its TCP address:
//   - the binding names one (a "unix:" target);
//   - the client can be told there: it has no client certificate, or it sends a token (a
//     socket carries no certificate, so a caller known only by its certificate would be
//     refused UNAUTHENTICATED there; it stays on TCP);
//   - the socket file accepts a connection now (reachable, asked last: in another pod there
//     is no such file, so a client never reaches a sidecar that is not its pod's).
//
// The same rule as the Python client's (clients/python/src/dsclient/transport.py).
func sidecarTarget(address, localAddress string, t tlsConfig, reachable func(string) bool) string {
	path := socketPath(localAddress)
	if path == "" {
		return address
	}
	if t.certFile != "" && t.token == "" && t.tokenFile == "" {
		return address
	}
	if !reachable(path) {
		return address
	}
	return localAddress
}
