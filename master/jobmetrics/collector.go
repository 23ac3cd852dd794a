package jobmetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// Every master pulls every node each interval (the leader to act on it, a standby so that
// it leads with an hour of history, and each to answer its API): one GET /v1/metrics per
// node, signed, read within a timeout and a size bound, Parallel at once. A node that does
// not answer is left out of that round (its jobs' points are the other nodes' sums), and
// said so in the jobs' problems.

// Defaults of Config.
const (
	DefaultInterval     = 10 * time.Second
	DefaultWindow       = time.Hour
	DefaultParallel     = 64
	DefaultMaxJobSeries = 500
)

// Config shapes a master's collection and history.
type Config struct {
	// Interval is how often every node is pulled, and the history's resolution. Default
	// DefaultInterval; negative turns job metrics off.
	Interval time.Duration
	// Window is how far back the history reaches. Default DefaultWindow.
	Window time.Duration
	// Timeout bounds one node's answer. Default min(5s, Interval/2).
	Timeout time.Duration
	// Parallel is how many nodes are pulled at once. Default DefaultParallel.
	Parallel int
	// MaxJobSeries bounds one job's series, all its nodes' together (the stormdock series
	// always kept). Default DefaultMaxJobSeries.
	MaxJobSeries int
	Logger       *slog.Logger
	Registerer   prometheus.Registerer
}

func (c *Config) defaults() {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Timeout <= 0 {
		c.Timeout = min(5*time.Second, max(c.Interval/2, 100*time.Millisecond))
	}
	if c.Parallel <= 0 {
		c.Parallel = DefaultParallel
	}
	if c.MaxJobSeries <= 0 {
		c.MaxJobSeries = DefaultMaxJobSeries
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Job is what the masters know of a job: who owns it and how many workers it wants.
type Job struct {
	Tenant    string
	Submitted time.Time
	Workers   int
}

// Source says which nodes to pull and which jobs exist (the master's view).
type Source interface {
	Nodes() []cluster.NodeRecord
	Jobs() map[string]Job
}

// Fetcher makes a signed GET of uri on a node's agent.
type Fetcher interface {
	Get(ctx context.Context, rec cluster.NodeRecord, uri string) (*http.Response, error)
}

// Collector pulls the nodes round after round into a History.
type Collector struct {
	cfg     Config
	src     Source
	fetch   Fetcher
	hist    *History
	metrics *collectorMetrics

	mu     sync.Mutex
	rounds []chan struct{} // closed after the next commit (WaitRound)
}

type collectorMetrics struct {
	rounds   prometheus.Counter
	duration prometheus.Histogram
	failures *prometheus.CounterVec
	series   prometheus.Gauge
	bytes    prometheus.Gauge
}

// NewCollector returns a collector of the nodes src names, through fetch.
func NewCollector(cfg Config, src Source, fetch Fetcher) (*Collector, error) {
	cfg.defaults()
	c := &Collector{cfg: cfg, src: src, fetch: fetch, hist: NewHistory(max(cfg.Interval, time.Millisecond), cfg.Window)}
	const ns, sub = "stormdock", "master"
	c.metrics = &collectorMetrics{
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "job_metrics_rounds_total",
			Help: "Rounds of pulling every node's job metrics."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "job_metrics_round_seconds",
			Help: "Time to pull and merge every node's job metrics.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "job_metrics_node_failures_total",
			Help: "Nodes whose job metrics could not be read in a round, by reason."}, []string{"reason"}),
		series: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "job_metrics_series",
			Help: "Series of job metrics this master keeps history of (jobs', tenants' and the cluster's)."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "job_metrics_history_bytes",
			Help: "Memory the job metrics' history holds."}),
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.metrics.rounds, c.metrics.duration, c.metrics.failures, c.metrics.series, c.metrics.bytes} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("job metrics: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// History is where the rounds go.
func (c *Collector) History() *History { return c.hist }

// Interval is the collection interval.
func (c *Collector) Interval() time.Duration { return c.cfg.Interval }

// Run pulls every interval until ctx is done.
func (c *Collector) Run(ctx context.Context) {
	if c.cfg.Interval < 0 {
		return
	}
	// Rounds fall on multiples of the interval, so that every master's points share
	// their times and a new leader's history lines up with the last one's.
	for {
		now := time.Now()
		next := now.Truncate(c.cfg.Interval).Add(c.cfg.Interval)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c.Round(ctx, next)
	}
}

// WaitRound returns a channel closed after the next round is committed.
func (c *Collector) WaitRound() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	c.rounds = append(c.rounds, ch)
	return ch
}

// nodeResult is one node's answer in a round.
type nodeResult struct {
	node string
	m    api.NodeMetrics
	err  error
}

// Round pulls every node once and commits the merge as the point of time at.
func (c *Collector) Round(ctx context.Context, at time.Time) {
	start := time.Now()
	nodes := c.src.Nodes()
	results := make([]nodeResult, len(nodes))
	var wg sync.WaitGroup
	sem := make(chan struct{}, c.cfg.Parallel)
	for i, rec := range nodes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m, err := c.pull(ctx, rec)
			results[i] = nodeResult{node: rec.Node.ID, m: m, err: err}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	jobs := c.src.Jobs()
	c.hist.Commit(at, c.merge(jobs, results, at))
	c.metrics.rounds.Inc()
	c.metrics.duration.Observe(time.Since(start).Seconds())
	st := c.hist.Stats()
	c.metrics.series.Set(float64(st.Series))
	c.metrics.bytes.Set(float64(st.Bytes))
	c.mu.Lock()
	for _, ch := range c.rounds {
		close(ch)
	}
	c.rounds = nil
	c.mu.Unlock()
}

