package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"dataservice/clients/go/dsclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBadArgumentsExitTwoWithUsage(t *testing.T) {
	for _, argv := range [][]string{
		{},
		{"--group", "g", "--expect", "1"},
		{"--assigner", "a:1", "--group", "g", "--client-id", "c", "--expect", "0"},
		{"--assigner", "a:1", "--group", "g", "--client-id", "c", "--expect", "1", "--mode", "push"},
		{"--direct", "--group", "g", "--expect", "1"},
		{"--no-such-flag"},
	} {
		var out, errb bytes.Buffer
		if code := run(argv, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", argv, code, exitUsage)
		}
		if out.Len() != 0 || !strings.Contains(errb.String(), "Usage") {
			t.Errorf("%v: stdout %q, stderr %q", argv, out.String(), errb.String())
		}
	}
}

func TestTheErrorLineNamesTheCodeAndTheReason(t *testing.T) {
	if got := errorLine(&dsclient.Error{Op: "Bind", Code: codes.NotFound, Reason: "GROUP_NOT_FOUND"}); got != "error NOT_FOUND GROUP_NOT_FOUND" {
		t.Errorf("errorLine = %q", got)
	}
	if got := errorLine(status.Error(codes.PermissionDenied, "x")); got != "error PERMISSION_DENIED -" {
		t.Errorf("errorLine = %q", got)
	}
	if got := errorLine(context.DeadlineExceeded); got != "error DEADLINE_EXCEEDED -" {
		t.Errorf("errorLine = %q", got)
	}
}

// §16: the TLS flags. A half key pair, a flag that needs --ca without it (--token-file
// above all: C46), an unreadable file, or any of them with --direct is exit 2.
func TestTheTLSFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ca, cert, key, token := file("ca.pem"), file("client.pem"), file("client-key.pem"), file("token")
	mesh := []string{"--assigner", "a:1", "--group", "g", "--client-id", "c", "--expect", "1"}
	for _, tc := range []struct {
		flags []string
		why   string
	}{
		{[]string{"--ca", ca, "--cert", cert}, "--cert and --key go together"},
		{[]string{"--ca", ca, "--key", key}, "--cert and --key go together"},
		{[]string{"--token-file", token}, "--token-file needs --ca"},
		{[]string{"--cert", cert, "--key", key}, "need --ca"},
		{[]string{"--server-name", "mesh"}, "need --ca"},
		{[]string{"--ca", filepath.Join(dir, "missing.pem")}, "--ca: open"},
		{[]string{"--ca", ca, "--token-file", filepath.Join(dir, "missing")}, "--token-file: open"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string(nil), mesh...), tc.flags...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.why) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.flags, code, errb.String(), exitUsage, tc.why)
		}
	}
	direct := []string{"--direct", "--bootstrap", "b:1", "--topic", "t", "--group", "g", "--expect", "1"}
	for _, flags := range [][]string{{"--ca", ca}, {"--server-name", "mesh"}, {"--ca", ca, "--token-file", token}} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string(nil), direct...), flags...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "TLS flags are for the mesh") {
			t.Errorf("--direct %v: exit %d, stderr %q", flags, code, errb.String())
		}
	}
	var errb bytes.Buffer
	a, err := parse(append(mesh, "--ca", ca, "--cert", cert, "--key", key, "--server-name", "mesh", "--token-file", token), &errb)
	if err != nil || a.tls != (tlsFlags{ca: ca, cert: cert, key: key, serverName: "mesh", tokenFile: token}) || len(a.tls.options()) != 4 {
		t.Errorf("parse = %+v, %v (%s)", a.tls, err, errb.String())
	}
}
