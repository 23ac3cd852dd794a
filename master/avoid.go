package master

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/placement"
)

// Avoidance periods (Config.AvoidPeriod, AvoidMax): a node where a job's workers crash-looped
// takes them again after DefaultAvoidPeriod, twice that after a second crash loop there, and
// so on up to DefaultAvoidMax. A crash loop caused by the node (a bad disk, a missing
// library) keeps it avoided most of the time at a cost of one crash loop an hour; one caused
// by a fault since healed costs the node five minutes, not an operator's page.
const (
	DefaultAvoidPeriod = 5 * time.Minute
	DefaultAvoidMax    = time.Hour
)

// avoidFor is how long the strikes-th crash loop of a job on one node keeps it off the node.
func (c *Config) avoidFor(strikes int) time.Duration {
	d := c.AvoidPeriod
	for i := 1; i < strikes && d < c.AvoidMax; i++ {
		d *= 2
	}
	return min(d, c.AvoidMax)
}

// strike notes a crash loop of job on the node's settings at now: the node avoids the job
// for a period that doubles with the strikes (see avoidFor).
func (c *Config) strike(nc *cluster.NodeConf, job string, now time.Time) {
	prev, _ := nc.Avoidance(job)
	a := cluster.Avoidance{Job: job, Strikes: prev.Strikes + 1, Since: now.UTC().Truncate(time.Millisecond)}
	a.Until = now.Add(c.avoidFor(a.Strikes)).UTC().Truncate(time.Millisecond)
	nc.Avoided = slices.DeleteFunc(slices.Clone(nc.Avoided), func(e cluster.Avoidance) bool { return e.Job == job })
	nc.Avoided = append(nc.Avoided, a)
	if !slices.Contains(nc.Avoid, job) {
		nc.Avoid = append(slices.Clone(nc.Avoid), job)
	}
}

// heal updates a node's settings for time passing: a job in Avoid without an entry (written
// by a master of an earlier version) gets one with a first strike; one whose avoidance ran
// out leaves Avoid (healed lists those); an entry that ran out more than AvoidMax ago is
// forgotten, strikes and all. It returns the settings unchanged (the same slices) when
// nothing changed.
func (c *Config) heal(nc cluster.NodeConf, now time.Time) (out cluster.NodeConf, healed []string, changed bool) {
	out = nc
	for _, job := range nc.Avoid {
		a, ok := nc.Avoidance(job)
		switch {
		case !ok:
			if !changed {
				out.Avoid, out.Avoided, changed = slices.Clone(nc.Avoid), slices.Clone(nc.Avoided), true
			}
			out.Avoided = append(out.Avoided, cluster.Avoidance{Job: job, Strikes: 1,
				Until: now.Add(c.avoidFor(1)).UTC().Truncate(time.Millisecond)})
		case !now.Before(a.Until):
			if !changed {
				out.Avoid, out.Avoided, changed = slices.Clone(nc.Avoid), slices.Clone(nc.Avoided), true
			}
			out.Avoid = slices.DeleteFunc(out.Avoid, func(j string) bool { return j == job })
			healed = append(healed, job)
		}
	}
	for _, a := range nc.Avoided {
		if !slices.Contains(out.Avoid, a.Job) && now.After(a.Until.Add(c.AvoidMax)) {
			if !changed {
				out.Avoid, out.Avoided, changed = slices.Clone(nc.Avoid), slices.Clone(nc.Avoided), true
			}
			out.Avoided = slices.DeleteFunc(out.Avoided, func(e cluster.Avoidance) bool { return e.Job == a.Job })
		}
	}
	return out, healed, changed
}

// healAvoidance ends the avoidances that ran out (see heal) and arms a reconcile for the
// next one to run out.
func (r *reconciler) healAvoidance(ctx context.Context, v *View) error {
	now := time.Now()
	var next time.Time
	for _, node := range slices.Sorted(maps.Keys(v.confs)) {
		nc, healed, changed := r.m.cfg.heal(v.confs[node], now)
		if changed {
			err := desired.UpdateNodeConf(ctx, r.kv, node, func(c *cluster.NodeConf) {
				*c, _, _ = r.m.cfg.heal(*c, now)
			})
			r.m.metrics.storeWrites.Inc()
			if err != nil {
				return err
			}
			v.confs[node] = nc
		}
		for _, job := range healed {
			a, _ := nc.Avoidance(job)
			r.m.log.Info("node avoided for a job's crash loops takes its workers again", "node", node, "job", job, "strikes", a.Strikes)
			r.m.events.Emit(nodeAvoidEvent(v, node, job, fmt.Sprintf(
				"node %s takes job %s's workers again: its avoidance after %d crash loop(s) ran out (a new crash loop there doubles it)",
				node, job, a.Strikes)))
		}
		for _, job := range nc.Avoid {
			if a, ok := nc.Avoidance(job); ok && (next.IsZero() || a.Until.Before(next)) {
				next = a.Until
			}
		}
	}
	r.armAvoidWake(next)
	return nil
}

