// Package jobmetrics keeps the jobs' metrics on a master: it pulls every node's per-job
// aggregate from its agent, merges them per job, tenant and cluster, and keeps each series
// for a bounded window at a fixed resolution and a fixed cost per series.
package jobmetrics

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
)

// A series' history is a ring of points, one per round: round r (the round's time divided
// by the step) lives in slot r % size. A point is the sum over the workers (for counters,
// of their rates), their min and max, and how many gave a value: 18 bytes, so a series
// costs size*18 bytes whatever happens (6.5 KB for an hour at 10 s), plus its name.
// Missing points (a node not read, a series not served that round) are NaN.

type ring struct {
	name, labels string
	counter      bool
	sum          []float64
	min, max     []float32
	n            []uint16
	last         int64   // the newest round written
	total        float64 // a counter's latest total over the workers
}

func newRing(name, labels string, counter bool, size int, r int64) *ring {
	g := &ring{name: name, labels: labels, counter: counter, sum: make([]float64, size),
		min: make([]float32, size), max: make([]float32, size), n: make([]uint16, size), last: r - int64(size)}
	for i := range g.sum {
		g.sum[i] = math.NaN()
	}
	return g
}

// put writes round r's point, clearing the rounds skipped since the last.
func (g *ring) put(r int64, s api.SeriesSample) {
	size := int64(len(g.sum))
	if r <= g.last-size {
		return // older than the window
	}
	if r > g.last {
		for k := max(g.last+1, r-size+1); k < r; k++ {
			g.sum[slot(k, size)] = math.NaN()
		}
		g.last = r
	}
	i := slot(r, size)
	g.sum[i], g.min[i], g.max[i] = s.Sum, float32(s.Min), float32(s.Max)
	g.n[i] = uint16(min(s.N, math.MaxUint16))
	if r == g.last {
		g.total = s.Total
	}
}

// at is round r's point; ok is false when the ring has none.
func (g *ring) at(r int64) (sum float64, mn, mx float32, n uint16, ok bool) {
	size := int64(len(g.sum))
	if r > g.last || r <= g.last-size {
		return 0, 0, 0, 0, false
	}
	i := slot(r, size)
	if math.IsNaN(g.sum[i]) {
		return 0, 0, 0, 0, false
	}
	return g.sum[i], g.min[i], g.max[i], g.n[i], true
}

// slot is round r's index in a ring of size points.
func slot(r, size int64) int64 { return (r%size + size) % size }

// bytes is what the ring holds, for the memory figure.
func (g *ring) bytes() int {
	return len(g.sum)*18 + len(g.name) + len(g.labels) + 96
}

type seriesKey struct{ name, labels string }

// jobHistory is one job's series.
type jobHistory struct {
	tenant    string
	submitted time.Time
	workers   int
	problems  []string
	series    map[seriesKey]*ring
	seen      int64 // the last round the job was merged in
}

// History holds every job's series, and the tenants' and the cluster's sums of the
// series stormdock measures.
type History struct {
	step time.Duration
	size int

	mu      sync.RWMutex
	head    int64 // the newest round committed; -1 before the first
	at      time.Time
	jobs    map[string]*jobHistory
	tenants map[string]map[seriesKey]*ring
	cluster map[seriesKey]*ring
}

// NewHistory keeps window at one point per step.
func NewHistory(step, window time.Duration) *History {
	size := max(int(window/step), 2)
	return &History{step: step, size: size, head: -1, jobs: map[string]*jobHistory{},
		tenants: map[string]map[seriesKey]*ring{}, cluster: map[seriesKey]*ring{}}
}

// Step is the history's resolution; Window how far back it reaches.
func (h *History) Step() time.Duration   { return h.step }
func (h *History) Window() time.Duration { return time.Duration(h.size) * h.step }

func (h *History) round(t time.Time) int64 { return t.UnixNano() / int64(h.step) }

// roundTime is when round r began.
func (h *History) roundTime(r int64) time.Time { return time.Unix(0, r*int64(h.step)).UTC() }

// JobRound is one job's merged series of one round.
type JobRound struct {
	Tenant    string
	Submitted time.Time
	Workers   int // desired
	Problems  []string
	Series    []api.SeriesSample
}

