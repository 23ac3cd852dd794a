package master

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/multidc"
	"github.com/stormdock/stormdock/placement"
)

// What becomes an event, and who records it. The leader compares each view of the cluster
// with the one before (jobs, nodes and their health, data centers, what agents report of
// their workers) and records what changed, and records what it decides (placements, moves
// with the placement engine's reason, workers it cannot place). Its first view after it
// starts leading is the baseline: changes made while no master led are not recorded. Any
// master records the API calls that change something, with their principal (package
// master/httpapi, apiguard.go).
// Link failovers come from the routers' records (watchRouters).

// Emit records an event: it is appended to the store with the next batch and served by every
// master. Time defaults to now. It is the hook for what happens outside the leader's views,
// such as rollouts (kinds api.EventRolloutPrefix + "..."); Object, Kind and, for a job's
// event, Job and Tenant should be set so that filters and tenants find it.
func (m *Master) Emit(e api.Event) { m.events.Emit(e) }

// seen is what the leader's previous reconcile saw.
type seen struct {
	jobs  map[string]cluster.JobRecord
	nodes map[string]cluster.NodeRecord
	confs map[string]cluster.NodeConf
	dcs   map[string]string // effective state
	// lost holds nodes lost during this term, to tell a node back from a new one.
	lost     map[string]time.Time
	unplaced map[cluster.WorkerKey]string
}

type nodeKey struct {
	node string
	key  cluster.WorkerKey
}

func workerObject(k cluster.WorkerKey) string { return "worker/" + k.String() }

// workerEvent is an event about one worker on node.
func workerEvent(v *View, kind string, k cluster.WorkerKey, node, reason string) api.Event {
	w := k.Worker
	e := api.Event{Kind: kind, Object: workerObject(k), Reason: reason, Job: k.Job, Link: k.Link, Worker: &w,
		Tenant: tenantOf(v.jobs, k.Job), Node: node}
	if rec, ok := v.nodes[node]; ok {
		e.DC = rec.Node.DC
	}
	return e
}

// submitted is the event of j's submission.
func submitted(j cluster.JobRecord) api.Event {
	return api.Event{Object: "job/" + j.Spec.Name, Job: j.Spec.Name, Tenant: j.Spec.Tenant, Kind: api.EventJobSubmitted, Time: j.Submitted,
		Reason: fmt.Sprintf("%d workers for tenant %s, priority %d, %s isolation",
			j.Spec.TotalWorkers(), j.Spec.Tenant, j.Spec.Priority, j.Spec.IsolationMode())}
}

