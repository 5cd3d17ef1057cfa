package dsclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/local"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// §3 local_address: the socket only when the binding names a unix: target, the client can
// be told there (no certificate, or a token with it) and the file accepts now; the check
// of the file is made last, and only for a unix: target.
func TestSidecarTarget(t *testing.T) {
	const tcp, sock = "10.0.0.7:7000", "unix:/run/ds/sidecar-s1.sock"
	certOnly := tlsConfig{caFile: "ca", certFile: "c", keyFile: "k"}
	cases := []struct {
		name, local string
		tls         tlsConfig
		accepts     bool
		want        string
		asked       []string
	}{
		{"no socket named", "", tlsConfig{}, true, tcp, nil},
		{"not a unix target", "dns:sidecar:7000", tlsConfig{}, true, tcp, nil},
		{"an empty unix target", "unix:", tlsConfig{}, true, tcp, nil},
		{"plaintext, accepting", sock, tlsConfig{}, true, sock, []string{"/run/ds/sidecar-s1.sock"}},
		{"unix:// form", "unix:///run/ds/sidecar-s1.sock", tlsConfig{}, true, "unix:///run/ds/sidecar-s1.sock", []string{"/run/ds/sidecar-s1.sock"}},
		{"not accepting", sock, tlsConfig{}, false, tcp, []string{"/run/ds/sidecar-s1.sock"}},
		{"TLS and a token", sock, tlsConfig{caFile: "ca", token: "x"}, true, sock, []string{"/run/ds/sidecar-s1.sock"}},
		{"a certificate and a token file", sock, tlsConfig{caFile: "ca", certFile: "c", keyFile: "k", tokenFile: "f"}, true, sock, []string{"/run/ds/sidecar-s1.sock"}},
		{"known by its certificate only", sock, certOnly, true, tcp, nil},
	}
	for _, tc := range cases {
		var asked []string
		got := sidecarTarget(tcp, tc.local, tc.tls, func(p string) bool { asked = append(asked, p); return tc.accepts })
		if got != tc.want || strings.Join(asked, ",") != strings.Join(tc.asked, ",") {
			t.Errorf("%s: target %q (asked %v), want %q (asked %v)", tc.name, got, asked, tc.want, tc.asked)
		}
	}
}

func TestAcceptsNow(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	lis, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	stale := staleSocket(t, filepath.Join(dir, "stale.sock"))
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{live: true, stale: false, plain: false, filepath.Join(dir, "none.sock"): false} {
		if got := acceptsNow(path); got != want {
			t.Errorf("acceptsNow(%s) = %v, want %v", filepath.Base(path), got, want)
		}
	}
}

// staleSocket leaves a socket file no process accepts on, as a killed sidecar does.
func staleSocket(t *testing.T, path string) string {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = lis.Close()
	return path
}

// transports counts the calls a sidecar received by transport ("unix" or "tcp") and the
// authorization each carried.
type transports struct {
	mu    sync.Mutex
	calls []string // "network Method authorization"
}

func (tr *transports) interceptor() grpc.ServerOption {
	return grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		network := "?"
		if p, ok := peer.FromContext(ctx); ok {
			network = p.LocalAddr.Network()
		}
		seen := &seenTokens{}
		seen.record(ctx, info.FullMethod)
		tr.mu.Lock()
		tr.calls = append(tr.calls, network+" "+seen.calls[0])
		tr.mu.Unlock()
		return h(ctx, req)
	})
}

// streamInterceptor counts the streams a sidecar received, as interceptor the unary calls.
func (tr *transports) streamInterceptor() grpc.ServerOption {
	return grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		network := "?"
		if p, ok := peer.FromContext(ss.Context()); ok {
			network = p.LocalAddr.Network()
		}
		seen := &seenTokens{}
		seen.record(ss.Context(), info.FullMethod)
		tr.mu.Lock()
		tr.calls = append(tr.calls, network+" "+seen.calls[0])
		tr.mu.Unlock()
		return h(srv, ss)
	})
}

func (tr *transports) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.calls...)
}

// localSidecar serves one fakeSidecar on TCP (with tcpCreds, nil: plaintext) and on the
// socket file path with gRPC's local credentials, as the sidecar does with --uds-dir.
func localSidecar(t *testing.T, f *fakeSidecar, tr *transports, tcpCreds credentials.TransportCredentials, path string) string {
	t.Helper()
	opts := []grpc.ServerOption{tr.interceptor()}
	if tcpCreds != nil {
		opts = append(opts, grpc.Creds(tcpCreds))
	}
	tcp := grpc.NewServer(opts...)
	sidecarv1.RegisterStreamServiceServer(tcp, f)
	addr := serveOn(t, tcp, "tcp", "127.0.0.1:0")
	if path != "" {
		uds := grpc.NewServer(grpc.Creds(local.NewCredentials()), tr.interceptor())
		sidecarv1.RegisterStreamServiceServer(uds, f)
		serveOn(t, uds, "unix", path)
	}
	return addr
}