// Commit records a round at t: every job's merged series. Jobs not in jobs are gone from
// the history (a job the masters no longer know has no history to show).
func (h *History) Commit(t time.Time, jobs map[string]JobRound) {
	r := h.round(t)
	h.mu.Lock()
	defer h.mu.Unlock()
	if r < h.head {
		return
	}
	h.head, h.at = r, t
	tenantSums := map[string]map[seriesKey]*api.SeriesSample{}
	clusterSums := map[seriesKey]*api.SeriesSample{}
	for name, jr := range jobs {
		jh := h.jobs[name]
		if jh == nil || jh.tenant != jr.Tenant || !jh.submitted.Equal(jr.Submitted) {
			// A new job, or another of the same name: its history starts afresh, never
			// the last one's (another tenant's, perhaps).
			jh = &jobHistory{tenant: jr.Tenant, submitted: jr.Submitted, series: map[seriesKey]*ring{}}
			h.jobs[name] = jh
		}
		jh.workers, jh.problems, jh.seen = jr.Workers, jr.Problems, r
		ts := tenantSums[jr.Tenant]
		if ts == nil {
			ts = map[seriesKey]*api.SeriesSample{}
			tenantSums[jr.Tenant] = ts
		}
		for _, s := range jr.Series {
			k := seriesKey{s.Name, s.Labels}
			g := jh.series[k]
			if g == nil || g.counter != s.Counter {
				g = newRing(s.Name, s.Labels, s.Counter, h.size, r)
				jh.series[k] = g
			}
			g.put(r, s)
			if s.Labels == "" && builtin(s.Name) {
				for _, m := range []map[seriesKey]*api.SeriesSample{ts, clusterSums} {
					acc := m[k]
					if acc == nil {
						acc = &api.SeriesSample{Name: s.Name, Counter: s.Counter}
						m[k] = acc
					}
					acc.Add(s)
				}
			}
		}
		// Series the job no longer serves leave with the window.
		for k, g := range jh.series {
			if g.last <= r-int64(h.size) {
				delete(jh.series, k)
			}
		}
	}
	for name := range h.jobs {
		if _, ok := jobs[name]; !ok {
			delete(h.jobs, name)
		}
	}
	for tenant, sums := range tenantSums {
		rings := h.tenants[tenant]
		if rings == nil {
			rings = map[seriesKey]*ring{}
			h.tenants[tenant] = rings
		}
		putSums(rings, sums, h.size, r)
	}
	for tenant, rings := range h.tenants {
		if _, ok := tenantSums[tenant]; !ok && allOlder(rings, r-int64(h.size)) {
			delete(h.tenants, tenant)
		}
	}
	putSums(h.cluster, clusterSums, h.size, r)
}

func putSums(rings map[seriesKey]*ring, sums map[seriesKey]*api.SeriesSample, size int, r int64) {
	for k, s := range sums {
		g := rings[k]
		if g == nil {
			g = newRing(k.name, "", s.Counter, size, r)
			rings[k] = g
		}
		g.put(r, *s)
	}
}

func allOlder(rings map[seriesKey]*ring, r int64) bool {
	for _, g := range rings {
		if g.last > r {
			return false
		}
	}
	return true
}

func builtin(name string) bool { return slices.Contains(api.BuiltinSeries, name) }

// Latest is the time of the newest round committed (zero before the first).
func (h *History) Latest() time.Time {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.at
}

// Query is what a reader asks of a job: some series (all when empty; a name alone means
// every label set of it) from since on; with Detail, each point's min, max and count of
// workers too (three times the bytes).
type Query struct {
	Series []string
	Since  time.Time
	Detail bool
}

// Job returns job's series over the window the query asks for, and false when the
// history has no round of it.
func (h *History) Job(name string, q Query) (api.JobMetrics, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	jh := h.jobs[name]
	if jh == nil || h.head < 0 {
		return api.JobMetrics{}, false
	}
	from, to := h.span(q.Since)
	out := api.JobMetrics{Job: name, Tenant: jh.tenant, Step: h.step.Seconds(), From: h.roundTime(from), To: h.roundTime(to),
		Workers: jh.workers, Problems: slices.Clone(jh.problems), Series: []api.SeriesHistory{}}
	for _, k := range sortedKeys(jh.series) {
		if !wanted(q.Series, k) {
			continue
		}
		out.Series = append(out.Series, history(jh.series[k], from, to, q.Detail))
	}
	return out, true
}

// Tenant and Cluster return the sums of the built-in series over the window.
func (h *History) Tenant(tenant string, since time.Time) api.JobMetrics {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.group(h.tenants[tenant], since, tenant)
}

func (h *History) Cluster(since time.Time) api.JobMetrics {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.group(h.cluster, since, "")
}

func (h *History) group(rings map[seriesKey]*ring, since time.Time, tenant string) api.JobMetrics {
	from, to := h.span(since)
	out := api.JobMetrics{Tenant: tenant, Step: h.step.Seconds(), From: h.roundTime(from), To: h.roundTime(to), Series: []api.SeriesHistory{}}
	for _, k := range sortedKeys(rings) {
		out.Series = append(out.Series, history(rings[k], from, to, true))
	}
	return out
}

// span is the rounds from since (or the window's start) to the head.
func (h *History) span(since time.Time) (int64, int64) {
	to := max(h.head, 0)
	from := to - int64(h.size) + 1
	if !since.IsZero() {
		from = max(from, h.round(since))
	}
	return min(from, to), to
}