// observeEvents records what changed since the previous view. The first call of a term
// takes the baseline, and records only the jobs submitted since the term began: one
// submitted in the instant between the election and the first view was otherwise in the
// baseline, and its submission recorded by no master.
func (r *reconciler) observeEvents(v *View) {
	cur := &seen{jobs: map[string]cluster.JobRecord{}, nodes: v.nodes, confs: v.confs, dcs: map[string]string{}}
	for name, j := range v.jobs {
		cur.jobs[name] = j.rec
	}
	for dc := range v.dcs {
		cur.dcs[dc] = v.dcState(dc)
	}
	prev := r.seen
	emit := r.m.events.Emit
	if prev == nil {
		cur.lost, cur.unplaced = map[string]time.Time{}, map[cluster.WorkerKey]string{}
		r.seen = cur
		for _, name := range slices.Sorted(maps.Keys(cur.jobs)) {
			if j := cur.jobs[name]; j.Submitted.After(r.since) {
				emit(submitted(j))
			}
		}
		return
	}
	cur.lost, cur.unplaced = prev.lost, prev.unplaced
	r.seen = cur

	for _, name := range slices.Sorted(maps.Keys(cur.jobs)) {
		j, was := cur.jobs[name], prev.jobs[name]
		e := api.Event{Object: "job/" + name, Job: name, Tenant: j.Spec.Tenant}
		switch {
		case was.Spec.Name == "":
			e = submitted(j)
		case j.State == cluster.JobKilled && was.State != cluster.JobKilled:
			e.Kind, e.Reason, e.Time = api.EventJobKilled, fmt.Sprintf("its workers stop within %s", j.Spec.Grace()), j.Updated
		case j.Generation > was.Generation:
			e.Kind, e.Reason, e.Time = api.EventJobUpdated, fmt.Sprintf("generation %d replaces %d", j.Generation, was.Generation), j.Updated
		case j.Spec.TotalWorkers() != was.Spec.TotalWorkers():
			e.Kind, e.Reason, e.Time = api.EventJobScaled, fmt.Sprintf("from %d to %d workers", was.Spec.TotalWorkers(), j.Spec.TotalWorkers()), j.Updated
		default:
			continue
		}
		emit(e)
	}
	for _, name := range slices.Sorted(maps.Keys(prev.jobs)) {
		if _, ok := cur.jobs[name]; !ok {
			j := prev.jobs[name]
			emit(api.Event{Kind: api.EventJobRemoved, Object: "job/" + name, Job: name, Tenant: j.Spec.Tenant, Reason: "every worker stopped"})
		}
	}

	for _, id := range slices.Sorted(maps.Keys(cur.nodes)) {
		rec := cur.nodes[id]
		was, had := prev.nodes[id]
		e := api.Event{Object: "node/" + id, Node: id, DC: rec.Node.DC}
		if !had {
			e.Kind, e.Reason = api.EventNodeRegistered, fmt.Sprintf("%d slots, %s memory, %s cpu in %s/%s", rec.Node.Slots, rec.Node.Memory, rec.Node.CPU, rec.Node.DC, rec.Node.Rack)
			if at, ok := cur.lost[id]; ok {
				e.Kind, e.Reason = api.EventNodeBack, fmt.Sprintf("registered again %s after it was lost", time.Since(at).Round(time.Millisecond))
				delete(cur.lost, id)
			}
			emit(e)
			was.Health = cluster.NodeHealth{State: cluster.HealthHealthy}
		}
		if h, o := normHealth(rec.Health), normHealth(was.Health); h.State != o.State || h.Throttled != o.Throttled {
			e.Kind = map[string]string{cluster.HealthHealthy: api.EventNodeHealthy, cluster.HealthThrottled: api.EventNodeThrottled,
				cluster.HealthUnhealthy: api.EventNodeUnhealthy}[h.State]
			if e.Kind == "" {
				e.Kind = api.EventNodeUnhealthy
			}
			e.Reason = h.Reason
			if h.State == cluster.HealthThrottled {
				e.Reason = fmt.Sprintf("%d of %d slots withheld: %s", h.Throttled, rec.Node.Slots, h.Reason)
			}
			if h.State == cluster.HealthHealthy {
				e.Reason = "was " + o.State
			}
			emit(e)
		}
		if c, o := cur.confs[id], prev.confs[id]; c.Draining != o.Draining {
			e.Kind, e.Reason = api.EventNodeUndrained, "an operator let it take work again"
			if c.Draining {
				e.Kind, e.Reason = api.EventNodeDrained, "an operator drained it: its workers move elsewhere"
			}
			emit(e)
		}
	}
	inGrace, until := r.m.inGrace()
	for _, id := range slices.Sorted(maps.Keys(prev.nodes)) {
		if _, ok := cur.nodes[id]; ok {
			continue
		}
		rec := prev.nodes[id]
		reason := "its entry left the store: the session of its keeper ended (the machine is down or cut off, or the agent stayed away past its restart grace)"
		if inGrace {
			reason += fmt.Sprintf("; its workers wait for it until %s", until.UTC().Format(time.RFC3339))
		}
		emit(api.Event{Kind: api.EventNodeLost, Object: "node/" + id, Node: id, DC: rec.Node.DC, Reason: reason})
		cur.lost[id] = time.Now()
	}
	for _, dc := range slices.Sorted(maps.Keys(cur.dcs)) {
		st, was := cur.dcs[dc], prev.dcs[dc]
		if st == was || was == "" && st == cluster.DCActive {
			continue
		}
		e := api.Event{Object: "dc/" + dc, DC: dc}
		switch st {
		case cluster.DCLost:
			e.Kind, e.Reason = api.EventDCLost, "none of its nodes is alive: its workers move to the data centers their jobs allow"
		case cluster.DCFailed:
			e.Kind, e.Reason = api.EventDCFailed, "an operator failed it: its workers move out, nothing new goes in"
		default:
			e.Kind, e.Reason = api.EventDCRestored, "was "+was
		}
		emit(e)
	}

	for _, id := range slices.Sorted(maps.Keys(cur.nodes)) {
		r.nodeWorkerEvents(v, id, cur.nodes[id].Workers, prev.nodes[id].Workers)
	}
}

