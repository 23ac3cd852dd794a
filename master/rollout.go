package master

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master/desired"
)

// Rollouts: the leader replaces the workers of a job whose spec changed (job update,
// rollback, restart) a few at a time, as its rollout (cluster.Rollout, in the job record)
// says.
//
// Each worker's assignment carries the generation it runs. A worker whose run does not
// change with the new generation (cluster.WorkerAssignment SameRun) takes it at once, live;
// the others keep their assignment as it is (their old generation's run, with the live
// fields current) until the rollout admits them. Admitting a worker means writing its new
// assignment: its agent stops it with its grace, then starts it on the new generation (when
// its node changes, the new node gets it only once the old one no longer reports it:
// sequenceMoves). So no worker index ever runs twice, and the workers a rollout has down
// are those admitted and not yet running: admission stops while maxParallel of the job's
// workers are down or maxParallel replacements are not yet healthy. A replacement is
// healthy once it has run minHealthy without a restart; one not healthy within deadline,
// or crash-looping, fails the update (and with autoRevert, starts a rollout back).
//
// What the rollout record holds is what the assignments cannot tell: the state, the batch,
// the canaries and the workers in flight with the time each was admitted. It is written
// before the assignments that admit workers, so a leader that dies between the two leaves a
// record its successor finishes, and never a replacement it does not know about.

// rolloutCrashRestarts is how many restarts of a replaced worker before it is healthy mark
// it crash-looping: the update fails at once rather than at its deadline.
const rolloutCrashRestarts = 3

// rolloutPlan is what one reconcile decided about rollouts.
type rolloutPlan struct {
	cur     map[cluster.WorkerKey]assigned // where each worker is assigned now, and as what
	jobs    map[string]*jobRollout         // jobs whose rollout holds workers
	prepull map[string][]string            // images each node pulls ahead
	// prepullTenant is the tenant whose credentials pull each pre-pulled image.
	prepullTenant map[string]string
	wake          time.Time // when a rollout needs a reconcile by time alone
}

// assigned is a worker's current assignment and node.
type assigned struct {
	node string
	wa   *cluster.WorkerAssignment // into the reconciler's assignments, never changed in place
}

// jobRollout is one job's rollout after this reconcile: which workers may take its target.
type jobRollout struct {
	ro       cluster.Rollout
	admitted map[cluster.WorkerKey]bool
}

// assignedWorkers indexes the current assignments by worker (a worker assigned on a lost
// node and again on a live one counts where it is live).
func (r *reconciler) assignedWorkers(v *View) map[cluster.WorkerKey]assigned {
	out := map[cluster.WorkerKey]assigned{}
	for _, node := range slices.Sorted(maps.Keys(r.assign)) {
		ws := r.assign[node].a.Workers
		for i := range ws {
			w := &ws[i]
			if w.Stop {
				continue
			}
			if old, ok := out[w.Key]; ok {
				if _, alive := v.nodes[old.node]; alive {
					continue
				}
			}
			out[w.Key] = assigned{node: node, wa: w}
		}
	}
	return out
}

// assignmentOf is the assignment a worker of job j gets in this reconcile: target, its job's
// current generation (workerAssignment), unless a rollout holds it on what it runs now.
func (r *reconciler) assignmentOf(v *View, j cluster.JobRecord, target cluster.WorkerAssignment) cluster.WorkerAssignment {
	k := target.Key
	if r.ro == nil {
		return target
	}
	cur, ok := r.ro.cur[k]
	if !ok {
		return target // a new worker starts on the current generation
	}
	target.Restart = cur.wa.Restart
	jr := r.ro.jobs[j.Spec.Name]
	if jr != nil && jr.admitted[k] && jr.ro.Kind == cluster.RolloutRestart {
		target.Restart = jr.ro.ID
	}
	if jr == nil || jr.admitted[k] || cur.wa.SameRun(target) {
		return target
	}
	// Held: what it runs stays, what it can re-read follows the job.
	kept := *cur.wa
	kept.Workers, kept.Epoch, kept.Routers, kept.LiveEnv = target.Workers, target.Epoch, target.Routers, target.LiveEnv
	kept.Secrets = v.secretRefs(kept.Tenant, refNames(kept.Secrets)) // new values reach it too
	return kept
}

