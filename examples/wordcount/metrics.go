package wordcount

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The worker's own metrics, as the worker contract has it: served as Prometheus text on
// STORMDOCK_ADDR:STORMDOCK_METRICS_PORT when the agent gives a port, read by the agent,
// added up per job by the masters, and what a `scaling:` block can act on.
//
//	lines_processed_total  counter  records emitted (its rate is the job's throughput)
//	input_backlog          gauge    this worker's lines the input holds beyond its position

// Metrics are the word count's series.
type Metrics struct {
	Processed prometheus.Counter
	Backlog   prometheus.Gauge
}

// NewMetrics makes the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Processed: prometheus.NewCounter(prometheus.CounterOpts{Name: "lines_processed_total",
			Help: "Input lines this worker counted and emitted."}),
		Backlog: prometheus.NewGauge(prometheus.GaugeOpts{Name: "input_backlog",
			Help: "Lines of this worker's share that the input holds beyond what it emitted."}),
	}
	for _, c := range []prometheus.Collector{m.Processed, m.Backlog} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("wordcount: metrics: %w", err)
		}
	}
	return m, nil
}

// ServeMetrics serves reg's series at http://ADDR/metrics until ctx is done. addr is
// STORMDOCK_ADDR and STORMDOCK_METRICS_PORT joined.
func ServeMetrics(ctx context.Context, addr string, reg prometheus.Gatherer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("wordcount: metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "wordcount: metrics server:", err)
		}
	}()
	return nil
}

// progress keeps input_backlog: how many offsets of this worker's share lie between its
// position and the input's end. It counts the input's lines on its own handle, reading
// only what was appended since its last look, at most every backlogEvery.
type progress struct {
	m    *Metrics
	path string // "" for the embedded sample

	mu    sync.Mutex
	f     *os.File
	pos   int64 // bytes counted
	lines int64 // complete lines in the first pos bytes
	next  time.Time
}

const backlogEvery = 250 * time.Millisecond

func newProgress(m *Metrics, path string) *progress {
	return &progress{m: m, path: path}
}

// done records one emitted record.
func (p *progress) done() {
	if p != nil && p.m != nil {
		p.m.Processed.Inc()
	}
}

// at reports that the next offset the worker reads is offset, of a share of offsets o with
// o % workers == worker from resume on; force looks at the input now.
func (p *progress) at(offset, resume int64, worker, workers int, force bool) {
	if p == nil || p.m == nil {
		return
	}
	now := time.Now()
	if !force && now.Before(p.next) {
		return
	}
	p.next = now.Add(backlogEvery)
	total, err := p.total()
	if err != nil {
		return
	}
	p.m.Backlog.Set(float64(owned(max(offset, resume), total, worker, workers)))
}

// owned counts the offsets o in [from, to) with o % workers == worker.
func owned(from, to int64, worker, workers int) int64 {
	if workers < 1 || to <= from {
		return 0
	}
	below := func(x int64) int64 { // offsets of the share below x
		if x <= int64(worker) {
			return 0
		}
		return (x-int64(worker)-1)/int64(workers) + 1
	}
	return below(to) - below(from)
}

// total is the input's count of complete lines now.
func (p *progress) total() (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.path == "" {
		return int64(bytes.Count(sample, []byte{'\n'})) + 1, nil
	}
	if p.f == nil {
		f, err := os.Open(p.path)
		if err != nil {
			return 0, err
		}
		p.f = f
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := p.f.ReadAt(buf, p.pos)
		p.lines += int64(bytes.Count(buf[:n], []byte{'\n'}))
		p.pos += int64(n)
		if errors.Is(err, io.EOF) || n == 0 {
			return p.lines, nil
		}
		if err != nil {
			return p.lines, err
		}
	}
}

func (p *progress) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f != nil {
		p.f.Close()
	}
}
