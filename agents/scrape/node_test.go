package scrape

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
)

// hostile serves what a worker gone wrong (or ill-meaning) might.
func hostile(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func find(m api.NodeMetrics, job, series string) (api.SeriesSample, bool) {
	for _, j := range m.Jobs {
		if j.Job != job {
			continue
		}
		for _, s := range j.Series {
			if s.Name == series {
				return s, true
			}
		}
	}
	return api.SeriesSample{}, false
}

func jobOf(m api.NodeMetrics, job string) api.NodeJobMetrics {
	for _, j := range m.Jobs {
		if j.Job == job {
			return j
		}
	}
	return api.NodeJobMetrics{}
}

// TestRoundHostileWorkers: each kind of bad worker fails its own scrape, reported with the
// reason, within the timeout, and the other workers of its job are read all the same.
func TestRoundHostileWorkers(t *testing.T) {
	var processed atomic.Int64
	good := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE lines_processed_total counter\nlines_processed_total %d\n# TYPE input_backlog gauge\ninput_backlog 10\n", processed.Add(100))
	})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	bad := map[string]struct {
		url  string
		want string
	}{
		"slow": {hostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(200)
			fmt.Fprint(w, "input_backlog 1")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}), "within"},
		"huge": {hostile(t, func(w http.ResponseWriter, r *http.Request) {
			line := strings.Repeat("x", 1000) + " 1\n"
			for i := 0; i < 10000 && r.Context().Err() == nil; i++ {
				fmt.Fprint(w, line)
			}
		}), "too large|within"}, // over the limit, or, on a loaded machine, the time
		"garbage": {hostile(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<html>{{{\n") }), "not the Prometheus text format"},
		"status":  {hostile(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "nope\nreally", 500) }), "answered 500"},
		"redirect": {hostile(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		}), "redirects are not followed"},
	}
	// A port nothing listens on: a worker that serves no metrics, which is no failure.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	none := "http://" + ln.Addr().String() + "/metrics"
	ln.Close()

	n := NewNode("n1", Config{Timeout: time.Second, Limits: Limits{MaxBytes: 64 << 10}})
	defer n.Close()
	targets := []Target{
		{ID: "g0", Job: "wc", Tenant: "a", Worker: 0, URL: good, Measured: true, CPU: time.Second, Memory: 10 << 20},
		{ID: "g1", Job: "wc", Tenant: "a", Worker: 1, URL: none, Measured: true, CPU: 2 * time.Second, Memory: 30 << 20, Restarts: 2},
	}
	i := 2
	for name, b := range bad {
		targets = append(targets, Target{ID: name, Job: "bad-" + name, Tenant: "b", Worker: i, URL: b.url})
		i++
	}
	ctx := context.Background()
	start := time.Now()
	n.Round(ctx, targets, time.Second)
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("a round took %s: a hostile worker held it", d)
	}
	m, wire := n.Latest()
	if back, err := api.UnmarshalNodeMetrics(wire); err != nil || len(back.Jobs) != len(m.Jobs) {
		t.Fatalf("the node's answer does not decode: %v", err)
	}
	for name, b := range bad {
		j := jobOf(m, "bad-"+name)
		if j.Workers != 1 || j.Failed != 1 || !slices.ContainsFunc(strings.Split(b.want, "|"), func(w string) bool { return strings.Contains(j.Problem, w) }) {
			t.Errorf("%s worker: %+v, want failed with %q", name, j, b.want)
		}
		if len(j.Problem) > 300 || strings.ContainsAny(j.Problem, "\n\r") {
			t.Errorf("%s worker's problem is not one short line: %q", name, j.Problem)
		}
		if s, ok := find(m, "bad-"+name, api.SeriesWorkers); !ok || s.Sum != 1 {
			t.Errorf("%s worker: the agent's own series are missing: %+v", name, s)
		}
	}
	wc := jobOf(m, "wc")
	if wc.Workers != 2 || wc.Failed != 0 {
		t.Fatalf("job wc: %+v, want 2 workers and no failure (one serves nothing)", wc)
	}
	if s, _ := find(m, "wc", "input_backlog"); s.Sum != 10 || s.N != 1 {
		t.Errorf("input_backlog = %+v, want the one serving worker's 10", s)
	}
	if s, _ := find(m, "wc", api.SeriesMemory); s.Sum != 40<<20 || s.Min != 10<<20 || s.Max != 30<<20 || s.N != 2 {
		t.Errorf("memory = %+v", s)
	}
	if s, _ := find(m, "wc", api.SeriesRestarts); s.Total != 2 || s.N != 0 {
		t.Errorf("restarts = %+v: a first round has totals, no rates", s)
	}

	// The second round has rates: 100 lines between the rounds.
	time.Sleep(50 * time.Millisecond)
	targets[0].CPU += 500 * time.Millisecond
	n.Round(ctx, targets[:2], time.Second)
	m, _ = n.Latest()
	s, _ := find(m, "wc", "lines_processed_total")
	if !s.Counter || s.N != 1 || s.Sum <= 0 || s.Total != 200 {
		t.Errorf("lines_processed_total = %+v, want a rate and the total 200", s)
	}
	if c, _ := find(m, "wc", api.SeriesCPU); c.N != 2 || c.Max <= 0 || c.Min != 0 {
		t.Errorf("cpu = %+v, want rates of both workers, one busy", c)
	}
	if len(m.Jobs) != 1 {
		t.Errorf("workers gone from the targets are still reported: %d jobs", len(m.Jobs))
	}

	// A restart (a new instance) starts its counters afresh: no rate from the old one's.
	targets[0].Seq++
	n.Round(ctx, targets[:1], time.Second)
	m, _ = n.Latest()
	if s, _ := find(m, "wc", "lines_processed_total"); s.N != 0 {
		t.Errorf("a restarted worker's first round has a rate: %+v", s)
	}
	ws := n.Workers("wc")
	if len(ws) != 1 || ws[0].State != StateOK || len(ws[0].Series) == 0 {
		t.Errorf("worker detail: %+v", ws)
	}
}

// TestRoundJobSeriesCap: workers of one job serving different series each cannot make the
// job's answer grow past MaxJobSeries; the agent's own series are kept.
func TestRoundJobSeriesCap(t *testing.T) {
	var targets []Target
	for i := range 20 {
		url := hostile(t, func(w http.ResponseWriter, r *http.Request) {
			for k := range 10 {
				fmt.Fprintf(w, "s_%d_%d %d\n", i, k, k)
			}
		})
		targets = append(targets, Target{ID: fmt.Sprint(i), Job: "wc", Tenant: "a", Worker: i, URL: url})
	}
	n := NewNode("n1", Config{MaxJobSeries: 50})
	defer n.Close()
	n.Round(context.Background(), targets, time.Second)
	m, _ := n.Latest()
	j := jobOf(m, "wc")
	if len(j.Series) != 50 || !strings.Contains(j.Problem, "over the limit of 50") {
		t.Fatalf("%d series, problem %q", len(j.Series), j.Problem)
	}
	if _, ok := find(m, "wc", api.SeriesWorkers); !ok {
		t.Error("the cap dropped the agent's own series")
	}
}
