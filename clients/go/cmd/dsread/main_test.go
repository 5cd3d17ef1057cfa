package main

import (
	"bytes"
	"context"
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
