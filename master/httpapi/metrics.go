package httpapi

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's series, named stormdock_master_* like the rest of the master's.
type metrics struct {
	authFailures *prometheus.CounterVec // by reason: missing, invalid, limited
	logStreams   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "stormdock", "master"
	m := &metrics{
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "api_auth_failures_total",
			Help: "API requests refused for their token: missing, invalid, or limited (too many failures from the address)."}, []string{"reason"}),
		logStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "log_streams",
			Help: "Worker logs this master is relaying from agents now."}),
	}
	for _, r := range []string{"missing", "invalid", "limited"} {
		m.authFailures.WithLabelValues(r)
	}
	if reg != nil {
		m.authFailures = register(reg, m.authFailures)
		m.logStreams = register(reg, m.logStreams)
	}
	return m
}

// register registers c, or returns the collector already registered under its name: an
// API may be built more than once on one registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
	}
	return c
}
