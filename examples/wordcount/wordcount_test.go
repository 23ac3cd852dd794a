package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

func TestMine(t *testing.T) {
	for _, tc := range []struct {
		workers, worker int
		want            []int64 // offsets 0..9 that are the worker's
	}{
		{1, 0, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{3, 0, []int64{0, 3, 6, 9}},
		{3, 1, []int64{1, 4, 7}},
		{3, 2, []int64{2, 5, 8}},
		{4, 3, []int64{3, 7}},
		{12, 11, nil},
	} {
		var got []int64
		for off := int64(0); off < 10; off++ {
			if Mine(off, tc.worker, tc.workers) {
				got = append(got, off)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("worker %d of %d: offsets %v, want %v", tc.worker, tc.workers, got, tc.want)
		}
	}
	// Every line belongs to exactly one worker.
	for off := int64(0); off < 100; off++ {
		n := 0
		for w := 0; w < 7; w++ {
			if Mine(off, w, 7) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("offset %d belongs to %d of 7 workers", off, n)
		}
	}
}

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		line string
		want map[string]int
	}{
		{"", map[string]int{}},
		{"   \t ", map[string]int{}},
		{"the quick the", map[string]int{"the": 2, "quick": 1}},
		{"The dog barks; the fox runs.", map[string]int{"the": 2, "dog": 1, "barks": 1, "fox": 1, "runs": 1}},
		{"it's a dog's life", map[string]int{"it's": 1, "a": 1, "dog's": 1, "life": 1}},
		{"'quoted' words''", map[string]int{"quoted": 1, "words": 1}},
		{"Ünïcode wörds, ÜNÏCODE Wörds!", map[string]int{"ünïcode": 2, "wörds": 2}},
		{"route 66, 66 times", map[string]int{"route": 1, "66": 2, "times": 1}},
		{"a-b c_d", map[string]int{"a": 1, "b": 1, "c": 1, "d": 1}},
	} {
		if got := Count(tc.line); !maps.Equal(got, tc.want) {
			t.Errorf("Count(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := ConfigFromEnv(env(map[string]string{"STORMDOCK_WORKER": "2", "STORMDOCK_WORKERS": "3",
		"STORMDOCK_JOB": "wc", "STORMDOCK_LINK": "dc-b", "STORMDOCK_OUTPUT": "http://router:8080/in"}))
	if err != nil || cfg.Worker != 2 || cfg.Workers != 3 || cfg.Job != "wc" || cfg.Link != "dc-b" || cfg.OutputURL != "http://router:8080/in" {
		t.Errorf("cfg = %+v, err %v", cfg, err)
	}
	cfg, err = ConfigFromEnv(env(map[string]string{"STORMDOCK_OUTPUT": "kafka://x"}))
	if err != nil || cfg.Worker != 0 || cfg.Workers != 1 || cfg.OutputURL != "" {
		t.Errorf("defaults: cfg = %+v, err %v", cfg, err)
	}
	for _, bad := range []map[string]string{
		{"STORMDOCK_WORKERS": "0"},
		{"STORMDOCK_WORKERS": "x"},
		{"STORMDOCK_WORKERS": "2", "STORMDOCK_WORKER": "2"},
		{"STORMDOCK_WORKER": "-1"},
	} {
		if _, err := ConfigFromEnv(env(bad)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func readRecords(t *testing.T, data []byte) []Record {
	t.Helper()
	var out []Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad record %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runUntil runs the worker until cond holds on its output file, then cancels it.
func runUntil(t *testing.T, cfg Config, cond func([]Record) bool) []Record {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	defer cancel()
	go func() { done <- Run(ctx, cfg) }()
	testenv.EventuallyWith(t, "the worker's output", 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(cfg.Output)
		return cond(readRecords(t, b)), "output so far:\n" + string(b)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	b, _ := os.ReadFile(cfg.Output)
	return readRecords(t, b)
}

func TestRunOverFixture(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	cfg := Config{Input: "testdata/input.txt", Output: out, Worker: 1, Workers: 3, Job: "wc", Link: "dc-a", Poll: 20 * time.Millisecond, Logger: quiet()}
	recs := runUntil(t, cfg, func(r []Record) bool { return len(r) >= 3 })
	want := []Record{
		{Offset: 1, Counts: map[string]int{"jumps": 1, "over": 1, "the": 1, "lazy": 1, "dog": 1}},
		{Offset: 4, Counts: map[string]int{"one": 1, "two": 1, "three": 1}},
		{Offset: 7, Counts: map[string]int{}},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i, r := range recs {
		if r.Offset != want[i].Offset || !maps.Equal(r.Counts, want[i].Counts) || r.Worker != 1 || r.Workers != 3 || r.Link != "dc-a" || r.Job != "wc" {
			t.Errorf("record %d = %+v, want offset %d counts %v", i, r, want[i].Offset, want[i].Counts)
		}
	}
	// Replaying the source (a restarted worker) yields the same records.
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	again := runUntil(t, cfg, func(r []Record) bool { return len(r) >= 3 })
	for i := range recs {
		if again[i].Offset != recs[i].Offset || !maps.Equal(again[i].Counts, recs[i].Counts) {
			t.Errorf("replay record %d = %+v, want %+v", i, again[i], recs[i])
		}
	}
}

// All workers together emit every line exactly once.
func TestWorkersCoverEveryLine(t *testing.T) {
	lines := strings.Count(string(mustRead(t, "testdata/input.txt")), "\n")
	seen := map[int64]int{}
	for w := 0; w < 4; w++ {
		var buf bytes.Buffer
		out := filepath.Join(t.TempDir(), "out.jsonl")
		cfg := Config{Input: "testdata/input.txt", Output: out, Worker: w, Workers: 4, Poll: 20 * time.Millisecond, Stdout: &buf, Logger: quiet()}
		want := (lines - w + 3) / 4
		for _, r := range runUntil(t, cfg, func(r []Record) bool { return len(r) >= want }) {
			seen[r.Offset]++
		}
	}
	for off := int64(0); off < int64(lines); off++ {
		if seen[off] != 1 {
			t.Errorf("offset %d emitted %d times", off, seen[off])
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Lines appended while the worker runs are processed: it is a streaming job. A line still being
// written (no newline yet) waits for its end.
func TestFollowsAppendedLines(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(in, []byte("a b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Input: in, Output: out, Worker: 0, Workers: 1, Poll: 20 * time.Millisecond, Logger: quiet()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	wait := func(n int) []Record {
		var recs []Record
		testenv.EventuallyWith(t, fmt.Sprintf("%d records", n), 5*time.Second, func() (bool, string) {
			recs = readRecords(t, mustReadOK(out))
			return len(recs) >= n, fmt.Sprintf("records %+v", recs)
		})
		return recs
	}
	wait(1)
	f, err := os.OpenFile(in, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("c c\nhalf a li"); err != nil {
		t.Fatal(err)
	}
	wait(2)
	// The worker reads on to the unfinished line before it flushes the second record, and
	// polls the file every 20ms after: over five polls, no record comes for that line.
	testenv.AssertUntil(t, "no record for the unfinished line", 5*cfg.Poll, func() (bool, string) {
		recs := readRecords(t, mustReadOK(out))
		return len(recs) == 2 && recs[1].Offset == 1 && recs[1].Counts["c"] == 2, fmt.Sprintf("records = %+v, want offset 1 {c:2} and nothing for the unfinished line", recs)
	})
	if _, err := f.WriteString("ne\n"); err != nil {
		t.Fatal(err)
	}
	recs := wait(3)
	if !maps.Equal(recs[2].Counts, map[string]int{"half": 1, "a": 1, "line": 1}) || recs[2].Offset != 2 {
		t.Errorf("record = %+v, want the completed line at offset 2", recs[2])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func mustReadOK(p string) []byte { b, _ := os.ReadFile(p); return b }

func TestRateCapsRecords(t *testing.T) {
	var buf bytes.Buffer
	out := filepath.Join(t.TempDir(), "out.jsonl")
	begin := time.Now()
	runUntil(t, Config{Input: "testdata/input.txt", Output: out, Worker: 0, Workers: 1, Rate: 20, Stdout: &buf, Logger: quiet()},
		func(r []Record) bool { return len(r) >= 10 })
	// 10 records at 20/s: the first at once, the tenth after 450ms.
	if took := time.Since(begin); took < 400*time.Millisecond {
		t.Errorf("10 records at 20/s took %s, want >= 450ms", took)
	}
}

func TestEmbeddedSampleToStdout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := &testenv.Buffer{}
	go func() { done <- Run(ctx, Config{Worker: 0, Workers: 1, Stdout: w, Logger: quiet()}) }()
	lines := strings.Count(string(Sample()), "\n")
	testenv.Eventually(t, "every line's record", 10*time.Second, func() bool { return strings.Count(w.String(), "\n") >= lines })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, []byte(w.String()))
	if len(recs) != lines || recs[0].Counts["storm"] != 1 {
		t.Errorf("%d records (want %d), first %+v", len(recs), lines, recs[0])
	}
}

// outputServer is an HTTP output for the tests: it keeps the records of each batch it takes,
// in order. decide, when set, runs first for each POST (numbered from 1; unlocked, so that it
// may wait) and says whether to take the batch or refuse it with a 503.
type outputServer struct {
	*httptest.Server
	mu    sync.Mutex
	got   []Record
	calls int
}

func newOutputServer(t *testing.T, decide func(call int, r *http.Request) bool) *outputServer {
	o := &outputServer{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		o.mu.Lock()
		o.calls++
		call := o.calls
		o.mu.Unlock()
		if decide != nil && !decide(call, r) {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		recs := readRecords(t, b)
		o.mu.Lock()
		o.got = append(o.got, recs...)
		o.mu.Unlock()
	}))
	t.Cleanup(o.Close)
	return o
}

// offsets is the offsets of the records taken so far, in order, and the POSTs received.
func (o *outputServer) offsets() ([]int64, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	offs := make([]int64, 0, len(o.got))
	for _, r := range o.got {
		offs = append(offs, r.Offset)
	}
	return offs, o.calls
}

// Records go to an HTTP endpoint as JSON-lines batches; a failed POST is retried, so nothing
// is lost.
func TestHTTPOutputRetries(t *testing.T) {
	srv := newOutputServer(t, func(call int, r *http.Request) bool {
		if ct := r.Header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Errorf("content type %q", ct)
		}
		return call > 1
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Input: "testdata/input.txt", OutputURL: srv.URL, Worker: 0, Workers: 2, Poll: 20 * time.Millisecond, Logger: quiet()})
	}()
	testenv.Eventually(t, "5 records posted", 10*time.Second, func() bool { offs, _ := srv.offsets(); return len(offs) >= 5 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if offs, calls := srv.offsets(); !slices.Equal(offs, []int64{0, 2, 4, 6, 8}) || calls < 2 {
		t.Errorf("offsets %v after %d calls, want [0 2 4 6 8] after a retry", offs, calls)
	}
}

// A batch in flight when the worker is stopped is answered, not abandoned: the server took
// it, and a drain that sent it again would deliver its records twice (CI saw [0 2 4 6 8 2 4 6
// 8] from TestHTTPOutputRetries when the stop came during a POST).
func TestHTTPOutputStopDuringPOST(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := newOutputServer(t, func(call int, r *http.Request) bool {
		if call != 2 { // the first is record 0 alone, the second the idle flush of 1 to 9
			return true
		}
		cancel()
		// A client that abandons the POST on the stop does so at once; the pause only
		// gives it the chance (a correct client waits it out and is answered).
		select {
		case <-r.Context().Done():
		case <-time.After(300 * time.Millisecond):
		}
		return true // taken, whether the client still waits or not
	})
	if err := Run(ctx, Config{Input: "testdata/input.txt", OutputURL: srv.URL, Worker: 0, Workers: 1, Poll: 20 * time.Millisecond, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	if offs, calls := srv.offsets(); !slices.Equal(offs, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Errorf("offsets %v over %d POSTs, want 0 to 9 once each", offs, calls)
	}
}

// A stop during the pause before a failed batch's retry is a stop like any other: the batch
// stays for the drain, which delivers it, and the worker exits cleanly.
func TestHTTPOutputStopDuringRetry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := newOutputServer(t, func(call int, r *http.Request) bool {
		if call == 1 { // record 0's batch: refused, and the worker stopped before the retry
			cancel()
			return false
		}
		return true
	})
	if err := Run(ctx, Config{Input: "testdata/input.txt", OutputURL: srv.URL, Worker: 0, Workers: 1, Poll: 20 * time.Millisecond, Logger: quiet()}); err != nil {
		t.Fatalf("Run: %v, want a clean stop", err)
	}
	if offs, calls := srv.offsets(); !slices.Equal(offs, []int64{0}) || calls != 2 {
		t.Errorf("offsets %v after %d calls, want [0] delivered by the drain", offs, calls)
	}
}

// The drain bounds a POST in flight at the stop too: a server that never answers holds the
// worker for the drain, not for the client's own 5 s timeout.
func TestHTTPOutputDrainBoundsPOST(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hung := make(chan struct{})
	defer close(hung) // before the server's Close, which waits for its handlers
	srv := newOutputServer(t, func(_ int, r *http.Request) bool {
		cancel()
		select {
		case <-r.Context().Done():
		case <-hung:
		}
		return false
	})
	err := Run(ctx, Config{Input: "testdata/input.txt", OutputURL: srv.URL, Worker: 0, Workers: 1, Poll: 20 * time.Millisecond, Drain: 100 * time.Millisecond, Logger: quiet()})
	// The drain's end cancels the request; the client's timeout would say so instead.
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("Run: %v, want the records not delivered, cut off by the drain", err)
	}
}

// The command drains on SIGTERM: records emitted before it are flushed, and it exits 0.
func TestSIGTERMDrains(t *testing.T) {
	if os.Getenv("WORDCOUNT_CHILD") == "1" {
		return
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.jsonl")
	var text strings.Builder
	for i := 0; i < 50; i++ {
		text.WriteString("tick tock\n")
	}
	if err := os.WriteFile(in, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildWorker$")
	cmd.Env = append(os.Environ(), "WORDCOUNT_CHILD=1", "WORDCOUNT_IN="+in, "WORDCOUNT_OUT="+out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Paced at 20/s (50 records take 2.5s), it is mid-stream when SIGTERM comes: after its
	// first records are out, which it flushes before each pause.
	var before int
	testenv.Eventually(t, "the first records written", 10*time.Second, func() bool {
		b, _ := os.ReadFile(out)
		before = bytes.Count(b, []byte("\n"))
		return before >= 3
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	if err != nil {
		t.Fatalf("worker exited with %v, want 0; stderr:\n%s", err, stderr.String())
	}
	recs := readRecords(t, mustRead(t, out))
	if len(recs) < before || len(recs) >= 50 {
		t.Fatalf("%d records flushed, want the %d written before SIGTERM or more, but not all 50 (paced)", len(recs), before)
	}
	for i, r := range recs {
		if r.Offset != int64(i) || r.Counts["tick"] != 1 {
			t.Fatalf("record %d = %+v", i, r)
		}
	}
	t.Logf("drained %d records on SIGTERM", len(recs))
}

// TestChildWorker is the worker process of TestSIGTERMDrains, run as the CLI runs it: its
// context is cancelled by SIGTERM.
func TestChildWorker(t *testing.T) {
	if os.Getenv("WORDCOUNT_CHILD") != "1" {
		t.Skip("child process of TestSIGTERMDrains")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := Run(ctx, Config{Input: os.Getenv("WORDCOUNT_IN"), Output: os.Getenv("WORDCOUNT_OUT"), Worker: 0, Workers: 1,
		Rate: 20, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
}
