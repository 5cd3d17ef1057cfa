// Command dsread is the Go client's conformance reader (issue 20; the command line is the
// same for the Python, Go and Java clients). Through the mesh it binds GROUP through the
// assigner, reads (Fetch or Stream), prints each record and acks each batch explicitly,
// until it has seen N distinct records; with --direct it reads the topic with
// confluent-kafka-go instead, as the benchmark's baseline.
//
//	dsread --assigner HOST:PORT --group GROUP --client-id ID --expect N
//	       [--mode fetch|stream] [--idle-exit-s S] [--quiet]
//	       [--ca FILE] [--cert FILE --key FILE] [--server-name NAME] [--token-file FILE]
//	       [--sidecar-token-file FILE]
//	dsread --direct --bootstrap HOST:PORT --topic T --group GROUP --expect N [--quiet]
//
// stdout: "rec <topic> <partition> <offset> <epoch> <delivery_count>" per record (unless
// --quiet), then "done distinct=<d> received=<r> acked=<a> seconds=<s>". Exit 0 when done;
// 3 on a terminal error ("error <GRPC_CODE_NAME> <REASON>" on stderr); 4 after S seconds
// without a new record ("error DEADLINE_EXCEEDED idle"); 2 on bad arguments.
//
// Against a secured mesh (docs/client-protocol.md §16): --ca speaks TLS to the assigner
// and every sidecar, verifying them with that CA; --cert/--key add a client certificate
// (mTLS), both or neither; --server-name is the name checked in the servers' certificates
// (default: the host dialled); --token-file sends "authorization: Bearer <token>" on every
// call, the file read again when it changes. --token-file, --cert/--key and --server-name
// need --ca (a token never goes in the clear; the others would be ignored); none of them
// goes with --direct. A file that cannot be read is exit 2.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"dataservice/clients/go/dsclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	exitOK       = 0
	exitUsage    = 2
	exitTerminal = 3
	exitIdle     = 4
)

var errIdle = errors.New("idle")

type args struct {
	assigner, group, clientID, mode string
	bootstrap, topic                string
	expect                          int
	idle                            time.Duration
	quiet, direct                   bool
	tls                             tlsFlags
}

// tlsFlags are the flags of a secured mesh; the zero value is plaintext.
type tlsFlags struct {
	ca, cert, key, serverName, tokenFile string
	sidecarTokenFile                     string // the token sent to sidecars (audience ds-sidecar)
}

func (t tlsFlags) any() bool {
	return t.ca != "" || t.cert != "" || t.key != "" || t.serverName != "" || t.tokenFile != "" ||
		t.sidecarTokenFile != ""
}

// problems are what is wrong with the flags: a half key pair, a flag that needs --ca
// without it, a file that cannot be read.
func (t tlsFlags) problems() []string {
	var out []string
	if (t.cert == "") != (t.key == "") {
		out = append(out, "--cert and --key go together")
	}
	if t.ca == "" {
		if t.tokenFile != "" || t.sidecarTokenFile != "" {
			out = append(out, "--token-file needs --ca: a token is never sent over plaintext")
		}
		if t.cert != "" || t.key != "" || t.serverName != "" {
			out = append(out, "--cert, --key and --server-name need --ca")
		}
	}
	for _, f := range []struct{ flag, path string }{
		{"--ca", t.ca}, {"--cert", t.cert}, {"--key", t.key}, {"--token-file", t.tokenFile},
		{"--sidecar-token-file", t.sidecarTokenFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.ReadFile(f.path); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", f.flag, err))
		}
	}
	return out
}

