package jobmetrics

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// TestHistoryRing: rounds written in any order, with gaps, read back as a plain model of
// (round -> point) says: the last size rounds before the newest, nothing older, NaN where
// a round was skipped (property, over random sequences).
func TestHistoryRing(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for c := 0; c < 300; c++ {
		size := 2 + r.IntN(20)
		g := newRing("s", "", false, size, 0)
		model := map[int64]float64{}
		var last int64 = -1
		round := int64(0)
		for range 100 {
			switch r.IntN(4) {
			case 0:
				round += int64(1 + r.IntN(size*2)) // a gap, perhaps longer than the ring
			case 1:
				round = max(round-int64(r.IntN(size+2)), 0) // a late round
			default:
				round++
			}
			v := float64(r.IntN(1000))
			g.put(round, api.SeriesSample{Sum: v, Min: v, Max: v, N: 1})
			if round > last-int64(size) {
				model[round] = v
			}
			last = max(last, round)
		}
		for k := last - int64(size) - 3; k <= last+2; k++ {
			got, _, _, _, ok := g.at(k)
			want, has := model[k]
			inWindow := k > last-int64(size) && k <= last
			if ok != (has && inWindow) || ok && got != want {
				t.Fatalf("case %d (size %d, newest %d): round %d = %v,%v; model %v,%v (in window %v)", c, size, last, k, got, ok, want, has, inWindow)
			}
		}
	}
}

// fakeAgents answers the collector for nodes, as agents would (encoded answers), or fails.
type fakeAgents struct {
	mu      sync.Mutex
	answers map[string]func() (int, []byte)
}

func (f *fakeAgents) Get(ctx context.Context, rec cluster.NodeRecord, uri string) (*http.Response, error) {
	f.mu.Lock()
	a := f.answers[rec.Node.ID]
	f.mu.Unlock()
	if a == nil {
		return nil, errors.New("connection refused")
	}
	if want := "/v1/metrics?node=" + rec.Node.ID; uri != want {
		return nil, errors.New("asked " + uri)
	}
	status, body := a()
	return &http.Response{StatusCode: status, Status: http.StatusText(status), Body: io.NopCloser(bytes.NewReader(body))}, nil
}

type fakeSource struct {
	nodes []string
	jobs  map[string]Job
}

func (s fakeSource) Nodes() []cluster.NodeRecord {
	var out []cluster.NodeRecord
	for _, n := range s.nodes {
		out = append(out, cluster.NodeRecord{Node: cluster.Node{ID: n}})
	}
	return out
}

func (s fakeSource) Jobs() map[string]Job { return s.jobs }

func answer(node string, at time.Time, jobs ...api.NodeJobMetrics) func() (int, []byte) {
	return func() (int, []byte) {
		return http.StatusOK, api.MarshalNodeMetrics(api.NodeMetrics{Node: node, At: at, Interval: time.Second, Jobs: jobs})
	}
}

func gauge(name string, vals ...float64) api.SeriesSample {
	s := api.SeriesSample{Name: name, Min: math.Inf(1), Max: math.Inf(-1)}
	for _, v := range vals {
		s.Sum += v
		s.Min, s.Max = min(s.Min, v), max(s.Max, v)
		s.N++
	}
	return s
}