func localBinding(address, localAddress string) *assignerv1.Binding {
	b := binding(1, address)
	b.Endpoints[0].SidecarId = "s1"
	b.Endpoints[0].LocalAddress = localAddress
	return b
}

// fetchAndAck reads one batch, acks it and closes the client (which gives back what it
// holds: Nack), and returns the sidecar's calls.
func fetchAndAck(t *testing.T, tr *transports, opts ...Option) []string {
	t.Helper()
	ctx := testContext(t)
	c, err := New(ctx, "g", opts...)
	if err != nil {
		t.Fatal(err)
	}
	records, err := c.Fetch(ctx)
	if err != nil || len(records) != 2 {
		t.Fatalf("Fetch = %v, %v", records, err)
	}
	if records[0].sidecar != c.Endpoints()[0].Address {
		t.Errorf("the records name sidecar %q, want its TCP address %q (the key of acks)", records[0].sidecar, c.Endpoints()[0].Address)
	}
	if n, err := c.Ack(ctx, records); n != 2 || err != nil {
		t.Fatalf("Ack = %d, %v", n, err)
	}
	c.Close()
	return tr.list()
}

// twoRecords is a fakeSidecar's Fetch: the two records fetchAndAck expects.
func twoRecords(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) {
	return batchFrom(3, 4), nil
}

// readBoundTo reads through a plaintext fake sidecar whose binding names the socket file
// socketPath (served on it too when serveSocket) and returns the sidecar's calls.
func readBoundTo(t *testing.T, socketPath string, serveSocket bool) []string {
	t.Helper()
	tr := &transports{}
	socket := ""
	if serveSocket {
		socket = socketPath
	}
	addr := localSidecar(t, &fakeSidecar{fetch: twoRecords}, tr, nil, socket)
	asg := newFakeAssigner(t, bound(localBinding(addr, "unix:"+socketPath)))
	return fetchAndAck(t, tr, WithAssigners(asg.addr))
}

// checkCalls reports the sidecar's calls when they are not want.
func checkCalls(t *testing.T, what string, calls, want []string) {
	t.Helper()
	if strings.Join(calls, "; ") != strings.Join(want, "; ") {
		t.Errorf("%s: %v, want %v", what, calls, want)
	}
}

// A binding naming the sidecar's socket: the client fetches and acks over it, TCP unused.
func TestTheClientReadsOverTheSidecarsLocalSocket(t *testing.T) {
	calls := readBoundTo(t, filepath.Join(t.TempDir(), "sidecar-s1.sock"), true)
	checkCalls(t, "the sidecar's calls", calls, []string{"unix Fetch (none)", "unix Ack (none)", "unix Nack (none)"})
}

// A binding naming a socket that does not exist, or a stale file nothing accepts on
// (a killed sidecar's): the client reads over TCP.
func TestASocketThatDoesNotAcceptFallsBackToTCP(t *testing.T) {
	dir := t.TempDir()
	for name, path := range map[string]string{
		"missing": filepath.Join(dir, "sidecar-s1.sock"),
		"stale":   staleSocket(t, filepath.Join(dir, "sidecar-s2.sock")),
	} {
		t.Run(name, func(t *testing.T) {
			calls := readBoundTo(t, path, false)
			checkCalls(t, "the sidecar's calls", calls, []string{"tcp Fetch (none)", "tcp Ack (none)", "tcp Nack (none)"})
		})
	}
}

