package multidc

import (
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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// embeddedStore returns a client of a fresh embedded store.
func embeddedStore(t testing.TB) (*coord.Server, coord.Store) {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := srv.Connect(coord.Options{SessionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// timedSink records when each batch reached the wrapped sink, and from which link.
type timedSink struct {
	Sink
	mu     sync.Mutex
	writes []sinkWrite
}

type sinkWrite struct {
	at          time.Time
	first, last int64
	link        string
}

func (s *timedSink) Write(ctx context.Context, recs []Record) error {
	if err := s.Sink.Write(ctx, recs); err != nil {
		return err
	}
	s.mu.Lock()
	s.writes = append(s.writes, sinkWrite{at: time.Now(), first: recs[0].Offset, last: recs[len(recs)-1].Offset, link: recs[0].Link})
	s.mu.Unlock()
	return nil
}

func (s *timedSink) LastOffset(ctx context.Context) (int64, error) {
	return s.Sink.(lastOffsetter).LastOffset(ctx)
}

// firstWriteAfter returns the first write at or after t not from link.
func (s *timedSink) firstWriteAfter(t time.Time, notLink string) (sinkWrite, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.writes {
		if !w.at.Before(t) && w.link != notLink {
			return w, true
		}
	}
	return sinkWrite{}, false
}

type testRouter struct {
	*Router
	sink   *timedSink
	path   string
	cancel context.CancelFunc
	done   chan error
}

// startRouter runs a router with a file sink in the test's temp dir on a loopback port.
func startRouter(t testing.TB, store coord.Store, links []string, mod func(*Config)) *testRouter {
	t.Helper()
	path := filepath.Join(testSinkBase(t), "sink.jsonl")
	fs, err := openTestFileSink(path, FsyncCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	ts := &timedSink{Sink: fs}
	cfg := Config{
		Job: "wordcount", Links: links, Store: store, Sink: ts, Listen: "127.0.0.1:0", TokenHash: testTokenHash,
		HeartbeatTimeout: 600 * time.Millisecond, Logger: testenv.Logger(t, slog.LevelWarn),
	}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.Sink != Sink(ts) {
		fs.Close()
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := &testRouter{Router: r, sink: ts, path: path, cancel: cancel, done: make(chan error, 1)}
	go func() { tr.done <- r.Run(ctx) }()
	t.Cleanup(func() { tr.stop(t) })
	return tr
}

func (tr *testRouter) stop(t testing.TB) {
	t.Helper()
	tr.cancel()
	select {
	case err := <-tr.done:
		if err != nil {
			t.Errorf("router Run: %v", err)
		}
		tr.done <- nil
	case <-time.After(10 * time.Second):
		t.Errorf("router did not stop")
	}
}

func waitReady(t testing.TB, url string) {
	t.Helper()
	testenv.Eventually(t, "router ready", 10*time.Second, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// testToken is the sender token of the tests' routers' job.
const testToken = "sdo_test-token"

var testTokenHash = api.HashToken(testToken)

// post sends body with the job's sender token.
func post(t testing.TB, url, body string) (int, string) {
	t.Helper()
	return postAs(t, url, body, testToken)
}

func postAs(t testing.TB, url, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAPIBadInput(t *testing.T) {
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.MaxBody = 64 << 10
		c.Limits = Limits{Window: 16}
	})
	u := tr.URL()
	waitReady(t, u)
	for _, l := range []string{"dc-a", "dc-b"} {
		if code, body := post(t, u+"/v1/heartbeat?link="+l+"&worker=0&workers=1", ""); code != 200 {
			t.Fatalf("heartbeat %s: %d %s", l, code, body)
		}
	}
	testenv.Eventually(t, "an active link", 5*time.Second, func() bool { st, _ := tr.Status(); return st.Active != "" })
	// Every bad batch starts with a good line at offset 0: if anything of a bad batch were
	// taken, offset 0 would reach the sink.
	good := `{"offset":0,"link":"dc-a","n":1}` + "\n"
	for _, c := range []struct {
		path, body, want string
	}{
		{"/v1/records", good + `{"offset":1,"link":"dc-x"}`, `line 2: unknown link "dc-x"`},
		{"/v1/records?link=dc-z", good, `unknown link "dc-z"`},
		{"/v1/records", good + `{"offset":1,"link":"dc-a"`, "line 2: malformed record"},
		{"/v1/records", good + `[1,2]`, "line 2: malformed record: want a JSON object"},
		{"/v1/records", good + `{"offset":1} trailing`, "line 2: malformed record"},
		{"/v1/records", good + `{"link":"dc-a","n":2}`, `line 2: missing "offset"`},
		{"/v1/records", good + `{"offset":null,"link":"dc-a"}`, `line 2: missing "offset"`},
		{"/v1/records", good + `{"offset":"1","link":"dc-a"}`, `"offset" is "1": want a non-negative integer`},
		{"/v1/records", good + `{"offset":1.5,"link":"dc-a"}`, `"offset" is 1.5`},
		{"/v1/records", good + `{"offset":-1,"link":"dc-a"}`, `"offset" is -1`},
		{"/v1/records", good + `{"offset":2}`, `line 2: missing "link"`},
		{"/v1/records?link=dc-b", good, `line 1: "link" "dc-a" but the request is for link "dc-b"`},
		{"/v1/records?worker=x", good, `worker="x"`},
		{"/", good + `{"offset":3,"link":"dc-y"}`, `unknown link "dc-y"`},
	} {
		code, body := post(t, u+c.path, c.body)
		var e api.ErrorBody
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusBadRequest || e.Code != "bad_input" || !strings.Contains(e.Error, c.want) {
			t.Errorf("POST %s %q: %d %s, want 400 bad_input with %q", c.path, c.body, code, strings.TrimSpace(body), c.want)
		}
	}
	code, body := post(t, u+"/v1/records", good+strings.Repeat(" ", 70<<10))
	if code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d %s", code, body)
	}
	for _, q := range []string{"", "link=dc-x&worker=0", "link=dc-a", "link=dc-a&worker=-1", "link=dc-a&worker=2&workers=2", "link=dc-a&worker=0&workers=0"} {
		if code, body := post(t, u+"/v1/heartbeat?"+q, ""); code != http.StatusBadRequest {
			t.Errorf("heartbeat ?%s: %d %s, want 400", q, code, body)
		}
	}
	// A batch is taken or refused whole before the router answers: a record taken from a bad
	// batch would show as received, buffered or delivered now.
	st, _ := tr.Status()
	if st.Delivered != -1 {
		t.Fatalf("a bad batch delivered offsets up to %d", st.Delivered)
	}
	for _, l := range st.Links {
		if l.Received != 0 || l.Buffered != 0 {
			t.Fatalf("link %s received %d, holds %d from bad batches", l.Link, l.Received, l.Buffered)
		}
	}

	// Backpressure: offsets past the window are refused with 429, the rest taken.
	var batch strings.Builder
	for off := 1; off <= 20; off++ {
		fmt.Fprintf(&batch, `{"offset":%d,"link":"dc-b"}`+"\n", off)
	}
	code, body = post(t, u+"/v1/records", batch.String())
	var res IngestResult
	_ = json.Unmarshal([]byte(body), &res)
	if code != http.StatusTooManyRequests || res.Accepted != 15 || res.Rejected != 5 || res.RetryAfterMs <= 0 {
		t.Fatalf("batch past the window: %d %s, want 429 with 15 accepted, 5 rejected", code, body)
	}
	// The good line alone is taken and delivered, from POST / as the example worker sends.
	if code, body := post(t, u+"/", good); code != 200 {
		t.Fatalf("good batch: %d %s", code, body)
	}
	testenv.Eventually(t, "offset 0 delivered", 5*time.Second, func() bool { st, _ := tr.Status(); return st.Delivered >= 0 })

	// Failover errors: their statuses, and the api error table's sentinels from their codes.
	cl, err := NewClient(u)
	if err != nil {
		t.Fatal(err)
	}
	cl.Token = testToken
	var ae *APIError
	if _, err := cl.Failover(context.Background(), "", "dc-q"); !errors.As(err, &ae) || ae.Code != 400 || !errors.Is(err, api.ErrBadInput) {
		t.Errorf("failover to an unknown link: %v", err)
	}
	if _, err := cl.Failover(context.Background(), "other-job", "dc-b"); !errors.As(err, &ae) || ae.Code != 404 || !errors.Is(err, api.ErrNotFound) {
		t.Errorf("failover of another job: %v", err)
	}
	testenv.EventuallyWith(t, "every link's heartbeats stale", 5*time.Second, func() (bool, string) {
		var err error
		st, err = tr.Status() // the active link as of when none is alive: it cannot change after
		if err != nil {
			return false, err.Error()
		}
		for _, l := range st.Links {
			if l.Alive {
				return false, "link " + l.Link + " alive"
			}
		}
		return true, ""
	})
	if _, err := cl.Failover(context.Background(), "wordcount", otherLink(st.Active)); !errors.As(err, &ae) || ae.Code != 409 || !errors.Is(err, api.ErrConflict) || api.ExitCode(err) != 2 {
		t.Errorf("failover to a dead link: %v", err)
	}
}

func otherLink(l string) string {
	if l == "dc-a" {
		return "dc-b"
	}
	return "dc-a"
}

func TestAPINotReady(t *testing.T) {
	_, store := embeddedStore(t)
	fs, err := openTestFileSink(filepath.Join(testSinkBase(t), "s"), FsyncNever)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	r, err := New(Config{Job: "wordcount", Links: []string{"dc-a", "dc-b"}, Store: store, Sink: fs, TokenHash: testTokenHash})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	for _, p := range []string{"/v1/records", "/v1/heartbeat?link=dc-a&worker=0", "/v1/failover?to=dc-a"} {
		code, body := post(t, srv.URL+p, `{"offset":0,"link":"dc-a"}`)
		var e api.ErrorBody
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusServiceUnavailable || e.Code != "not_ready" {
			t.Errorf("POST %s before Run: %d %s, want 503 not_ready", p, code, body)
		}
	}
	for _, bad := range []Config{
		{Job: "Bad_Job", Links: []string{"dc-a"}, Store: store, Sink: fs},
		{Job: "j", Links: []string{"dc-a", "dc-a"}, Store: store, Sink: fs},
		{Job: "j", Store: store, Sink: fs},
		{Job: "j", Links: []string{"dc-a"}, Sink: fs},
		{Job: "j", Links: []string{"dc-a"}, Store: store, Sink: fs}, // no token hash
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) succeeded", bad)
		}
	}
}

// startSenders runs a goroutine link worker per (link, worker) until the returned stop
// functions are called (one per link).
func startSenders(t testing.TB, url string, links []string, workers int, lines []string, rate float64, epoch time.Time) map[string]func() {
	stops := map[string]func(){}
	for _, l := range links {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range workers {
			w := &linkWorker{router: url, link: l, worker: i, workers: workers, lines: lines, rate: rate, epoch: epoch,
				heartbeat: 100 * time.Millisecond, batch: 32}
			wg.Go(func() {
				if err := w.run(ctx); err != nil {
					t.Errorf("link %s worker %d: %v", l, i, err)
				}
			})
		}
		stops[l] = func() { cancel(); wg.Wait() }
		t.Cleanup(stops[l])
	}
	return stops
}

// checkSinkFile checks that the file holds offsets 0..n-1, each once, in order, each with
// the fixture's line and tagged with the link that sent the record.
func checkSinkFile(t testing.TB, path string, lines []string) (perLink map[string]int) {
	t.Helper()
	got := readSinkFile(t, path)
	perLink = map[string]int{}
	seen := make([]int, len(lines))
	for i, l := range got {
		if l.Offset < 0 || l.Offset >= int64(len(lines)) {
			t.Fatalf("sink line %d: offset %d out of range", i, l.Offset)
		}
		seen[l.Offset]++
		var r struct {
			Offset int64  `json:"offset"`
			Link   string `json:"link"`
			Line   string `json:"line"`
		}
		if err := json.Unmarshal(l.Record, &r); err != nil || r.Offset != l.Offset || r.Link != l.Link || r.Line != lines[l.Offset] {
			t.Fatalf("sink line %d: %s: record does not match offset %d of link %s (%v)", i, l.Record, l.Offset, l.Link, err)
		}
		perLink[l.Link]++
	}
	var missing, dup []int
	for off, n := range seen {
		switch {
		case n == 0:
			missing = append(missing, off)
		case n > 1:
			dup = append(dup, off)
		}
	}
	if len(missing) > 0 || len(dup) > 0 {
		t.Fatalf("sink: %d offsets missing (first %v), %d delivered more than once (first %v)", len(missing), head(missing), len(dup), head(dup))
	}
	for i, l := range got {
		if l.Offset != int64(i) {
			t.Fatalf("sink line %d has offset %d: out of order", i, l.Offset)
		}
	}
	return perLink
}

func head(s []int) []int { return s[:min(len(s), 5)] }

func TestManualFailoverAndStatusInStore(t *testing.T) {
	_, store := embeddedStore(t)
	reg := prometheus.NewRegistry()
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.Registerer = reg
		c.StatusInterval = 50 * time.Millisecond
		// Only manual failovers here: a heartbeat one is another test's, and CI under load
		// saw senders late by 636ms fail a link over (spurious, and counted as such) before
		// the store's status was read, which then rightly had a fourth failover.
		c.HeartbeatTimeout = 10 * time.Second
	})
	waitReady(t, tr.URL())
	_, lines := writeFixture(t, 3000)
	epoch := time.Now()
	startSenders(t, tr.URL(), []string{"dc-a", "dc-b"}, 2, lines, 2000, epoch)
	cl, _ := NewClient(tr.URL())
	cl.Token = testToken
	ctx := context.Background()
	var first string
	testenv.Eventually(t, "a link active and delivering", 10*time.Second, func() bool {
		st, err := cl.Status(ctx)
		first = st.Active
		return err == nil && st.Active != "" && st.Delivered > 200
	})
	second := otherLink(first)
	st, err := cl.Failover(ctx, "wordcount", second)
	if err != nil {
		t.Fatal(err)
	}
	if st.Active != second || st.Failovers != 1 || st.LastFailover == nil || st.LastFailover.Reason != ReasonManual {
		t.Fatalf("after failover: %+v", st)
	}
	deliveredFrom := func(link string) int64 {
		st, _ := cl.Status(ctx)
		for _, l := range st.Links {
			if l.Link == link {
				return l.LastDelivered
			}
		}
		return -1
	}
	testenv.Eventually(t, "records from "+second, 10*time.Second, func() bool { return deliveredFrom(second) >= 0 })
	st, err = cl.Failover(ctx, "", "") // the most advanced live standby: the first one
	if err != nil || st.Active != first {
		t.Fatalf("failover without a target: %v %+v", err, st)
	}
	if _, err := cl.Failover(ctx, "", second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "everything delivered", 10*time.Second, func() bool { st, _ := cl.Status(ctx); return st.Delivered == 2999 })
	perLink := checkSinkFile(t, tr.path, lines)
	if perLink["dc-a"] == 0 || perLink["dc-b"] == 0 {
		t.Fatalf("records per link %v: both links should have delivered", perLink)
	}
	testenv.Eventually(t, "status in the store", 5*time.Second, func() bool {
		rec, ok, err := ReadRecord(ctx, store, "wordcount")
		if err != nil || !ok || rec.Checkpoint != 2999 || rec.Active != second || rec.Failovers != 3 || rec.Router != tr.URL() {
			return false
		}
		for _, l := range rec.Links {
			if l.LastProduced != 2999 || l.Lag != 0 || l.HeartbeatAgeMs < 0 || l.Workers != 2 || l.WorkersAlive != 2 {
				return false
			}
		}
		return true
	})
	if u, err := RouterURL(ctx, store, "wordcount"); err != nil || u != tr.URL() {
		t.Errorf("RouterURL = %q, %v", u, err)
	}
	// Metrics.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() {
				key += "," + lp.GetName() + "=" + lp.GetValue()
			}
			switch {
			case m.Counter != nil:
				got[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				got[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	delivered := got["stormdock_router_records_delivered_total,job=wordcount,link=dc-a"] + got["stormdock_router_records_delivered_total,job=wordcount,link=dc-b"]
	if got["stormdock_router_failovers_total,job=wordcount,reason=manual"] != 3 || delivered != 3000 ||
		got["stormdock_router_delivery_latency_seconds,job=wordcount"] != 3000 ||
		got["stormdock_router_delivered_offset,job=wordcount"] != 2999 ||
		got["stormdock_router_duplicates_dropped_total,job=wordcount,link=dc-a"] == 0 {
		t.Errorf("metrics: %v", got)
	}
}

func TestOneRouterPerJob(t *testing.T) {
	_, store := embeddedStore(t)
	first := startRouter(t, store, []string{"dc-a", "dc-b"}, nil)
	waitReady(t, first.URL())
	_, lines := writeFixture(t, 500)
	stops := startSenders(t, first.URL(), []string{"dc-a", "dc-b"}, 1, lines, 1e6, time.Now())
	testenv.Eventually(t, "delivered", 10*time.Second, func() bool { st, _ := first.Status(); return st.Delivered == 499 })
	second := startRouter(t, store, []string{"dc-a", "dc-b"}, nil)
	// The second router stands in the job's router election, behind the first.
	testenv.Eventually(t, "the second router standing", 10*time.Second, func() bool {
		names, err := store.Children(context.Background(), cluster.RoutersKey+"/wordcount"+"/election")
		return err == nil && len(names) == 2
	})
	if _, err := second.Status(); err == nil {
		t.Fatal("a second router of the job recovered while the first runs")
	}
	resp, err := http.Get(second.URL() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second router readyz: %d", resp.StatusCode)
	}
	for _, stop := range stops {
		stop()
	}
	first.stop(t)
	waitReady(t, second.URL())
	st, _ := second.Status()
	// Its own (empty) file is behind the checkpoint: it continues after the checkpoint.
	if st.NextOffset != 500 || st.Checkpoint != 499 {
		t.Fatalf("second router starts at %d (checkpoint %d), want 500", st.NextOffset, st.Checkpoint)
	}
}

func TestMain_fixtureRoundTrip(t *testing.T) {
	path, lines := writeFixture(t, 10)
	got, err := readFixture(path)
	if err != nil || len(got) != 10 || got[9] != lines[9] {
		t.Fatalf("fixture: %v %v", got, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

// TestSenderRewindsOnRouterRestart: records a router accepted but did not deliver die with
// it; the sender notices the new instance and tells the worker where to rewind.
func TestSenderRewindsOnRouterRestart(t *testing.T) {
	srv, store := embeddedStore(t)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r1 := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) { c.Listen = listen })
	waitReady(t, r1.URL())
	s := NewSender(r1.URL(), "dc-a", 0, 1)
	s.Token = testToken
	ctx := context.Background()
	var batch strings.Builder
	for off := range 10 {
		fmt.Fprintf(&batch, `{"offset":%d,"link":"dc-a"}`+"\n", off)
	}
	// Only dc-a beats, and only once: no link is chosen within the first timeout, so the
	// records are held, not delivered.
	if _, err := s.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ctx, []byte(batch.String())); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Rewind(); ok {
		t.Fatal("rewind without a restart")
	}
	r1.stop(t)
	store2, err := srv.Connect(coord.Options{SessionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store2.Close() }) // after r2 stops: cleanups run last-in first-out
	r2 := startRouter(t, store2, []string{"dc-a", "dc-b"}, func(c *Config) { c.Listen = listen })
	waitReady(t, r2.URL())
	err = s.Send(ctx, []byte(`{"offset":10,"link":"dc-a"}`))
	var re *RestartError
	if !errors.As(err, &re) || re.NextOffset != 0 {
		t.Fatalf("send to the restarted router: %v, want a RestartError to offset 0", err)
	}
	if _, ok := s.Rewind(); ok {
		t.Fatal("the restart was reported twice")
	}
}

// TestRouterHTTPSink runs the router with the HTTP sink in front of a flaky receiver that
// de-duplicates by offset.
func TestRouterHTTPSink(t *testing.T) {
	recv := &dedupReceiver{last: -1, fail: func(n int) int {
		if n%4 == 2 {
			return -1 // taken, then answered 502: the router must send it again
		}
		return 0
	}}
	hs := httptest.NewServer(recv)
	defer hs.Close()
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.Sink = NewHTTPSink(hs.URL, HTTPSinkOptions{Job: "job1", MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
			Logger: slog.New(slog.DiscardHandler)})
	})
	waitReady(t, tr.URL())
	_, lines := writeFixture(t, 2000)
	startSenders(t, tr.URL(), []string{"dc-a", "dc-b"}, 2, lines, 1e5, time.Now())
	testenv.Eventually(t, "everything delivered", 20*time.Second, func() bool { st, _ := tr.Status(); return st.Delivered == 1999 })
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.got) != 2000 || recv.repeats == 0 {
		t.Fatalf("receiver kept %d offsets, dropped %d repeats", len(recv.got), recv.repeats)
	}
	for i, off := range recv.got {
		if off != int64(i) {
			t.Fatalf("receiver offset %d at %d", off, i)
		}
	}
}
