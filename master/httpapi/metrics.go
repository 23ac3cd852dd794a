package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the API's series, named stormdock_master_* like the rest of the master's.
type metrics struct {
	authFailures *prometheus.CounterVec // by reason: missing, invalid, limited
	logStreams   prometheus.Gauge
	// requests is how long the API took to answer, by route pattern: the master's side of
	// a client's latency, apart from the client's machine and the network. Blocking
	// queries (?index=) wait on purpose and are left out.
	requests *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns, sub = "stormdock", "master"
	m := &metrics{
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "api_auth_failures_total",
			Help: "API requests refused for their token: missing, invalid, or limited (too many failures from the address)."}, []string{"reason"}),
		logStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "log_streams",
			Help: "Worker logs this master is relaying from agents now."}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "api_request_duration_seconds",
			Help:    "Time the API took to answer a request, by route; blocking queries (?index=) left out.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 1.5, 26)}, []string{"route"}),
	}
	for _, r := range []string{"missing", "invalid", "limited"} {
		m.authFailures.WithLabelValues(r)
	}
	if reg != nil {
		m.authFailures = register(reg, m.authFailures)
		m.logStreams = register(reg, m.logStreams)
		m.requests = register(reg, m.requests)
	}
	return m
}

// timed observes how long h takes to answer requests of route pattern, blocking queries
// excepted.
func (a *API) timed(pattern string, h http.HandlerFunc) http.HandlerFunc {
	o := a.metrics.requests.WithLabelValues(pattern)
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("index") {
			h(w, r)
			return
		}
		start := time.Now()
		h(w, r)
		o.Observe(time.Since(start).Seconds())
	}
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