// nodeWorkerEvents records what changed of the workers one node reports, in key order. A
// record that was not decoded again since the previous view holds the same slice: nothing
// of it changed, and ten thousand nodes cost ten thousand comparisons, not a map of every
// worker.
func (r *reconciler) nodeWorkerEvents(v *View, node string, cur, prev []cluster.WorkerStatus) {
	if len(cur) == 0 || len(cur) == len(prev) && &cur[0] == &prev[0] {
		return
	}
	was := make(map[cluster.WorkerKey]*cluster.WorkerStatus, len(prev))
	for i := range prev {
		was[prev[i].Key] = &prev[i]
	}
	now := make(map[cluster.WorkerKey]*cluster.WorkerStatus, len(cur))
	for i := range cur {
		now[cur[i].Key] = &cur[i] // a key reported twice: the last copy, as the view has it
	}
	for _, k := range slices.SortedFunc(maps.Keys(now), cluster.WorkerKey.Compare) {
		var w cluster.WorkerStatus
		if p := was[k]; p != nil {
			w = *p
		}
		r.workerEvents(v, nodeKey{node, k}, *now[k], w)
	}
}

func normHealth(h cluster.NodeHealth) cluster.NodeHealth {
	if h.State == "" {
		h.State = cluster.HealthHealthy
	}
	return h
}

// workerEvents records what changed of one worker as its node reports it.
func (r *reconciler) workerEvents(v *View, nk nodeKey, w, was cluster.WorkerStatus) {
	emit := r.m.events.Emit
	ev := func(kind, reason string, at time.Time) {
		e := workerEvent(v, kind, nk.key, nk.node, reason)
		e.Time = at
		emit(e)
	}
	if n := w.Lapses - was.Lapses; n > 0 {
		// Stopped by its launcher for a lapsed lease (a store or network fault): said apart
		// from crashes, which it is not counted with.
		reason := "stopped: lease lapsed (not counted as a crash)"
		if n > 1 {
			reason = fmt.Sprintf("stopped %d times: lease lapsed (not counted as a crash)", n)
		}
		ev(api.EventWorkerExited, reason, time.Time{})
	}
	if n := w.Restarts - was.Restarts; n > 0 && w.LastExit != "" {
		// Restarts count the worker's own failures only (cluster.ExitCounts).
		reason := "crashed: " + w.LastExit
		if n > 1 {
			reason = fmt.Sprintf("crashed %d times; last: %s", n, w.LastExit)
		}
		at := w.Since
		if w.State == cluster.WorkerRunning {
			at = time.Time{} // the exit's time is gone: the worker runs again
		}
		ev(api.EventWorkerExited, reason, at)
	}
	if w.State == was.State {
		return
	}
	switch w.State {
	case cluster.WorkerRunning:
		if w.Restarts > 0 && (was.State == cluster.WorkerBackoff || w.Restarts > was.Restarts) {
			ev(api.EventWorkerRestarted, fmt.Sprintf("restart %d (%d within the crash-loop window) after: %s", w.Restarts, w.RecentRestarts, w.LastExit), w.Since)
		} else {
			ev(api.EventWorkerStarted, fmt.Sprintf("pid %d, generation %d", w.PID, w.Generation), w.Since)
		}
	case cluster.WorkerFailed:
		ev(api.EventWorkerFailed, w.LastExit, w.Since)
	case cluster.WorkerEvicted:
		reason := w.LastExit
		if rec, ok := v.nodes[nk.node]; ok && rec.Health.Reason != "" {
			reason += " (node: " + rec.Health.Reason + ")"
		}
		ev(api.EventWorkerEvicted, reason, w.Since)
	}
}