// options are the client options the flags ask for.
func (t tlsFlags) options() []dsclient.Option {
	var out []dsclient.Option
	if t.ca != "" {
		out = append(out, dsclient.WithTLS(t.ca))
	}
	if t.cert != "" {
		out = append(out, dsclient.WithClientCertificate(t.cert, t.key))
	}
	if t.serverName != "" {
		out = append(out, dsclient.WithServerName(t.serverName))
	}
	if t.tokenFile != "" {
		out = append(out, dsclient.WithTokenFile(t.tokenFile))
	}
	if t.sidecarTokenFile != "" {
		out = append(out, dsclient.WithSidecarTokenFile(t.sidecarTokenFile))
	}
	return out
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func parse(argv []string, stderr io.Writer) (args, error) {
	var a args
	fs := flag.NewFlagSet("dsread", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&a.assigner, "assigner", "", "assigner HOST:PORT (through the mesh)")
	fs.StringVar(&a.group, "group", "", "consumer group")
	fs.StringVar(&a.clientID, "client-id", "", "client id (through the mesh)")
	fs.IntVar(&a.expect, "expect", 0, "stop after this many distinct records")
	fs.StringVar(&a.mode, "mode", "fetch", "fetch (long-poll Fetch) or stream (credit-based Stream)")
	idle := fs.Float64("idle-exit-s", 60, "give up after this many seconds without a new record")
	fs.BoolVar(&a.quiet, "quiet", false, "print the final line only")
	fs.BoolVar(&a.direct, "direct", false, "read the topic with confluent-kafka-go instead of the mesh")
	fs.StringVar(&a.bootstrap, "bootstrap", "", "Kafka bootstrap HOST:PORT (--direct)")
	fs.StringVar(&a.topic, "topic", "", "topic (--direct)")
	fs.StringVar(&a.tls.ca, "ca", "", "TLS: the CA file the servers are verified with")
	fs.StringVar(&a.tls.cert, "cert", "", "mTLS: the client certificate file (with --key)")
	fs.StringVar(&a.tls.key, "key", "", "mTLS: the client key file (with --cert)")
	fs.StringVar(&a.tls.serverName, "server-name", "", "the name checked in the servers' certificates (default: the host)")
	fs.StringVar(&a.tls.tokenFile, "token-file", "", "a bearer token file, sent on every call (needs --ca)")
	fs.StringVar(&a.tls.sidecarTokenFile, "sidecar-token-file", "", "the bearer token file sent to sidecars instead (audience ds-sidecar; needs --ca)")
	if err := fs.Parse(argv); err != nil {
		return a, err
	}
	a.idle = time.Duration(*idle * float64(time.Second))
	var problems []string
	if fs.NArg() > 0 {
		problems = append(problems, "unexpected arguments: "+strings.Join(fs.Args(), " "))
	}
	if a.group == "" {
		problems = append(problems, "--group is required")
	}
	if a.expect <= 0 {
		problems = append(problems, "--expect must be a positive number")
	}
	if *idle <= 0 {
		problems = append(problems, "--idle-exit-s must be positive")
	}
	if a.direct {
		if a.bootstrap == "" || a.topic == "" {
			problems = append(problems, "--direct needs --bootstrap and --topic")
		}
		if a.tls.any() {
			problems = append(problems, "TLS flags are for the mesh: --direct takes none")
		}
	} else {
		problems = append(problems, a.tls.problems()...)
		if a.assigner == "" || a.clientID == "" {
			problems = append(problems, "--assigner and --client-id are required")
		}
		if a.mode != "fetch" && a.mode != "stream" {
			problems = append(problems, "--mode is fetch or stream")
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "dsread:", p)
		}
		fs.Usage()
		return a, errors.New("bad arguments")
	}
	return a, nil
}

