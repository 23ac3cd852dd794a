package scrape

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/api"
)

// Defaults of Config.
const (
	DefaultInterval     = 10 * time.Second
	DefaultTimeout      = 2 * time.Second
	DefaultParallel     = 8
	DefaultMaxJobSeries = 500
)

// Worker scrape states besides an error's text.
const (
	StateOK   = "ok"
	StateNone = "none" // the worker serves no metrics (no listener on its port)
)

// Config shapes a node's scrapes.
type Config struct {
	Limits
	// Timeout bounds one worker's scrape, from the dial to the body's last byte. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Parallel is how many workers are scraped at once. Default DefaultParallel.
	Parallel int
	// MaxJobSeries bounds the series of one job on the node, its workers' together (the
	// stormdock series always kept). Default DefaultMaxJobSeries.
	MaxJobSeries int
	// Scraped, when set, hears every worker's scrape outcome: StateOK, StateNone or
	// "failed" (for the agent's own metrics).
	Scraped func(result string)
}

func (c *Config) defaults() {
	c.Limits.defaults()
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Parallel <= 0 {
		c.Parallel = DefaultParallel
	}
	if c.MaxJobSeries <= 0 {
		c.MaxJobSeries = DefaultMaxJobSeries
	}
}

// Target is one worker to read in a round, with what its agent measured of it.
type Target struct {
	ID     string // the worker's id on the node
	Seq    int    // its instance: a restarted worker's counters start afresh
	Job    string
	Tenant string
	Link   string
	Worker int
	// URL is where it may serve its metrics; "" when it has no metrics port.
	URL string
	// CPU (time used since it started) and Memory (bytes) are read from its cgroup or
	// /proc when Measured; Restarts and OOMKills are its agent's counts.
	CPU                time.Duration
	Memory             uint64
	Measured           bool
	Restarts, OOMKills int
}

// Node scrapes one node's workers round after round and keeps, for the masters, their
// series added up per job (Latest) and, for a worker's detail, each one's last values.
type Node struct {
	cfg    Config
	node   string
	client *http.Client

	mu      sync.Mutex
	workers map[string]*worker // by Target.ID
	latest  api.NodeMetrics
	wire    []byte
}

// worker is what a node remembers of one worker between rounds.
type worker struct {
	t       Target
	at      time.Time
	state   string
	problem string             // what the last parse dropped
	samples []Sample           // the last round's, builtins included
	prev    map[string]float64 // counters' values at prevAt, by series id
	prevAt  map[string]time.Time
	rates   map[string]float64 // counters' rates in the last round, by series id
}

// NewNode returns the scraper of node's workers.
func NewNode(node string, cfg Config) *Node {
	cfg.defaults()
	dialer := &net.Dialer{Timeout: cfg.Timeout}
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            dialer.DialContext,
		DisableCompression:     true, // a gzip bomb is no worker's right
		MaxIdleConnsPerHost:    1,
		IdleConnTimeout:        time.Minute,
		ResponseHeaderTimeout:  cfg.Timeout,
		MaxResponseHeaderBytes: 16 << 10,
	}
	return &Node{cfg: cfg, node: node, workers: map[string]*worker{},
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			// A worker's redirect would point its agent at any address it likes.
			return errors.New("redirects are not followed")
		}}}
}

// Close releases the scraper's idle connections.
func (n *Node) Close() { n.client.CloseIdleConnections() }

// errNotServing: nothing listens on the worker's metrics port.
var errNotServing = errors.New("serves no metrics")

// fetch reads one worker's exposition.
func (n *Node) fetch(ctx context.Context, url string) ([]Sample, string, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := n.client.Do(req)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return nil, "", errNotServing
		case ctx.Err() != nil:
			return nil, "", fmt.Errorf("no answer within %s", n.cfg.Timeout)
		}
		return nil, "", fmt.Errorf("scrape: %s", clip(err.Error(), 200))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("answered %s", clip(resp.Status, 60))
	}
	s, dropped, err := Parse(resp.Body, n.cfg.Limits)
	if err != nil && ctx.Err() != nil {
		return nil, "", fmt.Errorf("body not read within %s", n.cfg.Timeout)
	}
	return s, dropped, err
}