// targetFor is the assignment a worker would take from its job now (its restart rollout
// kept), to compare with what it runs.
func (r *reconciler) targetFor(v *View, rec cluster.JobRecord, k cluster.WorkerKey, cur assigned) cluster.WorkerAssignment {
	t := workerAssignment(v, rec, k, r.outputKey)
	t.Restart = cur.wa.Restart
	return t
}

// rollouts advances every job's rollout one step, records what changed, and returns the
// placements with the workers a rollout holds kept where they run and moves sequenced.
func (r *reconciler) rollouts(ctx context.Context, v *View, placements []cluster.Placement) ([]cluster.Placement, error) {
	now := time.Now()
	plan := &rolloutPlan{cur: r.assignedWorkers(v), jobs: map[string]*jobRollout{}, prepull: map[string][]string{}, prepullTenant: map[string]string{}}
	r.ro = plan
	var planned map[cluster.WorkerKey]string // made when a rollout is under way
	for _, name := range slices.Sorted(maps.Keys(v.jobs)) {
		rec := v.jobs[name].rec
		if rec.State != cluster.JobRunning || !rec.Rollout.Active() {
			continue
		}
		if planned == nil {
			planned = make(map[cluster.WorkerKey]string, len(placements))
			for _, p := range placements {
				planned[p.Key()] = p.Node
			}
		}
		before := *rec.Rollout
		in := r.rolloutInput(v, rec, planned)
		st := stepRollout(before, in, now)
		next := st.next
		if st.fail != "" {
			r.rolloutEvent(v, name, next, "failed: "+st.fail)
			if next.Policy.AutoRevert && next.Kind != cluster.RolloutRevert {
				if err := r.revert(ctx, v, name, before, st.fail); err != nil {
					return nil, err
				}
				// Nothing more is admitted until the revert is read back from the store.
				plan.jobs[name] = &jobRollout{ro: before, admitted: inFlightSet(before)}
				continue
			}
			next.State, next.Reason = cluster.RolloutFailed, st.fail
		}
		for _, note := range st.notes {
			r.rolloutEvent(v, name, next, note)
		}
		jr := &jobRollout{ro: next, admitted: inFlightSet(next)}
		if !sameRollout(before, next) {
			next.Updated = now.UTC()
			saved, err := r.saveRollout(ctx, name, before, next)
			if err != nil {
				return nil, err
			}
			if !saved {
				// An operator changed the rollout meanwhile: admit nothing new until the
				// next reconcile reads it.
				jr = &jobRollout{ro: before, admitted: inFlightSet(before)}
			}
		}
		plan.jobs[name] = jr
		if in.image != "" {
			for _, node := range slices.Sorted(maps.Keys(st.prepull)) {
				plan.prepull[node] = append(plan.prepull[node], in.image)
			}
			if _, ok := plan.prepullTenant[in.image]; !ok {
				plan.prepullTenant[in.image] = rec.Spec.Tenant // jobs in name order: the first one's
			}
		}
		if !st.wake.IsZero() && (plan.wake.IsZero() || st.wake.Before(plan.wake)) {
			plan.wake = st.wake
		}
	}
	r.armWake(plan.wake)
	return r.sequenceMoves(v, plan.hold(v, placements)), nil
}

func inFlightSet(ro cluster.Rollout) map[cluster.WorkerKey]bool {
	out := make(map[cluster.WorkerKey]bool, len(ro.InFlight))
	for _, f := range ro.InFlight {
		out[f.Key] = true
	}
	return out
}