func run(argv []string, stdout, stderr io.Writer) int {
	a, err := parse(argv, stderr)
	if err != nil {
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := bufio.NewWriterSize(stdout, 1<<16)
	defer out.Flush()
	t := newTally(a, out)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go t.watchdog(ctx, cancel)
	if a.direct {
		err = readDirect(ctx, a, t, stderr)
	} else {
		err = readMesh(ctx, a, t, stderr)
	}
	if errors.Is(context.Cause(ctx), errIdle) {
		out.Flush()
		fmt.Fprintln(stderr, "error DEADLINE_EXCEEDED idle")
		return exitIdle
	}
	if err != nil {
		out.Flush()
		fmt.Fprintln(stderr, errorLine(err))
		fmt.Fprintln(stderr, err.Error())
		return exitTerminal
	}
	t.done()
	return exitOK
}

// readMesh binds through the assigner and reads until the tally is complete.
func readMesh(ctx context.Context, a args, t *tally, stderr io.Writer) error {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	opts := append([]dsclient.Option{
		dsclient.WithAssigners(a.assigner), dsclient.WithClientID(a.clientID), dsclient.WithLogger(logger),
	}, a.tls.options()...)
	client, err := dsclient.New(ctx, a.group, opts...)
	if err != nil {
		return err
	}
	defer client.Close()
	handle := func(records []dsclient.Record) error {
		t.received(records)
		n, err := client.Ack(ctx, records)
		t.acked(n)
		return err
	}
	if a.mode == "stream" {
		for records, err := range client.Stream(ctx) {
			if err != nil {
				return err
			}
			if err := handle(records); err != nil {
				return err
			}
			if t.complete() {
				return nil
			}
		}
		return ctx.Err()
	}
	for !t.complete() {
		records, err := client.Fetch(ctx)
		if err != nil {
			return err
		}
		if len(records) > 0 {
			if err := handle(records); err != nil {
				return err
			}
		}
	}
	return nil
}

// errorLine is "error <GRPC_CODE_NAME> <REASON>" for a terminal error.
func errorLine(err error) string {
	reason := "-"
	var e *dsclient.Error
	if errors.As(err, &e) && e.Reason != "" {
		reason = e.Reason
	}
	code := status.Code(err)
	switch {
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case code == codes.Unknown && errors.Is(err, dsclient.ErrInvalidArgument):
		code = codes.InvalidArgument
	}
	return fmt.Sprintf("error %s %s", codeName(code), reason)
}

// codeName is the canonical upper-case name of a gRPC code (Go's String() is CamelCase).
func codeName(c codes.Code) string {
	names := [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
		"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
		"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
		"UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
	if int(c) < len(names) {
		return names[c]
	}
	return "UNKNOWN"
}

type recordKey struct {
	topic     string
	partition int32
	offset    int64
}

// tally counts what the reader saw and prints it; safe for the watchdog's reads.
type tally struct {
	a    args
	out  *bufio.Writer
	mu   sync.Mutex
	seen map[recordKey]struct{}
	recv int
	ack  int
	// first and last are when the first and the last record came, progress when the last
	// new one did (the idle watch).
	first, last, progress time.Time
}

func newTally(a args, out *bufio.Writer) *tally {
	return &tally{a: a, out: out, seen: map[recordKey]struct{}{}, progress: time.Now()}
}

func (t *tally) received(records []dsclient.Record) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range records {
		if !t.a.quiet {
			fmt.Fprintf(t.out, "rec %s %d %d %d %d\n", r.Topic, r.Partition, r.Offset, r.LeaseEpoch, r.DeliveryCount)
		}
		t.see(recordKey{r.Topic, r.Partition, r.Offset}, now)
	}
	t.recv += len(records)
	_ = t.out.Flush()
}

func (t *tally) see(k recordKey, now time.Time) {
	if t.first.IsZero() {
		t.first = now
	}
	t.last = now
	if _, ok := t.seen[k]; !ok {
		t.seen[k] = struct{}{}
		t.progress = now
	}
}

func (t *tally) acked(n int) {
	t.mu.Lock()
	t.ack += n
	t.mu.Unlock()
}

func (t *tally) complete() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.seen) >= t.a.expect
}

func (t *tally) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	seconds := 0.0
	if !t.first.IsZero() {
		seconds = t.last.Sub(t.first).Seconds()
	}
	fmt.Fprintf(t.out, "done distinct=%d received=%d acked=%d seconds=%.3f\n", len(t.seen), t.recv, t.ack, seconds)
	_ = t.out.Flush()
}

// watchdog cancels ctx with errIdle once no new record came for the idle time.
func (t *tally) watchdog(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.mu.Lock()
			progress := t.progress
			t.mu.Unlock()
			if now.Sub(progress) >= t.a.idle {
				cancel(errIdle)
				return
			}
		}
	}
}
