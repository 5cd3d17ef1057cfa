package dsclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	assignerv1 "dataservice/clients/go/gen/dataservice/assigner/v1"
	sidecarv1 "dataservice/clients/go/gen/dataservice/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// testPKI is a CA made for one test, and certificates it signed, as PEM files in a
// temporary directory.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caFile string
	pool   *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{dir: t.TempDir(), ca: ca, caKey: key, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *testPKI) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue signs a certificate for name (a server's DNS name and 127.0.0.1, or a client's
// common name) and writes it and its key; it returns their paths and the pair.
func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (string, string, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		DNSNames: []string{name}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile := p.write(t, name+".pem", "CERTIFICATE", der)
	keyFile := p.write(t, name+"-key.pem", "PRIVATE KEY", keyDER)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// seenTokens records the authorization metadata of every call a server received.
type seenTokens struct {
	mu    sync.Mutex
	calls []string // "Method Bearer ..."
}

func (s *seenTokens) record(ctx context.Context, method string) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, filepath.Base(method)+" "+firstOf(md.Get("authorization")))
}

func (s *seenTokens) since(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls[n:]...)
}

func firstOf(vs []string) string {
	if len(vs) == 0 {
		return "(none)"
	}
	return vs[0]
}

// C47: over TLS with a client certificate (mTLS), every call carries "authorization:
// Bearer <token>" read from the token file, and a rotated file is sent from the next call
// on. The servers are in-process, with a CA made by the test.
// tlsMesh is an in-process assigner and sidecar on one TLS port requiring a client
// certificate (mTLS), recording every call's token, and the client's certificate.
type tlsMesh struct {
	pki                   *testPKI
	addr                  string
	seen                  *seenTokens
	asg                   *fakeAssigner
	clientCert, clientKey string
}

func newTLSMesh(t *testing.T) *tlsMesh {
	pki := newTestPKI(t)
	_, _, serverPair := pki.issue(t, "mesh.test", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey, _ := pki.issue(t, "reader", x509.ExtKeyUsageClientAuth)
	seen := &seenTokens{}
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{serverPair}, ClientCAs: pki.pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})
	srv := grpc.NewServer(grpc.Creds(creds),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			seen.record(ctx, info.FullMethod)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			seen.record(ss.Context(), info.FullMethod)
			return h(srv, ss)
		}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	asg := &fakeAssigner{bind: bound(binding(1, addr)), watch: make(chan *assignerv1.Binding, 1), ends: make(chan error, 1)}
	sc := &fakeSidecar{fetch: func(*sidecarv1.FetchRequest) (*sidecarv1.FetchResponse, error) { return batchFrom(1), nil }}
	assignerv1.RegisterBindingServiceServer(srv, asg)
	sidecarv1.RegisterStreamServiceServer(srv, sc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	return &tlsMesh{pki: pki, addr: addr, seen: seen, asg: asg, clientCert: clientCert, clientKey: clientKey}
}

func TestARotatedTokenFileIsSentFromTheNextCallOn(t *testing.T) {
	m := newTLSMesh(t)
	pki, addr, seen, asg, clientCert, clientKey := m.pki, m.addr, m.seen, m.asg, m.clientCert, m.clientKey
	tokenFile := filepath.Join(pki.dir, "token")
	if err := os.WriteFile(tokenFile, []byte("token-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(addr), WithTLS(pki.caFile), WithClientCertificate(clientCert, clientKey),
		WithServerName("mesh.test"), WithTokenFile(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	records, err := c.Fetch(ctx)
	if err != nil || len(records) != 1 {
		t.Fatalf("Fetch = %v, %v", records, err)
	}
	if n, err := c.Ack(ctx, records); n != 1 || err != nil {
		t.Fatalf("Ack = %d, %v", n, err)
	}
	waitFor(t, "the watch", func() bool { asg.mu.Lock(); defer asg.mu.Unlock(); return len(asg.known) == 1 })
	before := seen.since(0)
	want := map[string]bool{"Bind": false, "WatchBinding": false, "Fetch": false, "Ack": false}
	for _, call := range before {
		method, token, _ := strings.Cut(call, " ")
		if token != "Bearer token-one" {
			t.Errorf("%s carried %q; want Bearer token-one", method, token)
		}
		want[method] = true
	}
	for method, got := range want {
		if !got {
			t.Errorf("no %s call seen: %v", method, before)
		}
	}

	// Rotated (another length), then rotated again to a token of the same length, as a
	// renewed token usually is: each is sent from the next call on.
	for _, token := range []string{"token-number-two", "token-number-six"} {
		time.Sleep(20 * time.Millisecond) // a later modification time than the last write
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		n := len(seen.since(0))
		if _, err := c.Fetch(ctx); err != nil {
			t.Fatal(err)
		}
		after := seen.since(n)
		if len(after) == 0 || after[0] != "Fetch Bearer "+token {
			t.Errorf("after the rotation to %s: %v", token, after)
		}
	}
}

// Issue 37: tokens are scoped by audience. With WithSidecarTokenFile the assigner's calls
// (Bind, WatchBinding) carry the token file's token and the sidecars' calls (Fetch, Ack)
// the sidecar token, never the other way round: what a sidecar receives is no good at
// the assigner.
func TestTheSidecarsGetTheSidecarTokenAndTheAssignerItsOwn(t *testing.T) {
	m := newTLSMesh(t)
	assignerToken := filepath.Join(m.pki.dir, "assigner.jwt")
	sidecarToken := filepath.Join(m.pki.dir, "sidecar.jwt")
	for path, token := range map[string]string{assignerToken: "for-the-assigner", sidecarToken: "for-the-sidecars"} {
		if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx := testContext(t)
	c, err := New(ctx, "g", WithAssigners(m.addr), WithTLS(m.pki.caFile), WithClientCertificate(m.clientCert, m.clientKey),
		WithServerName("mesh.test"), WithTokenFile(assignerToken), WithSidecarTokenFile(sidecarToken))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	records, err := c.Fetch(ctx)
	if err != nil || len(records) != 1 {
		t.Fatalf("Fetch = %v, %v", records, err)
	}
	if n, err := c.Ack(ctx, records); n != 1 || err != nil {
		t.Fatalf("Ack = %d, %v", n, err)
	}
	waitFor(t, "the watch", func() bool { m.asg.mu.Lock(); defer m.asg.mu.Unlock(); return len(m.asg.known) == 1 })
	want := map[string]string{
		"Bind": "Bearer for-the-assigner", "WatchBinding": "Bearer for-the-assigner",
		"Fetch": "Bearer for-the-sidecars", "Ack": "Bearer for-the-sidecars",
	}
	seen := map[string]bool{}
	for _, call := range m.seen.since(0) {
		method, token, _ := strings.Cut(call, " ")
		if expected, ok := want[method]; ok && token != expected {
			t.Errorf("%s carried %q; want %q", method, token, expected)
		}
		seen[method] = true
	}
	for method := range want {
		if !seen[method] {
			t.Errorf("no %s call seen: %v", method, m.seen.since(0))
		}
	}
}