// TestCollectorMerge: the nodes' answers are added up per job; an answer for a job under
// another tenant (a killed job's worker of another tenant, the name reused) and for jobs
// the masters do not know count nowhere; a node that answers garbage, a stale answer or an
// unreachable node is left out and said so; throughput comes from *_processed_total.
func TestCollectorMerge(t *testing.T) {
	now := time.Now()
	src := fakeSource{nodes: []string{"n1", "n2", "n3", "n4", "n5", "n6"}, jobs: map[string]Job{
		"wc": {Tenant: "a", Workers: 3}, "other": {Tenant: "b", Workers: 1}}}
	lines := api.SeriesSample{Name: "lines_processed_total", Counter: true, Sum: 10, Min: 10, Max: 10, N: 1, Total: 100}
	f := &fakeAgents{answers: map[string]func() (int, []byte){
		"n1": answer("n1", now, api.NodeJobMetrics{Job: "wc", Tenant: "a", Workers: 2, Series: []api.SeriesSample{gauge("input_backlog", 5, 7), lines}}),
		"n2": answer("n2", now, api.NodeJobMetrics{Job: "wc", Tenant: "a", Workers: 1, Failed: 1, Problem: "worker 2: no answer within 2s",
			Series: []api.SeriesSample{gauge("input_backlog", 30), lines}}),
		// Another tenant's worker under the same name, and a job no master knows.
		"n3": answer("n3", now, api.NodeJobMetrics{Job: "wc", Tenant: "b", Workers: 1, Series: []api.SeriesSample{gauge("input_backlog", 1e6)}},
			api.NodeJobMetrics{Job: "ghost", Tenant: "a", Series: []api.SeriesSample{gauge("x", 1)}}),
		"n4": func() (int, []byte) { return http.StatusOK, []byte("<html>") },
		"n5": answer("n5", now.Add(-time.Hour), api.NodeJobMetrics{Job: "wc", Tenant: "a", Series: []api.SeriesSample{gauge("input_backlog", 1e6)}}),
		// n6 is unreachable.
	}}
	reg := prometheus.NewRegistry()
	c, err := NewCollector(Config{Interval: time.Second, Registerer: reg}, src, f)
	if err != nil {
		t.Fatal(err)
	}
	c.Round(context.Background(), now)
	m, ok := c.History().Job("wc", Query{Detail: true})
	if !ok {
		t.Fatal("no history of wc")
	}
	last := func(name string) (float64, int) {
		for _, s := range m.Series {
			if s.Name == name {
				v, i, _ := s.Last()
				return v, s.N[i]
			}
		}
		t.Fatalf("no series %s in %+v", name, m.Series)
		return 0, 0
	}
	if v, n := last("input_backlog"); v != 42 || n != 3 {
		t.Errorf("input_backlog = %v from %d workers, want 42 from 3 (not the other tenant's, not the stale node's)", v, n)
	}
	if v, _ := last(api.SeriesThroughput); v != 20 {
		t.Errorf("throughput = %v, want 20", v)
	}
	problems := strings.Join(m.Problems, "\n")
	for _, want := range []string{"node n2: worker 2: no answer within 2s", "3 nodes not read this round"} {
		if !strings.Contains(problems, want) {
			t.Errorf("problems %q: want %q", problems, want)
		}
	}
	if _, ok := c.History().Job("ghost", Query{}); ok {
		t.Error("a job no master knows has a history")
	}
	if o, _ := c.History().Job("other", Query{}); len(o.Series) != 0 {
		t.Errorf("tenant b's job has series it never served: %+v", o.Series)
	}
	if n := testutil.ToFloat64(c.metrics.failures.WithLabelValues("malformed")); n != 1 {
		t.Errorf("malformed answers counted %v, want 1", n)
	}

	// The name is reused by another tenant: its history starts afresh, none of a's points.
	src.jobs["wc"] = Job{Tenant: "b", Workers: 1, Submitted: now}
	c.Round(context.Background(), now.Add(time.Second))
	m, _ = c.History().Job("wc", Query{})
	if m.Tenant != "b" {
		t.Fatalf("tenant %q", m.Tenant)
	}
	for _, s := range m.Series {
		for i, v := range s.Values {
			if v != nil && *v != 1e6 {
				t.Errorf("tenant b's wc shows %s = %v at %d: tenant a's", s.Name, *v, i)
			}
		}
	}
}

// TestCollectorJobSeriesCap: however many series the nodes give for one job, the master
// keeps MaxJobSeries (stormdock's own always) and says so.
func TestCollectorJobSeriesCap(t *testing.T) {
	now := time.Now()
	var series []api.SeriesSample
	for i := range 300 {
		series = append(series, gauge("s"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), 1))
	}
	series = append(series, gauge(api.SeriesWorkers, 1))
	f := &fakeAgents{answers: map[string]func() (int, []byte){
		"n1": answer("n1", now, api.NodeJobMetrics{Job: "wc", Tenant: "a", Series: series}),
	}}
	c, err := NewCollector(Config{Interval: time.Second, MaxJobSeries: 50}, fakeSource{nodes: []string{"n1"}, jobs: map[string]Job{"wc": {Tenant: "a"}}}, f)
	if err != nil {
		t.Fatal(err)
	}
	c.Round(context.Background(), now)
	m, _ := c.History().Job("wc", Query{})
	if len(m.Series) > 51 || !strings.Contains(strings.Join(m.Problems, " "), "over the limit of 50") {
		t.Fatalf("%d series kept, problems %q", len(m.Series), m.Problems)
	}
	if m.Series[0].Name != api.SeriesWorkers {
		t.Errorf("first series %s, want workers (kept whatever the cap)", m.Series[0].Name)
	}
}