// planEvents records what the leader decided: before holds every worker's node as assigned
// before the plan was written, placements where they are assigned now (held ones included).
func (r *reconciler) planEvents(v *View, before map[cluster.WorkerKey]string, placements []cluster.Placement, res *placement.Result) {
	if r.seen == nil {
		return
	}
	emit := r.m.events.Emit
	moves := map[cluster.WorkerKey]placement.Move{}
	for _, mv := range res.Moves {
		moves[mv.Key()] = mv
	}
	unplaced := map[cluster.WorkerKey]bool{}
	for _, u := range res.Unplaced {
		unplaced[u.Key()] = true
	}
	kept := 0 // placements of workers in before: when all are, none was stopped
	for _, p := range placements {
		k := p.Key()
		old, had := before[k]
		if had {
			kept++
		}
		if len(r.seen.unplaced) > 0 && !unplaced[k] {
			delete(r.seen.unplaced, k)
		}
		switch {
		case old == p.Node:
		case old == "":
			rec := v.nodes[p.Node]
			emit(workerEvent(v, api.EventWorkerPlaced, k, p.Node, fmt.Sprintf("on %s (%s/%s)", p.Node, rec.Node.DC, rec.Node.Rack)))
		default:
			reason := moves[k].Reason
			if reason == "" {
				reason = r.moveReason(v, k, old)
			}
			e := workerEvent(v, api.EventWorkerMoved, k, old, reason)
			e.To = p.Node
			if rec, ok := v.nodes[p.Node]; ok {
				e.ToDC = rec.Node.DC
			}
			if e.DC == "" {
				e.DC = r.assign[old].a.DC
			}
			emit(e)
		}
	}
	for _, u := range res.Unplaced {
		k := u.Key()
		if r.seen.unplaced[k] == u.Reason {
			continue
		}
		r.seen.unplaced[k] = u.Reason
		reason := u.Reason
		if mv := moves[k].Reason; mv != "" {
			// Why it left its node (a preemption names the preempting job, its tenant and
			// both priorities), then why it fits nowhere else.
			reason = mv + "; " + u.Reason
		}
		emit(workerEvent(v, api.EventWorkerUnplaced, k, before[k], reason))
	}
	// The workers no longer placed, in key order: sorting every worker of the cluster on
	// each reconcile to find a rack's was a tenth of the leader's cpu.
	var gone []cluster.WorkerKey
	if kept < len(before) {
		placed := make(map[cluster.WorkerKey]bool, len(placements))
		for _, p := range placements {
			placed[p.Key()] = true
		}
		for k := range before {
			if !placed[k] && r.seen.unplaced[k] == "" {
				gone = append(gone, k)
			}
		}
	}
	slices.SortFunc(gone, cluster.WorkerKey.Compare)
	for _, k := range gone {
		rec, ok := v.record(k.Job)
		if !ok || rec.State != cluster.JobRunning {
			continue // its job was killed: job.killed says so
		}
		reason := moves[k].Reason
		if reason == "" {
			reason = "no longer wanted"
		}
		emit(workerEvent(v, api.EventWorkerStopped, k, before[k], reason))
	}
	for k := range r.seen.unplaced {
		if rec, ok := v.record(k.Job); !ok || rec.State != cluster.JobRunning || k.Worker >= rec.Spec.Workers {
			delete(r.seen.unplaced, k)
		}
	}
}

// moveReason says why a worker left old when the plan gave no move for it.
func (r *reconciler) moveReason(v *View, k cluster.WorkerKey, old string) string {
	if s, ok := v.statuses[k]; ok && s.node == old && s.status.State == cluster.WorkerEvicted {
		return "evicted from " + old + " under memory pressure"
	}
	if _, alive := v.nodes[old]; !alive {
		return "node " + old + " is lost"
	}
	return "moved off " + old
}

// watchRouters records the failovers of mirrored jobs' links as their routers record them,
// while this master leads. A router rewrites its record often (every checkpoint): only the
// leader watches them. A failover from before since (when this term began) is the last
// leader's to record. The line is drawn by time, not by the first listing: a failover made
// while the listing was still under way was taken for an old one and never recorded.
func (m *Master) watchRouters(ctx context.Context, since time.Time) {
	routers := newMirror(m.store, cluster.RoutersKey, func() {})
	var mu sync.Mutex // check runs from the mirror's watch goroutines
	last := map[string]time.Time{}
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		for job, e := range routers.snapshot() {
			if len(e.Value) == 0 {
				continue
			}
			var rec multidc.RouterRecord
			if json.Unmarshal(e.Value, &rec) != nil || rec.LastFailover == nil {
				continue
			}
			f := rec.LastFailover
			if !f.At.After(last[job]) || !f.At.After(since) {
				continue
			}
			last[job] = f.At
			m.events.Emit(api.Event{Kind: api.EventLinkFailover, Object: "link/" + job + "@" + f.To, Job: job, Link: f.To,
				Tenant: tenantOf(m.CurrentJobs(), job), DC: f.To, Time: f.At,
				Reason: fmt.Sprintf("from %s to %s (%s), delivering from offset %d", f.From, f.To, f.Reason, f.NextOffset)})
		}
	}
	routers.poke = func() {
		select {
		case <-ctx.Done():
		default:
			check()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := routers.run(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("watch routers failed; retrying", "err", err)
				_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			}
		}
	}()
	select {
	case <-routers.ready:
		check()
	case <-ctx.Done():
	}
	<-done
}
