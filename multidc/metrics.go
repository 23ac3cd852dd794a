package multidc

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the router's own instruments; the per-link figures live in the orderer and
// are read at scrape time by the collector below, which keeps the ingest path free of
// metric updates.
type metrics struct {
	failovers  *prometheus.CounterVec
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
	if reg == nil {
		return m, nil
	}
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"job": r.cfg.Job}, reg)
	for _, c := range []prometheus.Collector{m.failovers, m.latency, m.sinkErrors, m.authFailures, &linkCollector{r: r}} {
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
)

type linkCollector struct{ r *Router }

func (c *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descDelivered, descDuplicates, descRejected,
		descBuffered, descBufferedBytes, descActive, descProduced, descDeliveredOffset, descCheckpoint} {
		ch <- d
	}
}

func (c *linkCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ord == nil {
		return
	}
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
	}
}