// Over TLS: a client with a token reads over the socket and sends its token there (local
// credentials, no TLS on the socket); one known by its client certificate only stays on
// TCP (mTLS), where the sidecar can tell who it is.
func TestOnTheSocketTheTokenIsSentAndACertificateOnlyClientStaysOnTCP(t *testing.T) {
	pki := newTestPKI(t)
	_, _, serverPair := pki.issue(t, "mesh.test", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey, _ := pki.issue(t, "reader", x509.ExtKeyUsageClientAuth)
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverPair}, ClientCAs: pki.pool,
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12,
	})
	tr := &transports{}
	path := filepath.Join(t.TempDir(), "sidecar-s1.sock")
	addr := localSidecar(t, &fakeSidecar{fetch: twoRecords}, tr, creds, path)
	asg := &fakeAssigner{bind: bound(localBinding(addr, "unix:"+path)), watch: make(chan *assignerv1.Binding, 1), ends: make(chan error, 1)}
	asgSrv := grpc.NewServer(grpc.Creds(creds))
	assignerv1.RegisterBindingServiceServer(asgSrv, asg)
	base := []Option{WithAssigners(serveOn(t, asgSrv, "tcp", "127.0.0.1:0")), WithTLS(pki.caFile), WithServerName("mesh.test")}

	calls := fetchAndAck(t, tr, append(base, WithToken("tok-1"))...)
	checkCalls(t, "with a token", calls, []string{"unix Fetch Bearer tok-1", "unix Ack Bearer tok-1", "unix Nack Bearer tok-1"})

	n := len(calls)
	calls = fetchAndAck(t, tr, append(base, WithClientCertificate(clientCert, clientKey))...)[n:]
	checkCalls(t, "with a certificate only", calls, []string{"tcp Fetch (none)", "tcp Ack (none)", "tcp Nack (none)"})
}

// socketServer serves f on the socket file path with gRPC's local credentials, as the
// sidecar does with --uds-dir, until stopped (a killed sidecar) or the test ends.
func socketServer(t *testing.T, f sidecarv1.StreamServiceServer, tr *transports, path string) *grpc.Server {
	t.Helper()
	s := grpc.NewServer(grpc.Creds(local.NewCredentials()), tr.interceptor(), tr.streamInterceptor())
	sidecarv1.RegisterStreamServiceServer(s, f)
	serveOn(t, s, "unix", path)
	return s
}

