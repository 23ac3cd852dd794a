package master

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/placement"
)

// metrics are the master's Prometheus series. Every name is stormdock_master_* (agents
// report stormdock_agent_*, output routers stormdock_router_*), in base units, with
// _total on counters.
type metrics struct {
	leader       prometheus.Gauge
	nodes        prometheus.Gauge
	slots        *prometheus.GaugeVec // by kind: total, used, free, throttled (as the agents')
	workers      *prometheus.GaugeVec // by state as agents report it: cluster.WorkerStates
	unplaced     prometheus.Gauge
	placements   prometheus.Counter
	replacements prometheus.Counter
	reconcile    prometheus.Histogram
	reconcileCPU prometheus.Counter
	// reconcilePhase is the wall time of each of a reconcile's steps (ReconcilePhases):
	// where a reconcile that takes seconds for a second of processor time waits.
	reconcilePhase *prometheus.CounterVec
	storeWrites    prometheus.Counter

	// Per job (output routers included, as JOB.router), set by the leader.
	jobDesired, jobRunning, jobUnplaced *prometheus.GaugeVec

	events *eventlog.Metrics // the event log's, which counts its store writes in storeWrites

	storeConnected prometheus.Gauge
	sessionsLost   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "stormdock", "master"
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "leader",
			Help: "1 while this master leads."}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "nodes",
			Help: "Live nodes."}),
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "slots",
			Help: "Worker slots of live nodes by kind: total, used, free, throttled."}, []string{"kind"}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "workers",
			Help: "Workers by state as agents report them."}, []string{"state"}),
		unplaced: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "workers_unplaced",
			Help: "Workers no node can take."}),
		placements: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "placements_total",
			Help: "Workers assigned to a node."}),
		replacements: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replacements_total",
			Help: "Workers moved from one node to another."}),
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "reconcile_duration_seconds",
			Help: "Time to plan and write assignments.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		reconcileCPU: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reconcile_cpu_seconds_total",
			Help: "Processor time the leader's reconciles took (their own thread's, the collector's background work excluded)."}),
		reconcilePhase: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reconcile_phase_seconds_total",
			Help: "Wall time the leader's reconciles spent in each step: view (reading the mirrors), prepare (data centers, keys, avoidances, crash loops), plan, assign (building assignments), write (to the store), publish (events, cleanup, the API's state)."}, []string{"phase"}),
		storeWrites: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "store_writes_total",
			Help: "Writes the master made to the coordination store."}),
		jobDesired: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "job_workers_desired",
			Help: "Workers a job asks for, over all its links (set by the leader)."}, []string{"job", "tenant"}),
		jobRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "job_workers_running",
			Help: "Workers of a job running where they are assigned (set by the leader)."}, []string{"job", "tenant"}),
		jobUnplaced: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "job_workers_unplaced",
			Help: "Workers of a job no node can take (set by the leader)."}, []string{"job", "tenant"}),
		storeConnected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "store_connected",
			Help: "1 while this master reaches the coordination store."}),
		sessionsLost: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "store_sessions_lost_total",
			Help: "Store sessions of this master that expired (its ephemeral entries were lost)."}),
	}
	for _, p := range ReconcilePhases {
		m.reconcilePhase.WithLabelValues(p) // each step shows from the start, at 0
	}
	m.events = eventlog.NewMetrics(m.storeWrites)
	m.storeConnected.Set(1)
	if reg != nil {
		reg.MustRegister(m.leader, m.nodes, m.slots, m.workers, m.unplaced, m.placements, m.replacements, m.reconcile, m.reconcileCPU, m.reconcilePhase, m.storeWrites,
			m.jobDesired, m.jobRunning, m.jobUnplaced, m.storeConnected, m.sessionsLost)
		reg.MustRegister(m.events.Collectors()...)
	}
	return m
}

// ReconcilePhases are a reconcile's steps, in order (stormdock_master_reconcile_phase_seconds_total).
var ReconcilePhases = []string{"view", "prepare", "plan", "assign", "write", "publish"}

// phaseClock adds each step's wall time to its counter as the reconcile ends it.
type phaseClock struct {
	c    *prometheus.CounterVec
	last time.Time
}

func (m *metrics) clock(start time.Time) *phaseClock {
	return &phaseClock{c: m.reconcilePhase, last: start}
}

// done ends step phase.
func (p *phaseClock) done(phase string) {
	now := time.Now()
	p.c.WithLabelValues(phase).Add(now.Sub(p.last).Seconds())
	p.last = now
}

// observe records what one reconcile saw and did.
func (r *reconciler) observe(st *Snapshot, was map[cluster.WorkerKey]string, res *placement.Result, writes int, took time.Duration) {
	m := r.m.metrics
	v := st.v
	m.reconcile.Observe(took.Seconds())
	m.nodes.Set(float64(len(v.nodes)))
	var total, used, throttled int
	for _, rec := range v.nodes {
		total += rec.Node.Slots
		throttled += rec.Health.Throttled
	}
	for _, st := range r.assign {
		used += len(st.a.Workers)
	}
	m.slots.WithLabelValues("total").Set(float64(total))
	m.slots.WithLabelValues("used").Set(float64(used))
	m.slots.WithLabelValues("throttled").Set(float64(throttled))
	m.slots.WithLabelValues("free").Set(float64(max(total-used-throttled, 0)))
	counts := map[string]int{}
	for _, s := range v.statuses {
		counts[s.status.State]++
	}
	for _, state := range cluster.WorkerStates() {
		m.workers.WithLabelValues(state).Set(float64(counts[state]))
	}
	m.unplaced.Set(float64(len(res.Unplaced)))
	r.observeJobs(st)
	for _, p := range res.Placements {
		if was[p.Key()] != p.Node {
			m.placements.Inc()
		}
	}
	for _, mv := range res.Moves {
		if mv.To != "" {
			m.replacements.Inc()
		}
	}
	if len(res.Unplaced) != r.lastUnplaced || writes > 0 {
		r.m.log.Info("reconciled", "placed", len(res.Placements), "unplaced", len(res.Unplaced),
			"moves", len(res.Moves), "writes", writes, "took", took.Round(time.Microsecond))
		if len(res.Unplaced) > 0 {
			r.m.log.Warn("workers unplaced", "first", res.Unplaced[0].Reason, "count", len(res.Unplaced))
		}
	}
	r.lastUnplaced = len(res.Unplaced)
}

// observeJobs sets the per-job gauges: desired, running where assigned, unplaced, as the
// state published counts them (Snapshot.tally: the API's summaries, counted once).
func (r *reconciler) observeJobs(st *Snapshot) {
	m := r.m.metrics
	st.tally()
	v := st.v
	running := func(job string) int { return st.tallies[job].running }
	unplaced := func(job string) int { return st.tallies[job].unplaced }
	m.jobDesired.Reset()
	m.jobRunning.Reset()
	m.jobUnplaced.Reset()
	for _, spec := range v.runningJobs() {
		m.jobDesired.WithLabelValues(spec.Name, spec.Tenant).Set(float64(spec.TotalWorkers()))
		m.jobRunning.WithLabelValues(spec.Name, spec.Tenant).Set(float64(running(spec.Name)))
		m.jobUnplaced.WithLabelValues(spec.Name, spec.Tenant).Set(float64(unplaced(spec.Name)))
	}
}