func sortedKeys(m map[seriesKey]*ring) []seriesKey {
	return slices.SortedFunc(maps.Keys(m), func(a, b seriesKey) int {
		ba, bb := builtin(a.name), builtin(b.name)
		switch {
		case ba && !bb:
			return -1
		case bb && !ba:
			return 1
		case ba && bb:
			return slices.Index(api.BuiltinSeries, a.name) - slices.Index(api.BuiltinSeries, b.name)
		}
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return strings.Compare(a.labels, b.labels)
	})
}

// wanted reports whether series k is among those asked for: by name, or by name{labels}.
func wanted(asked []string, k seriesKey) bool {
	if len(asked) == 0 {
		return true
	}
	for _, a := range asked {
		if a == k.name || a == api.SeriesID(k.name, k.labels) {
			return true
		}
	}
	return false
}

func history(g *ring, from, to int64, detail bool) api.SeriesHistory {
	sh := api.SeriesHistory{Name: g.name, Labels: g.labels, Kind: api.KindGauge}
	if g.counter {
		sh.Kind = api.KindCounter
		t := g.total
		sh.Total = &t
	}
	n := int(to - from + 1)
	sh.Values = make([]*float64, n)
	vals := make([]float64, 3*n)
	if detail {
		sh.Min, sh.Max, sh.N = make([]*float64, n), make([]*float64, n), make([]int, n)
	}
	for i := range n {
		sum, mn, mx, cnt, ok := g.at(from + int64(i))
		if !ok {
			continue
		}
		vals[3*i] = sum
		sh.Values[i] = &vals[3*i]
		if detail {
			vals[3*i+1], vals[3*i+2] = float64(mn), float64(mx)
			sh.Min[i], sh.Max[i], sh.N[i] = &vals[3*i+1], &vals[3*i+2], int(cnt)
		}
	}
	return sh
}

// Values is one series' points as numbers (NaN where missing), oldest first, for the
// autoscaler: sums (counters: rates) and worker counts.
type Values struct {
	Sum []float64
	N   []int
}

// Series returns the job's series of that name (every label set added up) over the last
// rounds, and the history's newest round time; ok is false when the job or the series is
// unknown.
func (h *History) Series(job, name string, rounds int) (Values, time.Time, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	jh := h.jobs[job]
	if jh == nil || h.head < 0 {
		return Values{}, time.Time{}, false
	}
	v := Values{Sum: make([]float64, rounds), N: make([]int, rounds)}
	for i := range v.Sum {
		v.Sum[i] = math.NaN()
	}
	found := false
	for k, g := range jh.series {
		if k.name != name {
			continue
		}
		found = true
		for i := range rounds {
			sum, _, _, n, ok := g.at(h.head - int64(rounds-1-i))
			if !ok {
				continue
			}
			if math.IsNaN(v.Sum[i]) {
				v.Sum[i] = 0
			}
			v.Sum[i] += sum
			v.N[i] = max(v.N[i], int(n))
		}
	}
	return v, h.at, found
}

// Stats says what the history holds: jobs, series and their bytes.
type Stats struct {
	Jobs, Series int
	Bytes        int
}

// Stats counts what the history holds now.
func (h *History) Stats() Stats {
	h.mu.RLock()
	defer h.mu.RUnlock()
	var s Stats
	s.Jobs = len(h.jobs)
	count := func(m map[seriesKey]*ring) {
		for _, g := range m {
			s.Series++
			s.Bytes += g.bytes()
		}
	}
	for _, jh := range h.jobs {
		count(jh.series)
	}
	for _, t := range h.tenants {
		count(t)
	}
	count(h.cluster)
	return s
}

// Latest values of every job, for `job top`: the newest point of each series.
func (h *History) LatestJobs(keep func(tenant string) bool) api.JobsMetrics {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := api.JobsMetrics{At: h.at, Step: h.step.Seconds(), Jobs: []api.JobLatest{}}
	for _, name := range slices.Sorted(maps.Keys(h.jobs)) {
		jh := h.jobs[name]
		if !keep(jh.tenant) {
			continue
		}
		jl := api.JobLatest{Job: name, Tenant: jh.tenant, Workers: jh.workers, Values: map[string]float64{}, Kinds: map[string]string{}}
		for k, g := range jh.series {
			if sum, _, _, _, ok := g.at(h.head); ok {
				id := api.SeriesID(k.name, k.labels)
				jl.Values[id] = sum
				jl.Kinds[id] = api.KindGauge
				if g.counter {
					jl.Kinds[id] = api.KindCounter
				}
			}
		}
		out.Jobs = append(out.Jobs, jl)
	}
	return out
}
