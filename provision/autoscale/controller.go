package autoscale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/provision"
)

// Controller keeps one cluster within its policy, as the Nomad Autoscaler's agent does: it
// looks at the cluster through its master's API (nodes, unplaced workers and why) and
// changes it through its provider (`cluster scale`'s path: a removed node is drained through
// the master first, so that its workers run elsewhere before it goes). Every change and every
// refusal is recorded in the cluster's events (kind cluster.*), a refusal once per cause.
type Controller struct {
	Name     string
	Policy   Policy
	Provider provision.Provider
	// Client is the cluster's admin client (events are the admin's to record).
	Client *api.Client
	Logger *slog.Logger
	// Decided, when set, hears every change and refusal (the CLI prints them).
	Decided func(Decision)

	state    State
	reported string
}

// Run looks at the cluster every interval until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	p := c.Policy.WithDefaults()
	t := time.NewTicker(p.Interval.Std())
	defer t.Stop()
	for {
		if _, err := c.Step(ctx); err != nil && ctx.Err() == nil {
			c.log().Warn("cluster autoscaling: look failed; trying again", "cluster", c.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (c *Controller) log() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// Step looks once and acts on what it decides.
func (c *Controller) Step(ctx context.Context) (Decision, error) {
	obs, err := c.observe(ctx, false)
	if err != nil {
		return Decision{}, err
	}
	d := Decide(c.Policy, &c.state, obs)
	if d.Kind == Remove && len(d.Remove) > 0 && obs.Nodes[len(obs.Nodes)-1].Jobs == nil {
		// A removal is checked against the jobs' spread: look again with every job's
		// workers (what a look costs only when nodes could go).
		if obs, err = c.observe(ctx, true); err != nil {
			return Decision{}, err
		}
		d = Decide(c.Policy, &c.state, obs)
	}
	switch d.Kind {
	case Steady:
		return d, nil
	case Refuse:
		if c.reported == d.Class {
			return d, nil
		}
		c.reported = d.Class
		c.record(ctx, d)
		return d, nil
	}
	c.reported = ""
	c.log().Info("cluster autoscaling", "cluster", c.Name, "from", d.From, "to", d.To, "reason", d.Reason)
	c.record(ctx, d)
	if _, err := c.Provider.Scale(ctx, c.Name, d.To); err != nil {
		c.state.Last = time.Now()
		failed := d
		failed.Kind, failed.Class = Refuse, "failed"
		failed.Reason = fmt.Sprintf("%s: the provider failed: %v", d.Reason, err)
		c.record(ctx, failed)
		return failed, fmt.Errorf("scale cluster %s to %d: %w", c.Name, d.To, err)
	}
	c.state.Last = time.Now()
	return d, nil
}

// record puts the decision in the cluster's events and tells Decided.
func (c *Controller) record(ctx context.Context, d Decision) {
	if c.Decided != nil {
		c.Decided(d)
	}
	if err := c.Client.RecordEvent(ctx, d.event(c.Name)); err != nil {
		c.log().Warn("cluster autoscaling: record the event", "cluster", c.Name, "err", err)
	}
}

// observe reads the cluster: its agents from the provider, their nodes and the unplaced
// workers from the master; with jobs, which jobs each node runs and how they spread.
func (c *Controller) observe(ctx context.Context, withJobs bool) (Observation, error) {
	cl, err := c.Provider.Status(ctx, c.Name)
	if err != nil {
		return Observation{}, err
	}
	views, err := c.Client.Nodes(ctx)
	if err != nil {
		return Observation{}, fmt.Errorf("list nodes: %w", err)
	}
	byID := map[string]api.NodeView{}
	for _, v := range views {
		byID[v.ID] = v
	}
	obs := Observation{Now: time.Now(), SlotsPerNode: cl.Spec.Slots}
	index := map[string]int{}
	for _, a := range cl.Agents {
		n := Node{ID: a.Node, DC: a.DC, Rack: a.Rack}
		if v, ok := byID[a.Node]; ok && a.Node != "" {
			n.DC, n.Rack, n.Slots, n.Used = v.DC, v.Rack, v.Slots, v.SlotsUsed
			n.Schedulable = !v.Draining && v.Health != cluster.HealthUnhealthy
		}
		index[n.ID] = len(obs.Nodes)
		obs.Nodes = append(obs.Nodes, n)
	}
	jobs, err := c.Client.Jobs(ctx)
	if err != nil {
		return obs, fmt.Errorf("list jobs: %w", err)
	}
	assigned := make([]int, len(obs.Nodes))
	for _, j := range jobs {
		if j.Unplaced == 0 && !withJobs {
			continue
		}
		st, err := c.Client.Job(ctx, j.Name)
		if errors.Is(err, api.ErrNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			return obs, fmt.Errorf("job %s: %w", j.Name, err)
		}
		for _, w := range st.Workers {
			if w.State == api.WorkerUnplaced {
				obs.Unplaced++
				if ForRoom(w.Reason) {
					obs.WaitingForRoom++
				}
				continue
			}
			if i, ok := index[w.Node]; ok && withJobs {
				n := &obs.Nodes[i]
				if n.Jobs == nil {
					n.Jobs = map[string][]string{}
				}
				n.Jobs[j.Name] = st.Job.Spec.Placement.Spread
				assigned[i]++
			}
		}
	}
	if withJobs {
		for i := range obs.Nodes {
			if obs.Nodes[i].Jobs == nil {
				obs.Nodes[i].Jobs = map[string][]string{}
			}
			// The nodes were read before the jobs: workers placed on a node meanwhile (a node
			// just added for them, its slots still empty in the first read) make it busy.
			obs.Nodes[i].Used = max(obs.Nodes[i].Used, assigned[i])
		}
	}
	return obs, nil
}
