package jobmetrics

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
)

// The history's newest round as Prometheus series, for federation (GET /v1/metrics/jobs):
// each job-level series under its own name with the labels stormdock_job and
// stormdock_tenant added, a gauge three times (aggregation="sum|min|max"), a counter as its
// total over the job's workers (a scrape computes rates itself; the total falls when workers
// leave, which Prometheus reads as a reset). The series stormdock measures are named
// stormdock_job_*, and their tenants' and the cluster's sums stormdock_tenant_* and
// stormdock_cluster_*.

// Label names federation adds; a worker's own labels of these names are not exported.
const (
	LabelJob         = "stormdock_job"
	LabelTenant      = "stormdock_tenant"
	LabelAggregation = "aggregation"
)

// builtinExport names the series stormdock measures, for export.
var builtinExport = map[string]struct {
	name, help string
	counter    bool
}{
	api.SeriesCPU:        {"cpu_seconds_total", "Cpu seconds used by the workers.", true},
	api.SeriesMemory:     {"memory_bytes", "Memory of the workers, page cache excluded.", false},
	api.SeriesWorkers:    {"workers", "Workers running.", false},
	api.SeriesRestarts:   {"restarts_total", "Restarts of the workers after crashes.", true},
	api.SeriesOOMKills:   {"oom_kills_total", "Workers killed at their memory limit.", true},
	api.SeriesThroughput: {"throughput", "Records processed per second (the rate of the *_processed_total counters).", false},
}

// Federation is the history's newest round as a collector; keep says which tenants'
// jobs it exports.
func (h *History) Federation(keep func(tenant string) bool) prometheus.Collector {
	return &federation{h: h, keep: keep}
}

type federation struct {
	h    *History
	keep func(string) bool
}

// Describe sends nothing: the series are only known at collection (an unchecked
// collector).
func (f *federation) Describe(chan<- *prometheus.Desc) {}

func (f *federation) Collect(ch chan<- prometheus.Metric) {
	h := f.h
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.head < 0 {
		return
	}
	descs := map[string]*prometheus.Desc{}
	desc := func(name, help string, labels []string) *prometheus.Desc {
		id := name + "|" + strings.Join(labels, ",")
		d := descs[id]
		if d == nil {
			d = prometheus.NewDesc(name, help, labels, nil)
			descs[id] = d
		}
		return d
	}
	emit := func(g *ring, name, help string, base []string, values []string) {
		sum, mn, mx, _, ok := g.at(h.head)
		if !ok {
			return
		}
		names, vals, ok := withLabels(base, values, g.labels)
		if !ok {
			return
		}
		if b, isBuiltin := builtinExport[g.name]; isBuiltin && g.labels == "" {
			name, help = name+b.name, b.help
			if g.name == api.SeriesThroughput {
				ch <- prometheus.MustNewConstMetric(desc(name, help, names), prometheus.GaugeValue, sum, vals...)
				return
			}
		}
		if g.counter {
			ch <- prometheus.MustNewConstMetric(desc(name, help, names), prometheus.CounterValue, g.total, vals...)
			return
		}
		names = append(names, LabelAggregation)
		d := desc(name, help, names)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, sum, append(vals, "sum")...)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(mn), append(vals, "min")...)
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(mx), append(vals, "max")...)
	}
	for _, job := range slices.Sorted(maps.Keys(h.jobs)) {
		jh := h.jobs[job]
		if !f.keep(jh.tenant) {
			continue
		}
		for _, k := range sortedKeys(jh.series) {
			g := jh.series[k]
			prefix, help := "", "A series the job's workers serve, over its workers (stormdock federation)."
			if builtin(g.name) && g.labels == "" {
				prefix = "stormdock_job_"
			} else {
				prefix = g.name
			}
			emit(g, prefix, help, []string{LabelJob, LabelTenant}, []string{job, jh.tenant})
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(h.tenants)) {
		if !f.keep(tenant) {
			continue
		}
		for _, k := range sortedKeys(h.tenants[tenant]) {
			emit(h.tenants[tenant][k], "stormdock_tenant_", "", []string{LabelTenant}, []string{tenant})
		}
	}
	if f.keep("") {
		for _, k := range sortedKeys(h.cluster) {
			emit(h.cluster[k], "stormdock_cluster_", "", nil, nil)
		}
	}
}

// withLabels adds a series' own labels (in the exposition syntax) to the given ones; false
// when they cannot be exported (one of federation's own names, or unreadable).
func withLabels(names, values []string, labels string) ([]string, []string, bool) {
	names, values = slices.Clone(names), slices.Clone(values)
	rest := labels
	for rest != "" {
		name, after, ok := strings.Cut(rest, `="`)
		if !ok {
			return nil, nil, false
		}
		// The value runs to the first unescaped quote.
		end := -1
		for i := 0; i < len(after); i++ {
			if after[i] == '\\' {
				i++
				continue
			}
			if after[i] == '"' {
				end = i
				break
			}
		}
		if end < 0 {
			return nil, nil, false
		}
		v, err := strconv.Unquote(`"` + after[:end] + `"`)
		if err != nil {
			return nil, nil, false
		}
		if name == LabelJob || name == LabelTenant || name == LabelAggregation {
			return nil, nil, false
		}
		names, values = append(names, name), append(values, v)
		rest = strings.TrimPrefix(after[end+1:], ",")
	}
	return names, values, true
}