// Round scrapes every target, adds what the agent measured, and makes the node's new
// answer to the masters. Workers not among targets are forgotten. One round at a time.
func (n *Node) Round(ctx context.Context, targets []Target, interval time.Duration) {
	type result struct {
		samples []Sample
		dropped string
		err     error
		at      time.Time
	}
	res := make([]result, len(targets))
	var wg sync.WaitGroup
	sem := make(chan struct{}, n.cfg.Parallel)
	for i, t := range targets {
		if t.URL == "" {
			res[i] = result{err: errNotServing, at: time.Now()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				res[i] = result{err: ctx.Err(), at: time.Now()}
				return
			}
			defer func() { <-sem }()
			s, d, err := n.fetch(ctx, t.URL)
			res[i] = result{samples: s, dropped: d, err: err, at: time.Now()}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	keep := make(map[string]bool, len(targets))
	for i, t := range targets {
		keep[t.ID] = true
		w := n.workers[t.ID]
		if w == nil || w.t.Seq != t.Seq || w.t.Job != t.Job {
			w = &worker{prev: map[string]float64{}, prevAt: map[string]time.Time{}}
			n.workers[t.ID] = w
		}
		w.t = t
		r := res[i]
		w.at, w.problem = r.at, r.dropped
		result := "failed"
		switch {
		case r.err == nil:
			w.state, result = StateOK, StateOK
		case errors.Is(r.err, errNotServing):
			w.state, r.samples, result = StateNone, nil, StateNone
		default:
			w.state, r.samples = clip(r.err.Error(), 200), nil
		}
		if n.cfg.Scraped != nil {
			n.cfg.Scraped(result)
		}
		w.samples = append(r.samples, builtins(t)...)
		w.rates = map[string]float64{}
		for _, s := range w.samples {
			if !s.Counter {
				continue
			}
			id := s.ID()
			if p, ok := w.prev[id]; ok {
				if dt := r.at.Sub(w.prevAt[id]).Seconds(); dt > 0 {
					inc := s.Value - p
					if inc < 0 {
						inc = s.Value // reset: counted from 0, as Prometheus does
					}
					w.rates[id] = inc / dt
				}
			}
			w.prev[id], w.prevAt[id] = s.Value, r.at
		}
		if len(w.prev) > 2*(n.cfg.MaxSeries+len(api.BuiltinSeries)) {
			// Series a worker stopped serving: start over rather than grow.
			w.prev, w.prevAt = map[string]float64{}, map[string]time.Time{}
		}
	}
	for id := range n.workers {
		if !keep[id] {
			delete(n.workers, id)
		}
	}
	n.latest = n.aggregate(interval)
	n.wire = api.MarshalNodeMetrics(n.latest)
}

// builtins are the series the agent measures of t.
func builtins(t Target) []Sample {
	s := []Sample{
		{Name: api.SeriesWorkers, Value: 1},
		{Name: api.SeriesRestarts, Counter: true, Value: float64(t.Restarts)},
		{Name: api.SeriesOOMKills, Counter: true, Value: float64(t.OOMKills)},
	}
	if t.Measured {
		s = append(s, Sample{Name: api.SeriesCPU, Counter: true, Value: t.CPU.Seconds()},
			Sample{Name: api.SeriesMemory, Value: float64(t.Memory)})
	}
	return s
}

// aggregate adds the workers up per job; n.mu is held.
func (n *Node) aggregate(interval time.Duration) api.NodeMetrics {
	type acc struct {
		j      api.NodeJobMetrics
		series map[string]*api.SeriesSample
	}
	jobs := map[string]*acc{}
	var latest time.Time
	for _, id := range slices.Sorted(maps.Keys(n.workers)) {
		w := n.workers[id]
		a := jobs[w.t.Job]
		if a == nil {
			a = &acc{j: api.NodeJobMetrics{Job: w.t.Job, Tenant: w.t.Tenant}, series: map[string]*api.SeriesSample{}}
			jobs[w.t.Job] = a
		}
		a.j.Workers++
		if w.state != StateOK && w.state != StateNone {
			a.j.Failed++
			if a.j.Problem == "" {
				a.j.Problem = fmt.Sprintf("worker %d: %s", w.t.Worker, w.state)
			}
		} else if w.problem != "" && a.j.Problem == "" {
			a.j.Problem = fmt.Sprintf("worker %d: %s", w.t.Worker, w.problem)
		}
		if w.at.After(latest) {
			latest = w.at
		}
		for _, s := range w.samples {
			id := s.ID()
			ss := a.series[id]
			if ss == nil {
				ss = &api.SeriesSample{Name: s.Name, Labels: s.Labels, Counter: s.Counter}
				a.series[id] = ss
			}
			if ss.Counter != s.Counter {
				continue // a counter here, a gauge there: the first worker's word holds
			}
			one := api.SeriesSample{N: 1, Sum: s.Value, Min: s.Value, Max: s.Value}
			if s.Counter {
				one = api.SeriesSample{Total: s.Value}
				if r, ok := w.rates[id]; ok {
					one.N, one.Sum, one.Min, one.Max = 1, r, r, r
				}
			}
			ss.Add(one)
		}
	}
	m := api.NodeMetrics{Node: n.node, At: latest.UTC(), Interval: interval}
	for _, job := range slices.Sorted(maps.Keys(jobs)) {
		a := jobs[job]
		ids := slices.SortedFunc(maps.Keys(a.series), func(x, y string) int {
			bx, by := Reserved(a.series[x].Name), Reserved(a.series[y].Name)
			switch {
			case bx && !by:
				return -1
			case by && !bx:
				return 1
			}
			return strings.Compare(x, y)
		})
		if len(ids) > n.cfg.MaxJobSeries {
			if a.j.Problem == "" {
				a.j.Problem = fmt.Sprintf("the workers serve %d series together, over the limit of %d: kept the first by name", len(ids), n.cfg.MaxJobSeries)
			}
			ids = ids[:n.cfg.MaxJobSeries]
		}
		a.j.Series = make([]api.SeriesSample, 0, len(ids))
		for _, id := range ids {
			a.j.Series = append(a.j.Series, *a.series[id])
		}
		m.Jobs = append(m.Jobs, a.j)
	}
	return m
}

// Latest is the node's last answer to the masters and its binary form (nil before the
// first round).
func (n *Node) Latest() (api.NodeMetrics, []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.latest, n.wire
}

// Workers is the last round's detail of job's workers on the node.
func (n *Node) Workers(job string) []api.WorkerMetrics {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.WorkerMetrics
	for _, id := range slices.Sorted(maps.Keys(n.workers)) {
		w := n.workers[id]
		if w.t.Job != job {
			continue
		}
		wm := api.WorkerMetrics{Job: w.t.Job, Link: w.t.Link, Worker: w.t.Worker, Node: n.node, State: w.state, At: w.at.UTC()}
		if w.problem != "" && w.state == StateOK {
			wm.State = StateOK + "; " + w.problem
		}
		for _, s := range w.samples {
			ws := api.WorkerSeriesAt{Name: s.Name, Labels: s.Labels, Kind: api.KindGauge, Value: s.Value}
			if s.Counter {
				ws.Kind = api.KindCounter
				if r, ok := w.rates[s.ID()]; ok {
					ws.Rate = &r
				}
			}
			wm.Series = append(wm.Series, ws)
		}
		out = append(out, wm)
	}
	return out
}