func nodeAvoidEvent(v *View, node, job, reason string) api.Event {
	e := api.Event{Kind: api.EventNodeAvoidEnded, Object: "node/" + node, Node: node, Job: job,
		Tenant: tenantOf(v.jobs, job), Reason: reason}
	if rec, ok := v.nodes[node]; ok {
		e.DC = rec.Node.DC
	}
	return e
}

// armAvoidWake makes the leader reconcile just after t (none when zero).
func (r *reconciler) armAvoidWake(t time.Time) {
	if t.Equal(r.avoidWakeAt) {
		return
	}
	if r.avoidWake != nil {
		r.avoidWake.Stop()
		r.avoidWake = nil
	}
	r.avoidWakeAt = t
	if t.IsZero() {
		return
	}
	r.avoidWake = time.AfterFunc(max(time.Until(t), 0)+50*time.Millisecond, r.m.poke)
}

// noteCrashLoops records on a node the jobs whose workers keep crashing there, so that
// placement moves them elsewhere for a while (see avoidFor); the note shows in `stormdock
// node list` and `job status`, and goes with `stormdock node undrain`. Only the workers'
// own failures count (cluster.ExitCounts): a worker stopped for a lapsed lease, or by its
// agent, restarts no crash loop.
func (r *reconciler) noteCrashLoops(ctx context.Context, v *View) error {
	now := time.Now()
	for _, node := range slices.Sorted(maps.Keys(v.nodes)) {
		for _, w := range v.nodes[node].Workers {
			if w.RecentRestarts < r.m.cfg.CrashLoopRestarts || v.confs[node].Avoiding(w.Key.Job, now) {
				continue
			}
			if j, ok := v.jobs[w.Key.Job]; !ok || judgedByRollout(j.rec, w) {
				continue
			}
			job := w.Key.Job
			var after cluster.NodeConf
			err := desired.UpdateNodeConf(ctx, r.kv, node, func(c *cluster.NodeConf) {
				if !c.Avoiding(job, now) {
					r.m.cfg.strike(c, job, now)
				}
				after = *c
			})
			r.m.metrics.storeWrites.Inc()
			if err != nil {
				return err
			}
			v.confs[node] = after
			a, _ := after.Avoidance(job)
			r.m.log.Warn("worker crash-looping; moving the job's workers off the node", "node", node, "worker", w.Key.String(),
				"restarts", w.RecentRestarts, "lastExit", w.LastExit, "until", a.Until, "strikes", a.Strikes)
			r.m.events.Emit(workerEvent(v, api.EventWorkerCrashLoop, w.Key, node, fmt.Sprintf(
				"%d restarts within the crash-loop window, last: %s; job %s's workers move off node %s until %s (crash loop %d there)",
				w.RecentRestarts, w.LastExit, job, node, a.Until.Format(time.RFC3339), a.Strikes)))
		}
	}
	return nil
}

// planAvoiding plans with in.Avoid, and, when workers of jobs that some nodes avoid are left
// unplaced, plans again with those jobs' avoidance lifted: a worker on a node where it
// crash-looped may run; an unplaced one surely does not.
func planAvoiding(in placement.Input, plan func(placement.Input) (*placement.Result, map[cluster.WorkerKey]string, error)) (*placement.Result, map[cluster.WorkerKey]string, error) {
	res, held, err := plan(in)
	if err != nil || len(in.Avoid) == 0 {
		return res, held, err
	}
	var lift []string
	for _, u := range res.Unplaced {
		if len(in.Avoid[u.Job]) > 0 && !slices.Contains(lift, u.Job) {
			lift = append(lift, u.Job)
		}
	}
	if len(lift) == 0 {
		return res, held, nil
	}
	in.Avoid = maps.Clone(in.Avoid)
	for _, job := range lift {
		delete(in.Avoid, job)
	}
	return plan(in)
}