// sameRollout compares two rollout states, leaving out when they were written.
func sameRollout(a, b cluster.Rollout) bool {
	a.Updated, b.Updated = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// saveRollout writes next over before in the job record; it reports false, writing
// nothing, when the record no longer holds before (an operator paused or promoted, or a new
// update came).
func (r *reconciler) saveRollout(ctx context.Context, name string, before, next cluster.Rollout) (bool, error) {
	key, err := cluster.JobKey(name)
	if err != nil {
		return false, fmt.Errorf("master: %w", err)
	}
	_, err = coord.Update(ctx, r.kv, key, func(cur []byte, exists bool) ([]byte, error) {
		var rec cluster.JobRecord
		if !exists || json.Unmarshal(cur, &rec) != nil || rec.Rollout == nil || !sameRollout(*rec.Rollout, before) {
			return nil, errUnchanged
		}
		rec.Rollout = &next
		return json.Marshal(rec)
	})
	r.m.metrics.storeWrites.Inc()
	switch {
	case errors.Is(err, errUnchanged):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("master: record the rollout of %s: %w", name, err)
	}
	return true, nil
}

// revert starts a failed update's way back: the job's spec, generation and image pin
// return to the generation before it (keeping the worker count), as a revert rollout.
func (r *reconciler) revert(ctx context.Context, v *View, name string, failed cluster.Rollout, reason string) error {
	key, err := cluster.JobKey(name)
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	_, err = coord.Update(ctx, r.kv, key, func(cur []byte, exists bool) ([]byte, error) {
		var rec cluster.JobRecord
		if !exists || json.Unmarshal(cur, &rec) != nil || rec.Rollout == nil || !sameRollout(*rec.Rollout, failed) {
			return nil, errUnchanged
		}
		now := time.Now().UTC()
		h, err := desired.HistoryOf(ctx, r.kv, rec)
		if err != nil {
			return nil, err
		}
		g, ok := h.Find(failed.From)
		if !ok {
			ro := failed
			ro.State, ro.Reason, ro.Updated = cluster.RolloutFailed, reason+fmt.Sprintf("; cannot revert: generation %d is no longer in the history", failed.From), now
			rec.Rollout = &ro
			return json.Marshal(rec)
		}
		spec := g.Spec
		spec.Workers = rec.Spec.Workers
		policy := failed.Policy
		policy.By, policy.Canary, policy.AutoRevert = cluster.RolloutByWorker, 0, false
		rec.Spec, rec.Generation, rec.Image, rec.Updated = spec, failed.From, g.Image, now
		rec.Rollout = &cluster.Rollout{ID: failed.ID + 1, Kind: cluster.RolloutRevert, From: failed.To, To: failed.From,
			State: cluster.RolloutReverting, Policy: policy, Reason: fmt.Sprintf("update to generation %d failed: %s", failed.To, reason),
			Started: now, Updated: now, Who: "auto-revert", Total: failed.Total}
		return json.Marshal(rec)
	})
	r.m.metrics.storeWrites.Inc()
	if err != nil && !errors.Is(err, errUnchanged) {
		return fmt.Errorf("master: revert job %s: %w", name, err)
	}
	r.rolloutEvent(v, name, failed, fmt.Sprintf("reverting to generation %d", failed.From))
	return nil
}

// rolloutEvent reports one step of a job's rollout. Issue 19 (events): emit the job event
// here; every rollout transition (started, batch begun, worker admitted, worker healthy,
// awaiting promotion, failed, reverting, done) passes through this one place.
func (r *reconciler) rolloutEvent(v *View, job string, ro cluster.Rollout, what string) {
	r.m.log.Info("rollout", "job", job, "rollout", ro.ID, "kind", ro.Kind, "to", ro.To, "state", ro.State,
		"batch", ro.Batch, "domain", ro.Domain, "event", what)
	kind := api.EventRolloutStep
	switch {
	case strings.HasPrefix(what, "failed"):
		kind = api.EventRolloutFailed
	case strings.HasPrefix(what, "reverting"):
		kind = api.EventRolloutReverted
	}
	r.m.Emit(api.Event{Kind: kind, Object: "job/" + job, Job: job, Tenant: tenantOf(v.jobs, job),
		Reason: fmt.Sprintf("%s %d (%s, generation %d to %d, batch %d): %s", ro.Kind, ro.ID, ro.State, ro.From, ro.To, ro.Batch, what)})
}

// hold keeps the workers a rollout has not admitted on the node they run on while the plan
// would move them off a node they may stay on (a new placement or new resources in the
// spec): they move when their batch comes, within the rollout's limits. A node that is
// lost, draining or avoided lets its workers go at once. The plan may have given the slot
// a held worker leaves to another worker meanwhile: until the batch moves it, that node
// holds one worker more than its slots.
func (p *rolloutPlan) hold(v *View, placements []cluster.Placement) []cluster.Placement {
	for i, pl := range placements {
		jr := p.jobs[pl.Job]
		if jr == nil || jr.admitted[pl.Key()] {
			continue
		}
		if cur, ok := p.cur[pl.Key()]; ok && cur.node != pl.Node && staysOn(v, cur.node, pl.Job) {
			placements[i].Node = cur.node
		}
	}
	return placements
}

// staysOn reports whether a worker of job may stay on node: the node is alive, not being
// drained (by an operator or its data center's failover) and not avoided by the job.
func staysOn(v *View, node, job string) bool {
	rec, alive := v.nodes[node]
	if !alive {
		return false
	}
	c := v.confs[node]
	return !c.Draining && v.dcs[rec.Node.DC].State != cluster.DCFailed && !c.Avoiding(job, time.Now())
}

// sequenceMoves holds back the start of a worker on a new node while another live node
// still reports a copy of it: the old node stops it first (its assignment no longer has
// it), and the next reconcile, once its report is gone, assigns it. So a moved worker never
// runs twice, at the cost of its stop time. Lost nodes report nothing and delay nothing.
func (r *reconciler) sequenceMoves(v *View, placements []cluster.Placement) []cluster.Placement {
	// Only the workers placed anew can wait, so only their reports are looked for: a rack's
	// moves, not a list of every worker's nodes.
	to := map[cluster.WorkerKey]string{}
	for _, p := range placements {
		if cur, ok := r.ro.cur[p.Key()]; !ok || cur.node != p.Node {
			to[p.Key()] = p.Node
		}
	}
	if len(to) == 0 {
		return placements
	}
	wait := map[cluster.WorkerKey]bool{}
	for _, c := range v.copies {
		if node, ok := to[c.status.Key]; ok && c.node != node {
			wait[c.status.Key] = true // still reported elsewhere: it starts once stopped there
		}
	}
	out := placements[:0]
	for _, p := range placements {
		if !wait[p.Key()] {
			out = append(out, p)
		}
	}
	return out
}

// armWake makes the leader reconcile at t (a replacement becoming healthy, a deadline), as
// nothing in the store changes then.
func (r *reconciler) armWake(t time.Time) {
	if r.wake != nil {
		r.wake.Stop()
		r.wake = nil
	}
	if t.IsZero() {
		return
	}
	// A little after t: an agent's clock and the master's differ by milliseconds.
	r.wake = time.AfterFunc(max(time.Until(t), 0)+50*time.Millisecond, r.m.poke)
}

// stopWake ends the wake timer when the leader's term ends.
func (r *reconciler) stopWake() {
	r.armWake(time.Time{})
	r.armAvoidWake(time.Time{})
}

// judgedByRollout reports a crash-looping worker that its job's rollout judges, rather than
// its node: one being replaced, or one on the generation an update moves to. Moving it to
// another node would not help; the rollout fails (and reverts) instead.
func judgedByRollout(rec cluster.JobRecord, w cluster.WorkerStatus) bool {
	ro := rec.Rollout
	if !ro.Active() {
		return false
	}
	return ro.From != ro.To && w.Generation == ro.To || slices.ContainsFunc(ro.InFlight, func(f cluster.RolloutWorker) bool { return f.Key == w.Key })
}

// rolloutIn is what one step of a job's rollout looks at.
type rolloutIn struct {
	workers []rolloutWorker
	gen     int64  // the generation workers move to
	image   string // its pinned image, pulled ahead; "" when none
	// ready reports whether a node has image ready, and why it cannot when its pull failed.
	ready func(node string) (bool, string)
}

// rolloutWorker is one worker of a job in rollout.
type rolloutWorker struct {
	key     cluster.WorkerKey
	node    string                // assigned now; "" when nowhere
	planned string                // where the plan puts it; "" when unplaced
	needs   bool                  // must be replaced (its run changes, or it moves)
	status  *cluster.WorkerStatus // as node reports it
	domain  string                // its failure domain for the rollout's by
}

// rolloutInput gathers a job's workers for a rollout step.
func (r *reconciler) rolloutInput(v *View, rec cluster.JobRecord, planned map[cluster.WorkerKey]string) rolloutIn {
	ro := rec.Rollout
	in := rolloutIn{gen: rec.Generation}
	for _, k := range rec.Spec.Keys() {
		w := rolloutWorker{key: k, planned: planned[k]}
		if cur, ok := r.ro.cur[k]; ok {
			w.node = cur.node
			if s, ok := v.statuses[k]; ok && s.node == cur.node {
				w.status = s.status
			}
			target := r.targetFor(v, rec, k, cur)
			if in.image == "" {
				in.image = target.Pinned
			}
			if ro.Kind == cluster.RolloutRestart {
				w.needs = ro.Covers(k.Worker) && cur.wa.Restart != ro.ID
			} else {
				w.needs = !cur.wa.SameRun(target)
			}
			if w.planned != "" && w.planned != cur.node && staysOn(v, cur.node, k.Job) {
				w.needs = true
			}
			w.domain = r.domainOf(v, cur.node, ro.Policy.By)
		}
		in.workers = append(in.workers, w)
	}
	in.ready = func(node string) (bool, string) {
		if in.image == "" {
			return true, ""
		}
		for _, img := range v.nodes[node].Images {
			if img.Ref != in.image {
				continue
			}
			switch img.State {
			case cluster.ImageReady:
				return true, ""
			case cluster.ImageFailed:
				return false, fmt.Sprintf("image %s could not be pulled on node %s: %s", in.image, node, img.Error)
			}
		}
		return false, ""
	}
	return in
}

// domainOf names a node's failure domain for a rollout by by.
func (r *reconciler) domainOf(v *View, node, by string) string {
	dc, rack := "", ""
	if rec, ok := v.nodes[node]; ok {
		dc, rack = rec.Node.DC, rec.Node.Rack
	} else if st, ok := r.assign[node]; ok {
		dc, rack = st.a.DC, st.a.Rack
	}
	switch by {
	case cluster.RolloutByNode:
		return node
	case cluster.RolloutByRack:
		return dc + "/" + rack
	case cluster.RolloutByDC:
		return dc
	}
	return ""
}

// rolloutStep is the outcome of one step.
type rolloutStep struct {
	next    cluster.Rollout
	fail    string          // why the rollout fails now; "" when it does not
	prepull map[string]bool // nodes that should have the target image ahead
	wake    time.Time       // when time alone changes something
	notes   []string        // what happened, for events
}

func (s *rolloutStep) wakeAt(t time.Time) {
	if s.wake.IsZero() || t.Before(s.wake) {
		s.wake = t
	}
}

// stepRollout advances a rollout by what its job's workers report: replacements that became
// healthy leave the flight, failed ones fail it, and new workers are admitted within its
// limits, batch by batch. It is pure: the caller records the result.
func stepRollout(ro cluster.Rollout, in rolloutIn, now time.Time) rolloutStep {
	next := ro
	next.InFlight = slices.Clone(ro.InFlight)
	next.Canaries = slices.Clone(ro.Canaries)
	pol := ro.Policy.Effective()
	out := rolloutStep{prepull: map[string]bool{}}
	byKey := make(map[cluster.WorkerKey]*rolloutWorker, len(in.workers))
	for i := range in.workers {
		byKey[in.workers[i].key] = &in.workers[i]
	}
	// down counts, conservatively, every worker not reported running (one reported starting
	// may run already); stopped is only one known to have no process (crashed and waiting,
	// failed to start, evicted, waiting for its image), which a replacement cannot take down.
	down := func(w *rolloutWorker) bool { return w.status == nil || w.status.State != cluster.WorkerRunning }
	stopped := func(w *rolloutWorker) bool {
		if w.status == nil {
			return false
		}
		switch w.status.State {
		case cluster.WorkerBackoff, cluster.WorkerFailed, cluster.WorkerEvicted, cluster.WorkerPulling:
			return true
		}
		return false
	}
	// judging: failures count (a paused rollout or one awaiting promotion judges nothing
	// new; a failed one waits for an operator).
	judging := next.State == cluster.RolloutRunning || next.State == cluster.RolloutReverting

	var flight []cluster.RolloutWorker
	inFlight := map[cluster.WorkerKey]bool{}
	for _, f := range next.InFlight {
		w := byKey[f.Key]
		if w == nil {
			out.notes = append(out.notes, fmt.Sprintf("worker %s left the job", f.Key))
			continue
		}
		st := w.status
		onTarget := !w.needs && st != nil && st.Generation == in.gen && (ro.Kind != cluster.RolloutRestart || st.Restart == ro.ID)
		if onTarget && st.State == cluster.WorkerRunning {
			healthyAt := st.Since.Add(pol.MinHealthy.Std())
			if !now.Before(healthyAt) {
				out.notes = append(out.notes, fmt.Sprintf("worker %s healthy on node %s", f.Key, w.node))
				continue
			}
			out.wakeAt(healthyAt)
		}
		if judging && out.fail == "" {
			deadline := f.Since.Add(pol.Deadline.Std())
			switch {
			case onTarget && st.RecentRestarts >= rolloutCrashRestarts:
				out.fail = fmt.Sprintf("worker %s is crash-looping on generation %d: %d restarts, last exit: %s", f.Key, in.gen, st.RecentRestarts, st.LastExit)
			case now.After(deadline):
				state := "not assigned"
				if st != nil {
					state = st.State
					if st.LastExit != "" {
						state += ", last exit: " + st.LastExit
					}
				}
				out.fail = fmt.Sprintf("worker %s not healthy within the deadline of %s (%s)", f.Key, pol.Deadline, state)
			default:
				out.wakeAt(deadline)
			}
		}
		flight = append(flight, f)
		inFlight[f.Key] = true
	}
	next.InFlight = flight

	var pending []*rolloutWorker
	downNow, healthy := 0, 0
	for i := range in.workers {
		w := &in.workers[i]
		if down(w) {
			downNow++
		}
		switch {
		case inFlight[w.key]:
		case w.needs:
			pending = append(pending, w)
		case !down(w):
			healthy++
		}
	}
	slices.SortStableFunc(pending, func(a, b *rolloutWorker) int {
		if c := cmp.Compare(a.domain, b.domain); c != 0 {
			return c
		}
		return a.key.Compare(b.key)
	})
	next.Healthy, next.Total = healthy, len(in.workers)
	target := func(w *rolloutWorker) string {
		if w.planned != "" {
			return w.planned
		}
		return w.node
	}
	for _, w := range pending {
		if n := target(w); n != "" {
			out.prepull[n] = true
		}
	}
	if out.fail != "" || !judging {
		return finish(next, out)
	}

	// admit lets w be replaced if the rollout's limits allow; a worker known to have no
	// process costs nothing more. It reports full when the limits are reached.
	admit := func(w *rolloutWorker) (admitted, full bool) {
		if ok, why := in.ready(target(w)); !ok {
			if why != "" && out.fail == "" {
				out.fail = why
			}
			return false, false
		}
		free := stopped(w)
		if !free && (len(next.InFlight) >= pol.MaxParallel || downNow >= pol.MaxParallel) {
			return false, true
		}
		next.InFlight = append(next.InFlight, cluster.RolloutWorker{Key: w.key, Since: now.UTC()})
		inFlight[w.key] = true
		if !down(w) {
			downNow++
		}
		out.notes = append(out.notes, fmt.Sprintf("replacing worker %s on node %s", w.key, target(w)))
		return true, false
	}

	if (next.Kind == cluster.RolloutUpdate || next.Kind == cluster.RolloutRollback) && pol.Canary > 0 && !next.Promoted {
		if next.Batch == 0 {
			next.Batch = 1
			out.notes = append(out.notes, fmt.Sprintf("canary batch: %d workers", pol.Canary))
		}
		for _, w := range pending {
			if len(next.Canaries) >= pol.Canary {
				break
			}
			if ok, _ := admit(w); ok {
				next.Canaries = append(next.Canaries, w.key)
			}
		}
		left := 0
		for _, w := range pending {
			if !inFlight[w.key] {
				left++
			}
		}
		if (len(next.Canaries) >= pol.Canary || left == 0) && !slices.ContainsFunc(next.Canaries, func(k cluster.WorkerKey) bool { return inFlight[k] }) {
			if left == 0 && len(next.InFlight) == 0 {
				return done(next, out, now)
			}
			next.State = cluster.RolloutCanary
			out.notes = append(out.notes, fmt.Sprintf("%d canaries healthy; waiting for `stormdock job promote`", len(next.Canaries)))
		}
		return finish(next, out)
	}

	byDomain := pol.By != cluster.RolloutByWorker && next.Kind != cluster.RolloutRevert
	inBatch := func(w *rolloutWorker) bool { return !byDomain || w.domain == next.Domain }
	var batch []*rolloutWorker
	// The canaries were batch 1: the next batch begins after them.
	started := next.Batch > 0 && !(len(next.Canaries) > 0 && next.Batch == 1)
	if started {
		for _, w := range pending {
			if inBatch(w) {
				batch = append(batch, w)
			}
		}
	}
	if len(batch) == 0 && (len(next.InFlight) == 0 || !started) {
		if len(pending) == 0 {
			if len(next.InFlight) == 0 {
				return done(next, out, now)
			}
			return finish(next, out)
		}
		next.Batch++
		if byDomain {
			next.Domain = pending[0].domain
			out.notes = append(out.notes, fmt.Sprintf("batch %d: %s %s", next.Batch, pol.By, next.Domain))
		} else {
			out.notes = append(out.notes, fmt.Sprintf("batch %d: %d workers, %d at a time", next.Batch, len(pending), pol.MaxParallel))
		}
		for _, w := range pending {
			if inBatch(w) {
				batch = append(batch, w)
			}
		}
	}
	// Once the limits are reached only workers that are down already are admitted.
	for _, w := range batch {
		admit(w)
	}
	return finish(next, out)
}

// finish completes a step's result.
func finish(next cluster.Rollout, out rolloutStep) rolloutStep {
	out.next = next
	return out
}

// done ends a rollout whose every worker runs its target.
func done(next cluster.Rollout, out rolloutStep, now time.Time) rolloutStep {
	if next.Kind == cluster.RolloutRevert {
		next.State = cluster.RolloutReverted
	} else {
		next.State, next.Reason = cluster.RolloutDone, ""
	}
	next.Domain, next.InFlight, next.Finished = "", nil, now.UTC()
	out.notes = append(out.notes, next.State)
	out.prepull = nil
	out.next = next
	return out
}
