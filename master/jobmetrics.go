package master

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// Every master, leader or not, collects the jobs' metrics from the agents (package
// master/jobmetrics): its API answers from its own history, and a standby that comes to
// lead has the last hour to act on at once. Only the leader acts (autoscale.go).

// metricsSource is the master's view as the collector needs it: the nodes it can reach
// and the running jobs.
type metricsSource struct{ m *Master }

func (s metricsSource) Nodes() []cluster.NodeRecord {
	nodes := s.m.nodes.decodedSnapshot()
	out := make([]cluster.NodeRecord, 0, len(nodes))
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		rec, ok := nodes[id].v.(cluster.NodeRecord)
		// An agent without an endpoint (--logs-listen off, or older) has nothing to give.
		if ok && rec.Logs != nil && rec.Node.Addr != "" {
			out = append(out, rec)
		}
	}
	return out
}

func (s metricsSource) Jobs() map[string]jobmetrics.Job {
	jobs := s.m.CurrentJobs()
	out := make(map[string]jobmetrics.Job, len(jobs))
	for name, j := range jobs {
		rec := j.Record()
		if rec.State != cluster.JobRunning {
			continue
		}
		out[name] = jobmetrics.Job{Tenant: rec.Spec.Tenant, Submitted: rec.Submitted, Workers: rec.Spec.TotalWorkers()}
	}
	return out
}

// JobMetrics is this master's collection of the jobs' metrics and their history.
func (m *Master) JobMetrics() *jobmetrics.Collector { return m.collector }

// collect runs the collection until ctx is done.
func (m *Master) collect(ctx context.Context) { m.collector.Run(ctx) }

// CheckScaling refuses a scaling policy this master cannot evaluate: job metrics off, or a
// stabilization window longer than the history it keeps.
func (m *Master) CheckScaling(spec *cluster.JobSpec) error {
	p := spec.Scaling
	if p == nil {
		return nil
	}
	c := m.collector
	if c.Interval() < 0 {
		return fmt.Errorf("%w: scaling: the masters run with job metrics off (--metrics-interval 0): nothing could evaluate the policy", api.ErrBadInput)
	}
	if w := c.History().Window(); p.Window() > w {
		return fmt.Errorf("%w: scaling.stabilization: %s is longer than the %s of history the masters keep (--metrics-window)", api.ErrBadInput, p.Window(), w)
	}
	return nil
}