// pull reads one node's answer.
func (c *Collector) pull(ctx context.Context, rec cluster.NodeRecord) (api.NodeMetrics, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := c.fetch.Get(ctx, rec, "/v1/metrics?node="+url.QueryEscape(rec.Node.ID))
	if err != nil {
		c.metrics.failures.WithLabelValues("unreachable").Inc()
		return api.NodeMetrics{}, fmt.Errorf("node %s: %w", rec.Node.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.metrics.failures.WithLabelValues("refused").Inc()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return api.NodeMetrics{}, fmt.Errorf("node %s answered %s: %s", rec.Node.ID, resp.Status, strings.TrimSpace(string(body)))
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, api.MaxNodeMetricsBytes+1))
	if err != nil {
		c.metrics.failures.WithLabelValues("unreachable").Inc()
		return api.NodeMetrics{}, fmt.Errorf("node %s: %w", rec.Node.ID, err)
	}
	m, err := api.UnmarshalNodeMetrics(b)
	if err == nil && m.Node != rec.Node.ID {
		err = fmt.Errorf("answered for node %q", m.Node)
	}
	if err != nil {
		c.metrics.failures.WithLabelValues("malformed").Inc()
		return api.NodeMetrics{}, fmt.Errorf("node %s: %w", rec.Node.ID, err)
	}
	return m, nil
}

// stale is how old a node's answer may be: an agent whose scrapes stopped (stuck on its
// workers) is no longer counted as if its figures were today's.
func (c *Collector) stale(m api.NodeMetrics, at time.Time) bool {
	iv := max(m.Interval, c.cfg.Interval)
	return !m.At.IsZero() && at.Sub(m.At) > 3*iv
}

type jobAcc struct {
	series   map[seriesKey]*api.SeriesSample
	problems []string
	dropped  int
}

// merge adds the nodes' answers up per job: only jobs the masters know, and only from
// answers that give the job's own tenant (a node still running a killed job's worker of
// another tenant under a reused name is not counted in the new job).
func (c *Collector) merge(jobs map[string]Job, results []nodeResult, at time.Time) map[string]JobRound {
	accs := map[string]*jobAcc{}
	acc := func(name string) *jobAcc {
		a := accs[name]
		if a == nil {
			a = &jobAcc{series: map[seriesKey]*api.SeriesSample{}}
			accs[name] = a
		}
		return a
	}
	var unread []string
	for _, res := range results {
		if res.err != nil {
			if !errors.Is(res.err, context.Canceled) {
				unread = append(unread, res.err.Error())
			}
			continue
		}
		if c.stale(res.m, at) {
			unread = append(unread, fmt.Sprintf("node %s: its agent's last scrape was %s ago", res.node, at.Sub(res.m.At).Round(time.Second)))
			continue
		}
		for _, nj := range res.m.Jobs {
			j, ok := jobs[nj.Job]
			if !ok || j.Tenant != nj.Tenant {
				continue
			}
			a := acc(nj.Job)
			if nj.Problem != "" && len(a.problems) < 10 {
				a.problems = append(a.problems, fmt.Sprintf("node %s: %s", res.node, nj.Problem))
			}
			for _, s := range nj.Series {
				k := seriesKey{s.Name, s.Labels}
				cur := a.series[k]
				if cur == nil {
					if len(a.series) >= c.cfg.MaxJobSeries && !(s.Labels == "" && builtin(s.Name)) {
						a.dropped++
						continue
					}
					cp := s
					a.series[k] = &cp
					continue
				}
				if cur.Counter != s.Counter {
					continue
				}
				cur.Add(s)
			}
		}
	}
	out := make(map[string]JobRound, len(jobs))
	for name, j := range jobs {
		jr := JobRound{Tenant: j.Tenant, Submitted: j.Submitted, Workers: j.Workers}
		a := accs[name]
		if a != nil {
			jr.Problems = a.problems
			if a.dropped > 0 {
				jr.Problems = append(jr.Problems, fmt.Sprintf("%d series over the limit of %d for a job were dropped", a.dropped, c.cfg.MaxJobSeries))
			}
			var tp *api.SeriesSample
			jr.Series = make([]api.SeriesSample, 0, len(a.series)+1)
			for _, s := range a.series {
				jr.Series = append(jr.Series, *s)
				if s.Counter && strings.HasSuffix(s.Name, api.ThroughputSuffix) {
					if tp == nil {
						tp = &api.SeriesSample{Name: api.SeriesThroughput, Counter: true}
					}
					tp.Sum += s.Sum
					tp.Total += s.Total
					tp.N = max(tp.N, s.N)
					tp.Min, tp.Max = tp.Sum, tp.Sum
				}
			}
			if tp != nil {
				jr.Series = append(jr.Series, *tp)
			}
		}
		if len(unread) > 0 {
			// Which of the unread nodes ran the job is not known: every job says how many.
			jr.Problems = append(jr.Problems, fmt.Sprintf("%d nodes not read this round (%s)", len(unread), unread[0]))
		}
		slices.SortFunc(jr.Series, func(a, b api.SeriesSample) int {
			if c := strings.Compare(a.Name, b.Name); c != 0 {
				return c
			}
			return strings.Compare(a.Labels, b.Labels)
		})
		out[name] = jr
	}
	return out
}