// §3: a call over the socket that fails UNAVAILABLE (the socket's server died; TCP still
// serves) moves the sidecar to TCP at once: the same Fetch gets its records there, and
// the acks go there. The next binding that names the socket, once it accepts again,
// moves the client back to it.
func TestAFailedSocketFallsBackToTCPAndTheNextBindingTriesItAgain(t *testing.T) {
	tr := &transports{}
	f := &fakeSidecar{fetch: twoRecords}
	path := filepath.Join(t.TempDir(), "sidecar-s1.sock")
	addr := localSidecar(t, f, tr, nil, "")
	socket := socketServer(t, f, tr, path)
	asg := newFakeAssigner(t, bound(localBinding(addr, "unix:"+path)))
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(asg.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	read := func(what string) {
		t.Helper()
		records, err := c.Fetch(ctx)
		if err != nil || len(records) != 2 {
			t.Fatalf("%s: Fetch = %v, %v", what, records, err)
		}
		if n, err := c.Ack(ctx, records); n != 2 || err != nil {
			t.Fatalf("%s: Ack = %d, %v", what, n, err)
		}
	}
	read("over the socket")
	socket.Stop()
	read("after the socket died")
	if got := c.sidecarAt(addr).dials(); got != addr {
		t.Fatalf("after UNAVAILABLE on the socket the client dials %q, want %q", got, addr)
	}

	socketServer(t, f, tr, path) // the sidecar serves its socket again
	b := localBinding(addr, "unix:"+path)
	b.Version = 2
	asg.watch <- b
	waitFor(t, "the next binding to move the client back to the socket", func() bool {
		return c.sidecarAt(addr).dials() == "unix:"+path
	})
	read("back on the socket")
	checkCalls(t, "the sidecar's calls", tr.list(), []string{
		"unix Fetch (none)", "unix Ack (none)", "tcp Fetch (none)", "tcp Ack (none)", "unix Fetch (none)", "unix Ack (none)",
	})
}

// §3, §7: a Stream over the socket that ends UNAVAILABLE because the socket's server died
// is opened again over TCP, and the records go on coming.
func TestAStreamOverAFailedSocketIsOpenedAgainOverTCP(t *testing.T) {
	tr := &transports{}
	f := &streamSidecar{total: 1000, per: 1}
	path := filepath.Join(t.TempDir(), "sidecar-s1.sock")
	tcp := grpc.NewServer(tr.interceptor(), tr.streamInterceptor())
	sidecarv1.RegisterStreamServiceServer(tcp, f)
	addr := serveOn(t, tcp, "tcp", "127.0.0.1:0")
	socket := socketServer(t, f, tr, path)
	asg := newFakeAssigner(t, bound(localBinding(addr, "unix:"+path)))
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(asg.addr), WithMaxRecords(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, stoppedAt := 0, -1
	for records, err := range c.Stream(ctx) {
		if err != nil {
			t.Fatalf("after %d records: %v", got, err)
		}
		got += len(records)
		if stoppedAt < 0 && got >= 2 {
			socket.Stop()
			stoppedAt = got
		}
		// At most a window (3) of records was on its way over the socket when it died:
		// the rest came over TCP.
		if stoppedAt >= 0 && got >= stoppedAt+10 {
			break
		}
	}
	checkCalls(t, "the sidecar's streams", tr.list(), []string{"unix Stream (none)", "tcp Stream (none)"})
}

// §3: only UNAVAILABLE over the channel the sidecar dials now moves it off its socket: the
// end of a call over a channel the client already replaced (a socket it left, TCP before
// a binding moved it back) says nothing about the socket it dials now.
func TestOnlyAFailureOverTheSocketItDialsNowMovesASidecarToTCP(t *testing.T) {
	const addr, sock = "127.0.0.1:1", "unix:/nonexistent/sidecar-s1.sock"
	cfg := defaults()
	dialOpts, err := cfg.dialOptions()
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{cfg: cfg, dialOpts: dialOpts, sidecarOpts: dialOpts, localOpts: cfg.localDialOptions(), logger: cfg.logger, sidecars: map[string]*sidecar{}}
	older, err := grpc.NewClient(addr, dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	now, err := grpc.NewClient(sock, c.localOpts...)
	if err != nil {
		t.Fatal(err)
	}
	s := newSidecar(addr, sock, addr, older)
	s.attach(now, sock) // moved back to the socket by a binding
	c.sidecars[addr] = s
	defer s.close()
	unavailable := status.Error(codes.Unavailable, "gone")

	c.fallBack(s, older, unavailable)
	c.fallBack(s, now, status.Error(codes.DeadlineExceeded, "slow"))
	if got := s.dials(); got != sock {
		t.Fatalf("after a failure over the replaced channel, or not UNAVAILABLE: dials %q, want %q", got, sock)
	}
	c.fallBack(s, now, unavailable)
	if got := s.dials(); got != addr {
		t.Fatalf("after UNAVAILABLE over the socket: dials %q, want %q", got, addr)
	}
}

// Issue 37, finding 1: the client sends its calls (and its token) to a socket only when
// nobody but its owner could have placed it, as the Python client does: a socket in a
// directory its group or every user may write (a world-writable /tmp, a group-writable
// volume), reached through a link, or writable by every user, is not used: the client
// reads over TCP, where TLS checks who answers.
func TestASocketOthersCouldHavePlacedIsNotUsed(t *testing.T) {
	root := t.TempDir()
	private := filepath.Join(root, "private")
	if err := os.Mkdir(private, 0o750); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func() (string, string){
		"own 0750 directory": func() (string, string) {
			return filepath.Join(private, "sidecar-s1.sock"), ""
		},
		"group-writable directory": func() (string, string) {
			dir := filepath.Join(root, "group")
			mustMkdir(t, dir, 0o770)
			return filepath.Join(dir, "sidecar-s1.sock"), "writable by users other than its owner"
		},
		"world-writable directory": func() (string, string) {
			dir := filepath.Join(root, "tmp")
			mustMkdir(t, dir, 0o1777)
			return filepath.Join(dir, "sidecar-s1.sock"), "writable by users other than its owner"
		},
		"directory reached through a link": func() (string, string) {
			link := filepath.Join(root, "link")
			if err := os.Symlink(private, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "sidecar-s2.sock"), "is not a directory"
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			path, why := setup()
			tr := &transports{}
			addr := localSidecar(t, &fakeSidecar{fetch: twoRecords}, tr, nil, path)
			got := untrustedSocket(path)
			if (why == "") != (got == "") || !strings.Contains(got, why) {
				t.Fatalf("untrustedSocket(%s) = %q, want %q", name, got, why)
			}
			t.Logf("%s: %q", name, got)
			asg := newFakeAssigner(t, bound(localBinding(addr, "unix:"+path)))
			calls := fetchAndAck(t, tr, WithAssigners(asg.addr))
			network := "unix"
			if why != "" {
				network = "tcp"
			}
			want := []string{network + " Fetch (none)", network + " Ack (none)", network + " Nack (none)"}
			checkCalls(t, name, calls, want)
		})
	}
	// A socket file every user may write, and a plain file, are refused as well.
	sock := filepath.Join(private, "sidecar-s3.sock")
	staleSocket(t, sock)
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	if got := untrustedSocket(sock); !strings.Contains(got, "writable by every user") {
		t.Errorf("a 0777 socket: %q", got)
	}
	plain := filepath.Join(private, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := untrustedSocket(plain); !strings.Contains(got, "is not a socket") {
		t.Errorf("a plain file: %q", got)
	}
}

func mustMkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
}
