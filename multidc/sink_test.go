package multidc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

func recs(link string, from, to int64) []Record {
	var out []Record
	for off := from; off < to; off++ {
		out = append(out, rec(link, off))
	}
	return out
}

// sinkLine is one line of a FileSink file.
type sinkLine struct {
	Offset int64           `json:"offset"`
	Link   string          `json:"link"`
	Record json.RawMessage `json:"record"`
}

// readSinkFile parses a FileSink file; every line must be complete and valid.
func readSinkFile(t testing.TB, path string) []sinkLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sinkLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l sinkLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s line %d: %v: %q", path, len(out)+1, err, sc.Text())
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFileSinkWriteAndRecover(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(testSinkBase(t), "out", "sink.jsonl")
	s, err := openTestFileSink(path, FsyncCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastOffset(ctx); last != -1 {
		t.Fatalf("new file: last = %d", last)
	}
	if _, err := openTestFileSink(path, FsyncCheckpoint); err == nil {
		t.Fatal("a second sink on the same file opened: two routers could write it")
	}
	if err := s.Write(ctx, recs("dc-a", 0, 3)); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, recs("dc-b", 3, 5)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]Record{recs("dc-a", 4, 6), recs("dc-a", 0, 1), {rec("dc-a", 6), rec("dc-a", 8)}} {
		if err := s.Write(ctx, bad); err == nil {
			t.Fatalf("write of offsets %d.. after 4 succeeded", bad[0].Offset)
		}
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readSinkFile(t, path)
	if len(lines) != 5 || lines[4].Offset != 4 || lines[4].Link != "dc-b" || lines[0].Link != "dc-a" {
		t.Fatalf("file = %+v", lines)
	}
	var inner struct {
		Offset int64  `json:"offset"`
		Link   string `json:"link"`
	}
	if err := json.Unmarshal(lines[3].Record, &inner); err != nil || inner.Offset != 3 || inner.Link != "dc-b" {
		t.Fatalf("record of line 4 = %s (%v)", lines[3].Record, err)
	}

	// A torn line (a write cut short by a crash) is cut off, and its offset comes again.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := appendLine(nil, rec("dc-a", 5))
	if _, err := f.Write(torn[:len(torn)-1]); err != nil { // everything but the newline
		t.Fatal(err)
	}
	f.Close()
	s, err = openTestFileSink(path, FsyncAlways)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastOffset(ctx); last != 4 {
		t.Fatalf("after a torn line: last = %d, want 4", last)
	}
	if err := s.Write(ctx, recs("dc-c", 5, 7)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	lines = readSinkFile(t, path)
	for i, l := range lines {
		if l.Offset != int64(i) {
			t.Fatalf("line %d has offset %d", i, l.Offset)
		}
	}
	if len(lines) != 7 || lines[5].Link != "dc-c" {
		t.Fatalf("after recovery the file has %d lines, line 6 from %s", len(lines), lines[5].Link)
	}
}

func TestFileSinkRecoverLongLinesAndForeignFiles(t *testing.T) {
	dir := testSinkBase(t)
	// Lines longer than the tail-reading chunk.
	path := filepath.Join(dir, "long.jsonl")
	s, err := openTestFileSink(path, FsyncNever)
	if err != nil {
		t.Fatal(err)
	}
	big := []Record{{Offset: 0, Link: "dc-a", Data: payload("dc-a", 0, 200_000)}, {Offset: 1, Link: "dc-a", Data: payload("dc-a", 1, 150_000)}}
	if err := s.Write(context.Background(), big); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = openTestFileSink(path, FsyncNever)
	if err != nil {
		t.Fatal(err)
	}
	if last, _ := s.LastOffset(context.Background()); last != 1 {
		t.Fatalf("last = %d, want 1", last)
	}
	s.Close()

	// A file whose last complete line is not ours: refuse to guess.
	path = filepath.Join(dir, "foreign.jsonl")
	if err := os.WriteFile(path, []byte("{\"offset\":0,\"link\":\"dc-a\",\"record\":{}}\nhello world\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openTestFileSink(path, FsyncNever); err == nil {
		t.Fatal("opened a file whose last line is not a router record")
	}
	if _, err := openTestFileSink(filepath.Join(dir, "x"), "sometimes"); err == nil {
		t.Fatal("unknown fsync policy accepted")
	}
}

func TestOpenSink(t *testing.T) {
	dir := testSinkBase(t)
	s, err := OpenSink(context.Background(), "file://"+filepath.Join(dir, "a.jsonl")+"?fsync=always", SinkOptions{SinkDir: filepath.Dir(dir), Tenant: testTenant})
	if err != nil {
		t.Fatal(err)
	}
	if fs, ok := s.(*FileSink); !ok || fs.policy != FsyncAlways {
		t.Fatalf("got %T %+v", s, s)
	}
	s.Close()
	if s, err := OpenSink(context.Background(), "http://127.0.0.1:1/in", SinkOptions{Job: "j"}); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(*HTTPSink); !ok {
		t.Fatalf("got %T", s)
	}
	// Without a sink dir, or outside the tenant's part of it, a file sink does not open.
	if _, err := OpenSink(context.Background(), "file://"+filepath.Join(dir, "b.jsonl"), SinkOptions{}); err == nil {
		t.Error("a file sink opened without a sink dir")
	}
	if _, err := OpenSink(context.Background(), "file://"+filepath.Join(dir, "b.jsonl"), SinkOptions{SinkDir: filepath.Dir(dir), Tenant: "other"}); err == nil {
		t.Error("a file sink opened in another tenant's sink dir")
	}
	for _, bad := range []string{"file://host/x", "file:rel", "kafka://b/t", "http:///x", "::"} {
		if _, err := OpenSink(context.Background(), bad, SinkOptions{}); err == nil {
			t.Errorf("OpenSink(%q) succeeded", bad)
		}
	}
}

// dedupReceiver is what an HTTP sink's receiver should do: keep each offset once, by offset.
type dedupReceiver struct {
	mu       sync.Mutex
	got      []int64
	last     int64
	repeats  int
	requests int
	fail     func(n int) int // status to answer the n-th request with, 0 for normal
}

func (d *dedupReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.requests++
	body, _ := io.ReadAll(r.Body)
	if code := d.fail(d.requests); code != 0 {
		if code == -1 { // take it, then fail: the sender must repeat an accepted batch
			d.take(body)
			code = http.StatusBadGateway
		}
		http.Error(w, "injected", code)
		return
	}
	first, _ := strconv.ParseInt(r.Header.Get(HeaderFirstOffset), 10, 64)
	lastH, _ := strconv.ParseInt(r.Header.Get(HeaderLastOffset), 10, 64)
	n := d.take(body)
	if n != lastH-first+1 || r.Header.Get("Idempotency-Key") != fmt.Sprintf("job1:%d-%d", first, lastH) {
		http.Error(w, "bad headers", http.StatusTeapot)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (d *dedupReceiver) take(body []byte) int64 {
	var n int64
	for _, line := range bytes.Split(bytes.TrimSpace(body), []byte("\n")) {
		var l sinkLine
		if json.Unmarshal(line, &l) != nil {
			continue
		}
		n++
		if l.Offset <= d.last && len(d.got) > 0 {
			d.repeats++
			continue
		}
		d.got = append(d.got, l.Offset)
		d.last = l.Offset
	}
	return n
}

func TestHTTPSinkRetriesAndIsIdempotentByOffset(t *testing.T) {
	recv := &dedupReceiver{last: -1, fail: func(n int) int {
		switch n % 5 {
		case 1:
			return http.StatusServiceUnavailable
		case 3:
			return -1
		}
		return 0
	}}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	s := NewHTTPSink(srv.URL, HTTPSinkOptions{Job: "job1", MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	for from := int64(0); from < 100; from += 10 {
		if err := s.Write(ctx, recs("dc-a", from, from+10)); err != nil {
			t.Fatal(err)
		}
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.got) != 100 || recv.repeats == 0 {
		t.Fatalf("receiver kept %d offsets (%d repeats dropped), want 100 with some repeats", len(recv.got), recv.repeats)
	}
	for i, off := range recv.got {
		if off != int64(i) {
			t.Fatalf("receiver offset %d at %d", off, i)
		}
	}
	// A dead receiver: Write gives up when ctx is done.
	srv.Close()
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.Write(cctx, recs("dc-a", 100, 101)); err == nil {
		t.Fatal("write to a closed server succeeded")
	}
}

// testTenant owns the tests' file sinks: they live below SINKDIR/testTenant/.
const testTenant = "acme"

// testSinkBase makes a sink dir with the test tenant's directory in it, as an agent does,
// and returns the tenant's directory, SINKDIR/acme.
func testSinkBase(t testing.TB) string {
	t.Helper()
	base := filepath.Join(t.TempDir(), "sinks", testTenant)
	if err := os.MkdirAll(base, 0o750); err != nil {
		t.Fatal(err)
	}
	return base
}

// openTestFileSink opens a file sink at path, below some SINKDIR/acme/ (testSinkBase).
func openTestFileSink(path string, policy FsyncPolicy) (*FileSink, error) {
	i := strings.LastIndex(path, "/"+testTenant+"/")
	if i < 0 {
		return nil, fmt.Errorf("test sink %s is not below a dir named %s", path, testTenant)
	}
	return OpenFileSink(path[:i], testTenant, path, FileSinkOptions{Policy: policy})
}

// TestHTTPSinkSendsOutputSecret: with an output secret, every request carries it as a bearer
// token, read from its file for each request, so that a rotated secret (the file replaced)
// is sent from the next one on; a secret that cannot be a header, or is missing, holds the
// batch back (retried) rather than sending it without credentials.
func TestHTTPSinkSendsOutputSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, ".tmp"), []byte(v), 0o400); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, ".tmp"), filepath.Join(dir, "sinkpass")); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var auths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		auths = append(auths, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	cred, err := OutputCredential(dir, "sinkpass")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := OutputCredential(dir, ""); c != nil || err != nil {
		t.Fatalf("no output secret: %v %v", c, err)
	}
	if _, err := OutputCredential(dir, "../x"); err == nil {
		t.Fatal("an output secret named ../x")
	}
	s := NewHTTPSink(srv.URL, HTTPSinkOptions{Job: "job1", MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		Credential: cred, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	// Not delivered yet: nothing is sent until it is.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := s.Write(cctx, recs("dc-a", 0, 1)); err == nil || !strings.Contains(err.Error(), "not delivered yet") {
		t.Errorf("without the secret's file: %v", err)
	}
	cancel()
	write("token-one\n")
	if err := s.Write(ctx, recs("dc-a", 0, 5)); err != nil {
		t.Fatal(err)
	}
	write("token-two")
	if err := s.Write(ctx, recs("dc-a", 5, 10)); err != nil {
		t.Fatal(err)
	}
	write("two\nlines")
	cctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := s.Write(cctx, recs("dc-a", 10, 11)); err == nil || !strings.Contains(err.Error(), "holds a line break") || strings.Contains(err.Error(), "lines") {
		t.Errorf("a secret with a line break: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) != 2 || auths[0] != "Bearer token-one" || auths[1] != "Bearer token-two" {
		t.Errorf("the receiver got Authorization %q; want the secret as it was at each request", auths)
	}
}

// TestOpenSinkRefusesSecretInClear: where the credential would leave the host, the router
// refuses a sink that would get it unencrypted over a network (a command line made by hand
// or forged, which the master's check at submit never saw), before it connects anywhere;
// the same sinks without a credential, or on loopback, open.
func TestOpenSinkRefusesSecretInClear(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sinkpass"), []byte("s3cret-77\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	cred, err := OutputCredential(dir, "sinkpass")
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	// 192.0.2.0/24 is TEST-NET-1: nothing answers there, so a sink that tried to connect
	// would fail with a connect error, not the refusal.
	for _, raw := range []string{
		"http://192.0.2.7:8080/in",
		"postgres://app@192.0.2.5/orders?table=out",
		"postgres://app@192.0.2.5/orders?table=out&sslmode=prefer",
		"nats://192.0.2.9:4222/out",
		"nats://127.0.0.1:4222,192.0.2.9:4222/out?tls=false",
	} {
		for _, o := range []SinkOptions{{Job: "j", Credential: cred, Logger: quiet}, {Job: "j", Password: cred.Bytes, Logger: quiet}} {
			s, err := OpenSink(ctx, raw, o)
			if err == nil {
				s.Close()
			}
			if !errors.Is(err, cluster.ErrSecretInClear) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s with a credential: %v, want the refusal", raw, err)
			}
		}
	}
	for _, o := range []SinkOptions{{Job: "j", Logger: quiet}, {Job: "j", Credential: cred, Logger: quiet}} {
		for _, raw := range []string{"http://192.0.2.7:8080/in", "https://192.0.2.7/in", "http://127.0.0.1:1/in"} {
			if o.Credential != nil && raw == "http://192.0.2.7:8080/in" {
				continue
			}
			s, err := OpenSink(ctx, raw, o)
			if err != nil {
				t.Errorf("%s (credential %v): %v", raw, o.Credential != nil, err)
				continue
			}
			s.Close()
		}
	}
}
