package dsclient

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// untrustedSocket says why the client must not send its token to the socket file path,
// or "" when it may (issue 37, finding 1): the file must be a socket, not a link, not
// writable by every user, in a directory (not a link) that neither its group nor other
// users may write, owned by root, this process's user or the socket's owner. Otherwise
// anyone who can write the directory (a world-writable /tmp, a group-writable volume)
// could put a listener of their own there and collect the tokens sent to it; the client
// dials TCP instead, where TLS checks who answers. Reads metadata only (lstat). The same
// rule as the Python client's (clients/python/src/dsclient/local_socket.py, untrusted).
func untrustedSocket(path string) string {
	file, err := os.Lstat(path)
	if err != nil {
		return err.Error()
	}
	dirPath := filepath.Dir(path)
	dir, err := os.Lstat(dirPath)
	if err != nil {
		return err.Error()
	}
	if file.Mode()&os.ModeSocket == 0 {
		return path + " is not a socket"
	}
	if file.Mode().Perm()&0o002 != 0 {
		return path + " is writable by every user"
	}
	if !dir.IsDir() {
		return dirPath + " is not a directory"
	}
	if dir.Mode().Perm()&0o022 != 0 {
		return fmt.Sprintf("%s is writable by users other than its owner (mode %o)", dirPath, dir.Mode().Perm())
	}
	fileUID, dirUID := owner(file), owner(dir)
	me := uint32(os.Geteuid())
	dirOK := dirUID == 0 || dirUID == me || dirUID == fileUID
	fileOK := fileUID == 0 || fileUID == me || fileUID == dirUID
	if !dirOK || !fileOK {
		return fmt.Sprintf("%s and %s are owned by users %d, %d", path, dirPath, fileUID, dirUID)
	}
	return ""
}

// owner is the user owning a file (lstat's uid).
func owner(info os.FileInfo) uint32 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0) // unknown: nobody's
}

// sidecarTarget is what the client dials for a bound sidecar (§3, local_address): its
// local socket when all of these hold, else its TCP address:
//   - the binding names one (a "unix:" target);
//   - the client can be told there: it has no client certificate, or it sends a token (a
//     socket carries no certificate, so a caller known only by its certificate would be
//     refused UNAUTHENTICATED there; it stays on TCP);
//   - the socket is one nobody but its owner could have put there (untrustedSocket), and
//     the file accepts a connection now (reachable, asked last: in another pod there is no
//     such file, so a client never reaches a sidecar that is not its pod's).
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
