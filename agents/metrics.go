package agents

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
)

// metrics are the agent's Prometheus metrics, all stormdock_agent_* (the health checks'
// too, see package healthcheck). The gauges are set by the agent's loop after every change,
// so a scrape never takes the loop's state.
type metrics struct {
	slots       *prometheus.GaugeVec // kind: total, used, free, throttled
	workers     *prometheus.GaugeVec // state: cluster.WorkerStates, as the master's
	starts      prometheus.Counter
	restarts    *prometheus.CounterVec // by job
	oomKills    *prometheus.CounterVec // by job
	evictions   *prometheus.CounterVec // by job
	storeWrites prometheus.Counter
	scrapes     *prometheus.CounterVec // by result: ok, none, failed
	// sessionsLost counts store sessions that ended: the agent's own, and the node's (its
	// keeper's), by whose.
	sessionsLost *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		slots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "slots",
			Help: "Worker slots of the node by kind: total, used, free, throttled.",
		}, []string{"kind"}),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "workers",
			Help: "Workers on the node by state.",
		}, []string{"state"}),
		starts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "worker_starts_total",
			Help: "Workers started, restarts included.",
		}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "worker_restarts_total",
			Help: "Workers that ended unasked and were scheduled for a restart, by job.",
		}, []string{"job"}),
		oomKills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "worker_oom_kills_total",
			Help: "Workers killed at their memory limit, by job.",
		}, []string{"job"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "worker_evictions_total",
			Help: "Workers stopped by the health checks under memory pressure, by job.",
		}, []string{"job"}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "worker_scrapes_total",
			Help: "Scrapes of workers' metrics by result: ok, none (the worker serves none), failed (timeout, too large, not the text format...).",
		}, []string{"result"}),
		storeWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "store_writes_total",
			Help: "Writes of the node record to the coordination store.",
		}),
		sessionsLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "stormdock", Subsystem: "agent", Name: "store_sessions_lost_total",
			Help: "Store sessions that ended: the agent's own, or the node's (its keeper's, which makes the node lost).",
		}, []string{"session"}),
	}
	for _, s := range []string{"agent", "keeper"} {
		m.sessionsLost.WithLabelValues(s)
	}
	for _, s := range cluster.WorkerStates() {
		m.workers.WithLabelValues(s)
	}
	if reg == nil {
		return m, nil
	}
	for _, r := range []string{"ok", "none", "failed"} {
		m.scrapes.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.slots, m.workers, m.starts, m.restarts, m.oomKills, m.evictions, m.storeWrites, m.sessionsLost, m.scrapes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	return m, nil
}

// setSlots publishes the slot gauges.
func (m *metrics) setSlots(total, used, throttled int) {
	m.slots.WithLabelValues("total").Set(float64(total))
	m.slots.WithLabelValues("used").Set(float64(used))
	m.slots.WithLabelValues("throttled").Set(float64(throttled))
	m.slots.WithLabelValues("free").Set(float64(max(total-used-throttled, 0)))
}

// setWorkers publishes the count of workers per state.
func (m *metrics) setWorkers(byState map[string]int) {
	for _, s := range cluster.WorkerStates() {
		m.workers.WithLabelValues(s).Set(float64(byState[s]))
	}
}
