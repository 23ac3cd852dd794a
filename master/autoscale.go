package master

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master/autoscale"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// Job autoscaling: after every collection round the leader evaluates each job that has a
// scaling: block (package master/autoscale decides) and scales it through desired's
// AutoscaleJob, the path `job scale` takes (quota, a new epoch of the live configuration,
// no restart of the workers that stay), with the term's fence. Every change and every
// refusal is an event with its numbers; a refusal or hold is reported when its cause
// changes, not every round. The policy's state (paused, last change) is in the job record:
// a new leader continues from it, with its own history (every master collects).

// autoscaler is one term's evaluation loop.
type autoscaler struct {
	m  *Master
	kv coord.KV
	// capacity is each job's learned per-worker throughput; reported the class of the
	// last refusal or hold reported, by job (cleared by a change: a cause is reported once
	// until the count moves); pending how many rounds in a row a transient hold lasted.
	capacity map[string]float64
	reported map[string]string
	pending  map[string]int
}

// transientRounds is how many rounds in a row a hold that follows every change (workers
// starting, new workers not reporting yet) lasts before it is reported: one that goes on
// is news (a worker that never serves the metric), one that ends at once is not.
const transientRounds = 3

// autoscale evaluates the jobs' policies after every round until ctx is done.
func (m *Master) autoscale(ctx context.Context, kv coord.KV) {
	c := m.collector
	if c.Interval() < 0 {
		return
	}
	a := &autoscaler{m: m, kv: kv, capacity: map[string]float64{}, reported: map[string]string{}, pending: map[string]int{}}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.WaitRound():
		}
		a.evaluate(ctx, time.Now())
	}
}

func (a *autoscaler) evaluate(ctx context.Context, now time.Time) {
	m := a.m
	h := m.collector.History()
	jobs := m.CurrentJobs()
	var st *Snapshot
	for _, name := range slices.Sorted(maps.Keys(jobs)) {
		j := jobs[name]
		rec := j.Record()
		if rec.Spec.Scaling == nil || rec.State != cluster.JobRunning || rec.Autoscale != nil && rec.Autoscale.Paused {
			delete(a.reported, name)
			continue
		}
		if st == nil {
			st = m.Snapshot()
		}
		p := *rec.Spec.Scaling
		rounds := int(p.Window()/h.Step()) + 1
		rounds = max(min(rounds, int(h.Window()/h.Step())), 2)
		metric, _, _ := h.Series(name, p.Metric, rounds)
		tp, _, _ := h.Series(name, api.SeriesThroughput, rounds)
		sum := st.Summary(j)
		in := autoscale.Input{Now: now, Policy: p, Workers: rec.Spec.Workers, Links: max(len(rec.Spec.Links), 1),
			Running: sum.Running, Unplaced: sum.Unplaced, Settled: sum.Running+sum.Unplaced == sum.Workers && sum.Stopping == 0,
			Rolling: rec.Rollout.Active(), Step: h.Step(), Metric: series(metric), Throughput: series(tp), Capacity: a.capacity[name]}
		if rec.Autoscale != nil && rec.Autoscale.Last != nil {
			in.Last = rec.Autoscale.Last.At
		}
		d := autoscale.Evaluate(in)
		a.capacity[name] = d.Capacity
		ev := api.Event{Object: "job/" + name, Job: name, Tenant: rec.Spec.Tenant, Time: now}
		if d.Kind == autoscale.Hold && autoscale.Transient(d.Class) {
			if a.pending[name]++; a.pending[name] < transientRounds {
				continue
			}
		} else {
			delete(a.pending, name)
		}
		switch d.Kind {
		case autoscale.Hold, autoscale.Refuse:
			if a.reported[name] == d.Class {
				continue
			}
			a.reported[name] = d.Class
			ev.Kind, ev.Reason = api.EventJobAutoscaleHeld, d.Reason
			if d.Kind == autoscale.Refuse {
				ev.Kind = api.EventJobAutoscaleRefused
			}
			m.events.Emit(ev)
			m.log.Info("autoscaling: nothing changed", "job", name, "kind", d.Kind, "reason", d.Reason)
		case autoscale.Scale:
			a.scale(ctx, rec, d, ev)
		}
	}
	for name := range a.capacity {
		if _, ok := jobs[name]; !ok {
			delete(a.capacity, name)
			delete(a.reported, name)
			delete(a.pending, name)
		}
	}
}

// scale applies a decision to change the count.
func (a *autoscaler) scale(ctx context.Context, rec cluster.JobRecord, d autoscale.Decision, ev api.Event) {
	name, p := rec.Spec.Name, rec.Spec.Scaling
	dec := cluster.ScalingDecision{At: ev.Time.UTC(), From: rec.Spec.Workers, To: d.To, Metric: p.Metric, Value: d.Value, Target: p.Target, Reason: d.Reason}
	_, err := desired.AutoscaleJob(ctx, a.kv, name, dec)
	switch {
	case err == nil:
		delete(a.reported, name)
		ev.Kind, ev.Reason = api.EventJobAutoscaled, d.Reason
		a.m.events.Emit(ev)
		a.m.log.Info("autoscaled", "job", name, "from", dec.From, "to", dec.To, "metric", p.Metric, "per_worker", d.Value, "target", p.Target)
		a.m.poke()
	case errors.Is(err, desired.ErrPolicyChanged) || ctx.Err() != nil:
		// Paused, changed or deposed meanwhile: the next round decides from the record.
	case errors.Is(err, api.ErrQuota):
		class := fmt.Sprintf("quota:%d", d.To)
		if a.reported[name] != class {
			a.reported[name] = class
			ev.Kind, ev.Reason = api.EventJobAutoscaleRefused, fmt.Sprintf("%s; refused: %v", d.Reason, err)
			a.m.events.Emit(ev)
		}
	default:
		a.m.log.Warn("autoscaling: scale failed; the next round tries again", "job", name, "to", d.To, "err", err)
	}
}

func series(v jobmetrics.Values) autoscale.Series { return autoscale.Series{Sum: v.Sum, N: v.N} }
