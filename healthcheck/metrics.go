package healthcheck

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/cluster"
)

// metrics are the monitor's Prometheus series. The monitor runs inside the node agent, so
// they are agent metrics, stormdock_agent_*, in base units (ratios, not percentages). They
// live on the registerer the agent gives, never the global default, so two monitors (tests,
// a local cluster in one process) do not collide.
type metrics struct {
	used, cgroupUsed, psi, cgroupPSI, load1, withheld prometheus.Gauge
	health                                            *prometheus.GaugeVec
	evictions, probeErrors                            prometheus.Counter
	scriptFailures                                    *prometheus.CounterVec
}

var healthStates = []string{cluster.HealthHealthy, cluster.HealthThrottled, cluster.HealthUnhealthy}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "stormdock", "agent"
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	m := &metrics{
		used:       g("memory_used_ratio", "Memory in use as a fraction of the node's memory: max of node level and workers' parent cgroup."),
		cgroupUsed: g("cgroup_memory_used_ratio", "Working set of the workers' parent cgroup over its limit (0 without a limit)."),
		psi:        g("memory_pressure_some_avg10_ratio", "PSI memory 'some' 10 s average, as a fraction of time."),
		cgroupPSI: g("cgroup_memory_pressure_some_avg10_ratio",
			"PSI memory 'some' 10 s average of the workers' parent cgroup (cgroup v2), as a fraction of time."),
		load1:    g("load1", "1-minute load average."),
		withheld: g("slots_withheld", "Worker slots withheld from new work by health checks."),
		health: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "health_state",
			Help: "1 for the node's current health state, 0 for the others."}, []string{"state"}),
		// Not the agent's worker_evictions_total, which also counts workers stopped on an
		// unhealthy node.
		evictions:   c("memory_evictions_total", "Workers stopped because memory reached the critical mark."),
		probeErrors: c("health_probe_errors_total", "Memory probes that failed."),
		scriptFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "health_script_failures_total", Help: "Health script runs that failed (ERROR line, non-zero exit, timeout)."},
			[]string{"script"}),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.used, m.cgroupUsed, m.psi, m.cgroupPSI, m.load1, m.withheld, m.health,
			m.evictions, m.probeErrors, m.scriptFailures} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("healthcheck metrics: %w", err)
			}
		}
	}
	m.setHealth(cluster.HealthHealthy)
	return m, nil
}

func (m *metrics) setHealth(state string) {
	for _, s := range healthStates {
		v := 0.0
		if s == state {
			v = 1
		}
		m.health.WithLabelValues(s).Set(v)
	}
}

func (m *metrics) observe(s Sample) {
	m.used.Set(s.Used)
	m.cgroupUsed.Set(s.CgroupUsed)
	if s.HasPSI {
		m.psi.Set(s.PSI.SomeAvg10 / 100) // the kernel gives percent
	}
	if s.HasCgroupPSI {
		m.cgroupPSI.Set(s.CgroupPSI.SomeAvg10 / 100)
	}
	m.load1.Set(s.Load.Load1)
}
