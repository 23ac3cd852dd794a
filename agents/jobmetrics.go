package agents

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/stormdock/stormdock/agents/scrape"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// Job metrics: every MetricsInterval the agent reads each running worker's Prometheus text
// from STORMDOCK_ADDR:STORMDOCK_METRICS_PORT (a worker may serve none), measures its cpu and
// memory, adds its restarts and OOM kills, and adds the node's workers up per job (package
// agents/scrape). The masters pull that answer over the signed endpoint the logs are served
// on (GET /v1/metrics?node=ID, binary, see api.MarshalNodeMetrics), and each worker's detail
// when asked (GET /v1/metrics/workers?node=ID&job=J, JSON). Nothing of it is written to the
// store: its writes stay with the cluster's changes, whatever the workers measure.

// scrapeRound starts a round unless one is under way (a node of slow workers skips rounds
// rather than pile them up).
func (r *run) scrapeRound() {
	if r.scraping {
		return
	}
	addr := r.a.cfg.Node.Addr
	if addr == "" {
		addr = "127.0.0.1" // a worker given no address listens on every one
	}
	var targets []scrape.Target
	var usage []func(context.Context) (time.Duration, uint64, bool)
	for _, s := range r.workers {
		if s.state != cluster.WorkerRunning || s.assign.System {
			continue
		}
		t := scrape.Target{ID: s.id, Seq: s.seq, Job: s.assign.Key.Job, Tenant: s.assign.Tenant, Link: s.assign.Key.Link,
			Worker: s.assign.Key.Worker, Restarts: s.restarts, OOMKills: s.oomKills}
		if s.metricsPort != 0 {
			t.URL = "http://" + net.JoinHostPort(addr, strconv.Itoa(s.metricsPort)) + "/metrics"
		}
		targets = append(targets, t)
		drv, id := r.a.drivers[s.mode], s.id
		usage = append(usage, func(ctx context.Context) (time.Duration, uint64, bool) {
			if drv == nil {
				return 0, 0, false
			}
			u, err := drv.Usage(ctx, id)
			return u.CPU, u.MemoryBytes, err == nil
		})
	}
	r.scraping = true
	sc, ctx, interval := r.a.scraper, r.ctx, r.a.cfg.MetricsInterval
	r.goOp(func() {
		defer r.post(func() { r.scraping = false })
		uctx, cancel := context.WithTimeout(ctx, interval)
		for i := range targets {
			targets[i].CPU, targets[i].Memory, targets[i].Measured = usage[i](uctx)
		}
		cancel()
		sc.Round(ctx, targets, interval)
	})
}

// metricsRoutes adds the masters' job metrics routes to the agent's signed endpoint.
func (a *Agent) metricsRoutes(mux *http.ServeMux, keys *agentKey) {
	mine := func(w http.ResponseWriter, r *http.Request) bool {
		if !a.signed(keys, w, r) {
			return false
		}
		// The node named in the signed query: a request meant for another node (its
		// address now this one's) is refused rather than answered with this node's jobs.
		if n := r.URL.Query().Get("node"); n != a.cfg.Node.ID {
			api.Errorf(w, api.ErrNotFound, fmt.Sprintf("this is node %s's agent, not node %q's", a.cfg.Node.ID, n))
			return false
		}
		if a.scraper == nil {
			api.Errorf(w, api.ErrNotFound, fmt.Sprintf("the agent of node %s runs without job metrics (--metrics-interval is off)", a.cfg.Node.ID))
			return false
		}
		return true
	}
	mux.HandleFunc("GET /v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		if !mine(w, r) {
			return
		}
		_, b := a.scraper.Latest()
		if b == nil {
			b = api.MarshalNodeMetrics(api.NodeMetrics{Node: a.cfg.Node.ID, Interval: a.cfg.MetricsInterval})
		}
		w.Header().Set("Content-Type", api.NodeMetricsContentType)
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
	})
	mux.HandleFunc("GET /v1/metrics/workers", func(w http.ResponseWriter, r *http.Request) {
		if !mine(w, r) {
			return
		}
		job := r.URL.Query().Get("job")
		if err := cluster.CheckName(job); err != nil {
			api.Errorf(w, api.ErrBadInput, "job: "+err.Error())
			return
		}
		ws := a.scraper.Workers(job)
		if ws == nil {
			ws = []api.WorkerMetrics{}
		}
		api.WriteJSON(w, http.StatusOK, ws)
	})
}
