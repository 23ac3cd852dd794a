package api

import (
	"time"
)

// Job metrics travel in two hops, never through the store: an agent scrapes its workers and
// adds their series up per job (NodeMetrics, served on its signed endpoint as GET
// /v1/metrics in the binary form of metricswire.go); every master pulls those from every
// node, merges them per job, tenant and cluster, and keeps a bounded history that its API
// answers from (JobMetrics, GET /v1/jobs/{name}/metrics). Per-worker detail stays on the
// agents (WorkerMetrics, GET /v1/metrics/workers there), fetched when asked for.

// Series kinds, as the worker's exposition declares them (# TYPE): counters are added up as
// rates (and totals), gauges as sum, min and max over the workers.
const (
	KindCounter = "counter"
	KindGauge   = "gauge"
)

// Series every job has, measured by the agents and the masters rather than served by the
// workers. A worker's own series of one of these names is dropped (and reported).
const (
	SeriesCPU        = "cpu"        // counter: cpu seconds; its rate is cores
	SeriesMemory     = "memory"     // gauge: bytes, page cache excluded
	SeriesWorkers    = "workers"    // gauge: workers running
	SeriesRestarts   = "restarts"   // counter: restarts after crashes
	SeriesOOMKills   = "oom_kills"  // counter: kills at the memory limit
	SeriesThroughput = "throughput" // the rate of the job's *_processed_total counters, added up (masters)
)

// BuiltinSeries lists the series of BuiltinSeries names, in the order they are shown.
var BuiltinSeries = []string{SeriesWorkers, SeriesCPU, SeriesMemory, SeriesThroughput, SeriesRestarts, SeriesOOMKills}

// ThroughputSuffix marks the counters whose rates make a job's throughput: a worker counts
// the records it processed in a counter named *_processed_total (the word count's
// lines_processed_total).
const ThroughputSuffix = "_processed_total"

// NodeMetrics is one agent's answer to a master: its workers' series added up per job, as
// of its last scrape round.
type NodeMetrics struct {
	Node string
	// At is when the agent's last scrape round ended; Interval is its scrape interval.
	At       time.Time
	Interval time.Duration
	Jobs     []NodeJobMetrics
}

// NodeJobMetrics is one job's workers on one node.
type NodeJobMetrics struct {
	Job    string
	Tenant string
	// Workers counts the job's workers running on the node; Failed those whose last
	// scrape failed (a worker serving no metrics at all is not a failure). Problem is the
	// first failure's reason, for operators.
	Workers int
	Failed  int
	Problem string
	Series  []SeriesSample
}

// SeriesSample is one series of a job added up over its workers on one node (or, at the
// master, over the whole job).
type SeriesSample struct {
	Name string
	// Labels are the series' labels in the exposition format's order and syntax, sorted by
	// name: `queue="a",shard="2"`, "" for none. With Name, they name the series.
	Labels  string
	Counter bool
	// Sum, Min and Max are over the workers' values: for a gauge its values, for a
	// counter its rates (per second). N counts the workers that gave one.
	Sum, Min, Max float64
	N             int
	// Total is a counter's value added up over the workers (0 for gauges).
	Total float64
}

// Add merges o into s (the same series of other workers).
func (s *SeriesSample) Add(o SeriesSample) {
	if o.N == 0 {
		s.Total += o.Total
		return
	}
	if s.N == 0 {
		s.Min, s.Max = o.Min, o.Max
	} else {
		s.Min, s.Max = min(s.Min, o.Min), max(s.Max, o.Max)
	}
	s.Sum += o.Sum
	s.N += o.N
	s.Total += o.Total
}

// WorkerMetrics is one worker's latest values as its agent scraped them (GET
// /v1/jobs/{name}/metrics/workers).
type WorkerMetrics struct {
	Job    string `json:"job"`
	Link   string `json:"link,omitempty"`
	Worker int    `json:"worker"`
	Node   string `json:"node"`
	// State is the last scrape's outcome: "ok", "none" (the worker serves no metrics), or
	// what went wrong (a timeout, a body over the limit, a parse error...).
	State  string           `json:"state"`
	At     time.Time        `json:"at,omitzero"`
	Series []WorkerSeriesAt `json:"series"`
}

// WorkerSeriesAt is one series of one worker: a gauge's value, a counter's value and rate.
type WorkerSeriesAt struct {
	Name   string   `json:"name"`
	Labels string   `json:"labels,omitempty"`
	Kind   string   `json:"kind"`
	Value  float64  `json:"value"`
	Rate   *float64 `json:"rate,omitempty"`
}

// JobMetrics is a job's series over a window (GET /v1/jobs/{name}/metrics): points every
// Step from From, the last at To. A point the masters have no value for is null.
type JobMetrics struct {
	Job    string    `json:"job"`
	Tenant string    `json:"tenant"`
	Step   float64   `json:"step"` // seconds
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	// Workers is the job's desired worker count; Problems lists its workers' scrape
	// problems in the last round (by node), empty when every worker was read.
	Workers  int             `json:"workers"`
	Problems []string        `json:"problems,omitempty"`
	Series   []SeriesHistory `json:"series"`
}

// SeriesHistory is one job-level series: for gauges the sum over the workers, for counters
// the rate (per second) added up; with detail, Min and Max over the workers and N the
// workers that gave a value. Total is a counter's latest total over the workers.
type SeriesHistory struct {
	Name   string     `json:"name"`
	Labels string     `json:"labels,omitempty"`
	Kind   string     `json:"kind"`
	Values []*float64 `json:"values"`
	Min    []*float64 `json:"min,omitempty"`
	Max    []*float64 `json:"max,omitempty"`
	N      []int      `json:"n,omitempty"`
	Total  *float64   `json:"total,omitempty"`
}

// Last is the series' latest value and its index, or false when it has none.
func (s SeriesHistory) Last() (float64, int, bool) {
	for i := len(s.Values) - 1; i >= 0; i-- {
		if s.Values[i] != nil {
			return *s.Values[i], i, true
		}
	}
	return 0, -1, false
}

// ID is the series' name with its labels, as the exposition format writes it.
func (s SeriesHistory) ID() string { return SeriesID(s.Name, s.Labels) }

// SeriesID is name{labels}, or name alone without labels.
func SeriesID(name, labels string) string {
	if labels == "" {
		return name
	}
	return name + "{" + labels + "}"
}

// JobWorkerMetrics is GET /v1/jobs/{name}/metrics/workers: each worker's latest values as
// its agent last read them, and the nodes that could not be asked.
type JobWorkerMetrics struct {
	Job      string          `json:"job"`
	Workers  []WorkerMetrics `json:"workers"`
	Problems []string        `json:"problems,omitempty"`
}

// JobsMetrics is GET /v1/metrics/latest: every job's latest values, for `job top`.
type JobsMetrics struct {
	At   time.Time   `json:"at"`
	Step float64     `json:"step"`
	Jobs []JobLatest `json:"jobs"`
}

// JobLatest is one job's latest job-level values.
type JobLatest struct {
	Job     string             `json:"job"`
	Tenant  string             `json:"tenant"`
	Workers int                `json:"workers"` // desired
	Values  map[string]float64 `json:"values"`  // by series id: gauges' sums, counters' rates
	Kinds   map[string]string  `json:"kinds"`
}
