package multidc

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's own instruments; the per-link figures live in the orderer and
// are read at scrape time by the collector below, which keeps the ingest path free of
// metric updates.
type metrics struct {
	failovers  *prometheus.CounterVec
	spurious   prometheus.Counter
	latency    prometheus.Histogram
	sinkErrors prometheus.Counter
	// authFailures counts refused requests by reason: missing, invalid, limited.
	authFailures *prometheus.CounterVec
}

func newMetrics(r *Router, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stormdock_router_failovers_total", Help: "Switches of the active link, by reason (heartbeat, manual).",
		}, []string{"reason"}),
		spurious: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stormdock_router_spurious_failovers_total",
			Help: "Heartbeat failovers whose link was alive again within two heartbeat timeouts: its workers were late, not gone.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "stormdock_router_delivery_latency_seconds",
			Help:    "Time from a record's arrival at the router to its write to the sink.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		sinkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "stormdock_router_sink_errors_total", Help: "Failed sink writes (each is retried).",
		}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "stormdock_router_auth_failures_total", Help: "Requests refused for their sender token: missing, invalid, or limited (too many failures from the address).",
		}, []string{"reason"}),
	}
	for _, reason := range []string{ReasonHeartbeat, ReasonManual} {
		m.failovers.WithLabelValues(reason)
	}
	for _, reason := range []string{"missing", "invalid", "limited"} {
		m.authFailures.WithLabelValues(reason)
	}
	if reg == nil {
		return m, nil
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"job": r.cfg.Job}, reg)
	for _, c := range []prometheus.Collector{m.failovers, m.spurious, m.latency, m.sinkErrors, m.authFailures, &linkCollector{r: r}} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("multidc: register metrics: %w", err)
		}
	}
	return m, nil
}

var (
	descReceived = prometheus.NewDesc("stormdock_router_records_received_total",
		"Records received per link, duplicates included, rejected ones not.", []string{"link"}, nil)
	descDelivered = prometheus.NewDesc("stormdock_router_records_delivered_total",
		"Records delivered to the sink per link they came from.", []string{"link"}, nil)
	descDuplicates = prometheus.NewDesc("stormdock_router_duplicates_dropped_total",
		"Records dropped because their offset was delivered or already held.", []string{"link"}, nil)
	descRejected = prometheus.NewDesc("stormdock_router_records_rejected_total",
		"Records refused with 429 because the link's buffer was full.", []string{"link"}, nil)
	descBuffered = prometheus.NewDesc("stormdock_router_buffered_records",
		"Records held for the link, not yet delivered.", []string{"link"}, nil)
	descBufferedBytes = prometheus.NewDesc("stormdock_router_buffered_bytes",
		"Payload bytes held for the link.", []string{"link"}, nil)
	descActive = prometheus.NewDesc("stormdock_router_link_active",
		"1 for the active link.", []string{"link"}, nil)
	descProduced = prometheus.NewDesc("stormdock_router_link_last_produced_offset",
		"Highest offset up to which the link sent every record.", []string{"link"}, nil)
	descDeliveredOffset = prometheus.NewDesc("stormdock_router_delivered_offset",
		"Last offset delivered to the sink.", nil, nil)
	descCheckpoint = prometheus.NewDesc("stormdock_router_checkpoint_offset",
		"Last delivered offset saved in the store.", nil, nil)
	descLag = prometheus.NewDesc("stormdock_router_link_lag",
		"Delivered offsets the link has not produced yet (0: in step with the sink).", []string{"link"}, nil)
	descAlive = prometheus.NewDesc("stormdock_router_link_alive",
		"1 while every worker of the link heartbeats in time.", []string{"link"}, nil)
	descBeatAge = prometheus.NewDesc("stormdock_router_link_heartbeat_age_seconds",
		"Age of the oldest last heartbeat among the link's workers (-1: one never sent any).", []string{"link"}, nil)
	descLeader = prometheus.NewDesc("stormdock_router_leader",
		"1 while this router leads its job's routers (it alone writes the sink), 0 while it stands by.", nil, nil)
)

type linkCollector struct{ r *Router }

func (c *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descDelivered, descDuplicates, descRejected,
		descBuffered, descBufferedBytes, descActive, descProduced, descDeliveredOffset, descCheckpoint,
		descLag, descAlive, descBeatAge, descLeader} {
		ch <- d
	}
}

func (c *linkCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ord == nil {
		ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, 1)
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(descDeliveredOffset, prometheus.GaugeValue, float64(r.ord.next-1))
	ch <- prometheus.MustNewConstMetric(descCheckpoint, prometheus.GaugeValue, float64(r.checkpoint))
	for _, l := range r.ord.links {
		active := 0.0
		if l == r.ord.active {
			active = 1
		}
		ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(l.received), l.name)
		ch <- prometheus.MustNewConstMetric(descDelivered, prometheus.CounterValue, float64(l.delivered), l.name)
		ch <- prometheus.MustNewConstMetric(descDuplicates, prometheus.CounterValue, float64(l.dropped), l.name)
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(l.rejected), l.name)
		ch <- prometheus.MustNewConstMetric(descBuffered, prometheus.GaugeValue, float64(len(l.pending)), l.name)
		ch <- prometheus.MustNewConstMetric(descBufferedBytes, prometheus.GaugeValue, float64(l.bytes), l.name)
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, active, l.name)
		ch <- prometheus.MustNewConstMetric(descProduced, prometheus.GaugeValue, float64(l.mark), l.name)
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(max(0, (r.ord.next-1)-l.mark)), l.name)
		alive, age := 0.0, -1.0
		if r.live.alive(l.name, now) {
			alive = 1
		}
		if t, ok := r.live.oldest(l.name, now); ok {
			age = now.Sub(t).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(descAlive, prometheus.GaugeValue, alive, l.name)
		ch <- prometheus.MustNewConstMetric(descBeatAge, prometheus.GaugeValue, age, l.name)
	}
}
