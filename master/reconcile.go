package master

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/multidc"
	"github.com/stormdock/stormdock/placement"
)

// assignState is a node's assignment as last read or written by this leader.
type assignState struct {
	a cluster.NodeAssignment
	// sum is the SHA-256 of the value in the store: an assignment that encodes the same is
	// not written again. A sum, not the value: the mirror holds the value already, and ten
	// thousand nodes' values are 20 MiB. SHA-256, as the encoding holds tenants' strings
	// (env, commands) that could be chosen to collide a weaker hash and hold a change back.
	sum     [sha256.Size]byte
	version int64
	exists  bool
}

// reconciler is the leader's loop state. Only the leader writes assignments, so it keeps
// them in memory after reading them once at the start of its term.
type reconciler struct {
	m            *Master
	assign       map[string]assignState
	lastUnplaced int
	outputKey    []byte // sender tokens are made with it (see output.go)
	// ro is this reconcile's rollout decisions (rollout.go); wake reconciles again when
	// a rollout waits for time to pass.
	ro   *rolloutPlan
	wake *time.Timer
	// avoidWake reconciles again when the next node's avoidance of a job runs out (avoid.go).
	avoidWake   *time.Timer
	avoidWakeAt time.Time
	seen        *seen // what the previous reconcile saw, for events (events.go)
	// since is when this term began: a job submitted after it, before the term's first
	// view, is this term's to record.
	since time.Time
	// kv is the store as this term writes it: every write carries the term's fence, so a
	// leader deposed meanwhile writes nothing (coord.Fenced).
	kv coord.KV
	// apartTried is when routersApart last found no other data center for a job's standby
	// router: it tries again after apartRetry, not at every reconcile.
	apartTried map[string]time.Time
	// made is what the last completed reconcile made of each job no rollout held (see
	// desired); making is this reconcile's, made once it completes.
	made, making map[jobLink]cluster.WorkerAssignment
}

func (r *reconciler) loadAssignments(ctx context.Context) error {
	names, err := r.m.store.Children(ctx, cluster.AssignmentsKey)
	if err != nil {
		return fmt.Errorf("master: list assignments: %w", err)
	}
	r.assign = make(map[string]assignState, len(names))
	for _, name := range names {
		if err := r.reload(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// reload reads one node's assignment from the store, after a conflict or at the start.
func (r *reconciler) reload(ctx context.Context, node string) error {
	key, err := cluster.AssignmentKey(node)
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	e, err := r.m.store.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		delete(r.assign, node)
		return nil
	}
	if err != nil {
		return fmt.Errorf("master: read assignment of %s: %w", node, err)
	}
	var a cluster.NodeAssignment
	if len(e.Value) > 0 {
		if err := json.Unmarshal(e.Value, &a); err != nil {
			r.m.log.Warn("replacing unreadable assignment", "node", node, "err", err)
		}
	}
	r.assign[node] = assignState{a: a, sum: sha256.Sum256(e.Value), version: e.Version, exists: true}
	return nil
}

// measured reconciles on a thread of its own, and counts the processor time that thread
// took (stormdock_master_reconcile_cpu_seconds_total): the leader's own cost of a change,
// apart from the API's and the mirrors' in the same process.
func (r *reconciler) measured(ctx context.Context) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadCPU()
	err := r.reconcile(ctx)
	if d := threadCPU() - before; d > 0 {
		r.m.metrics.reconcileCPU.Add(d.Seconds())
	}
	return err
}

// threadCPU is the processor time of the calling thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// reconcile plans once and writes the assignments that changed.
func (r *reconciler) reconcile(ctx context.Context) error {
	start := time.Now()
	clock := r.m.metrics.clock(start)
	// The last reconcile's jobs, which desired compares with, hold only when it completed:
	// one that failed may have written some nodes and not others.
	made := r.made
	r.made, r.making = nil, nil
	s, rs := r.m.Stamp(), r.m.readStamp() // before the view: it reflects at least these
	v := r.m.view()
	r.observeEvents(v)
	clock.done("view")
	if err := r.recordDCs(ctx, v); err != nil {
		return err
	}
	if err := r.ensureOutputKey(ctx, v); err != nil {
		return err
	}
	if err := r.healAvoidance(ctx, v); err != nil {
		return err
	}
	if err := r.noteCrashLoops(ctx, v); err != nil {
		return err
	}
	clock.done("prepare")
	current, stopping := r.current(v)
	keep, err := r.rebalance(ctx, v, current)
	if err != nil {
		return err
	}
	in := placement.Input{Nodes: v.schedulable(), Jobs: v.runningJobs(), Current: keep, Avoid: v.avoid(),
		Hold: r.m.holdAbsent(v, keep)}
	res, held, err := r.planWhole(v, in)
	if err != nil {
		return fmt.Errorf("master: plan: %w", err)
	}
	if res, held, err = r.routersApart(ctx, v, in, res, held); err != nil {
		return fmt.Errorf("master: plan: %w", err)
	}
	r.withoutUIDs(ctx, v, res)
	placements := res.Placements
	for _, p := range keep {
		if _, ok := held[p.Key()]; ok {
			placements = append(placements, p) // stays on its lost node until it can move whole
		}
	}
	// Rollouts decide which workers take their job's new generation now; moves wait for
	// the old copy to stop.
	if placements, err = r.rollouts(ctx, v, placements); err != nil {
		return err
	}
	clock.done("plan")
	want := r.desired(v, placements, stopping, made)
	before := make(map[cluster.WorkerKey]string, len(current))
	for node, st := range r.assign {
		for i := range st.a.Workers {
			if w := &st.a.Workers[i]; !w.Stop {
				before[w.Key] = node
			}
		}
	}
	clock.done("assign")
	writes, err := r.write(ctx, v, want)
	if err != nil {
		return err
	}
	clock.done("write")
	r.planEvents(v, before, placements, res)
	if err := r.forgetLost(ctx, v, want); err != nil {
		return err
	}
	if err := r.collectKilled(ctx, v); err != nil {
		return err
	}
	st := r.m.publish(s, rs, v, r.assign, res)
	clock.done("publish")
	r.observe(st, before, res, writes, time.Since(start))
	r.made = r.making
	return nil
}

// current lists the placements the plan should keep if still valid, and the workers of
// killed jobs that are still being stopped.
func (r *reconciler) current(v *View) ([]cluster.Placement, map[string][]cluster.WorkerAssignment) {
	n := 0
	for _, st := range r.assign {
		n += len(st.a.Workers)
	}
	cur := make([]cluster.Placement, 0, n)
	stopping := map[string][]cluster.WorkerAssignment{}
	evicted := v.evictedOn()
	for node, st := range r.assign {
		for i := range st.a.Workers {
			w := &st.a.Workers[i] // not a copy of each worker's 312 bytes
			rec, ok := v.record(w.Key.Job)
			switch {
			case ok && rec.State == cluster.JobRunning && !w.Stop:
				if len(evicted) > 0 && evicted[w.Key] == node {
					continue // its node evicted it under memory pressure: place it elsewhere
				}
				cur = append(cur, cluster.Placement{Job: w.Key.Job, Worker: w.Key.Worker, Link: w.Key.Link, Node: node})
			case ok && rec.State == cluster.JobKilled:
				if _, alive := v.nodes[node]; !alive {
					continue // nobody left to stop it there
				}
				if s, reported := v.statuses[w.Key]; !reported || s.node != node {
					continue // the agent has stopped it
				}
				stop := *w
				stop.Stop = true
				stop.Grace = cluster.Duration(rec.Spec.Grace())
				stopping[node] = append(stopping[node], stop)
			}
		}
	}
	return cur, stopping
}

// jobLink names the workers of a job (of one link) whose assignments differ in their key
// only.
type jobLink struct{ job, link string }

// desired builds every node's assignment from the plan.
func (r *reconciler) desired(v *View, placements []cluster.Placement, stopping map[string][]cluster.WorkerAssignment, prev map[jobLink]cluster.WorkerAssignment) map[string]cluster.NodeAssignment {
	// A job's workers differ in their key only: each job (and link) is made into an
	// assignment once, not once for each of its workers, whose environments and secret
	// references it then shares.
	made := map[jobLink]cluster.WorkerAssignment{}
	// A job is kept as it is when the last reconcile, which completed, made the same of it
	// and no rollout changes its workers: a node holding only the same keys of kept jobs
	// keeps its assignment without its being built, compared and encoded again. At ten
	// thousand nodes that is nearly all of them when a rack is lost.
	kept := map[jobLink]bool{}
	// What the next reconcile compares with: the jobs no rollout holds, whose workers'
	// assignments are made exactly as made says.
	next := map[jobLink]cluster.WorkerAssignment{}
	// Each node's workers in a slice of their exact number: the leader keeps every
	// assignment it writes, and slices grown by append held a third more than their
	// workers (ten on a node in room for sixteen).
	n := make(map[string]int, len(v.nodes))
	same := make(map[string]int, len(v.nodes)) // placements found unchanged in the node's assignment
	for _, p := range placements {
		n[p.Node]++
		jl := jobLink{p.Job, p.Link}
		if _, ok := made[jl]; !ok {
			j, _ := v.record(p.Job)
			t := workerAssignment(v, j, cluster.WorkerKey{Job: p.Job, Link: p.Link}, r.outputKey)
			made[jl] = t
			if r.ro == nil || r.ro.jobs[p.Job] == nil {
				next[jl] = t
				if old, ok := prev[jl]; ok && reflect.DeepEqual(old, t) {
					kept[jl] = true
				}
			}
		}
		if kept[jl] {
			if st, ok := r.assign[p.Node]; ok && holds(st.a.Workers, p.Key()) {
				same[p.Node]++
			}
		}
	}
	for node, ws := range stopping {
		n[node] += len(ws)
	}
	want := make(map[string]cluster.NodeAssignment, len(n)+len(v.nodes))
	for node, c := range same {
		st := r.assign[node]
		rec, alive := v.nodes[node]
		if c == n[node] && c == len(st.a.Workers) && alive && st.exists && st.a.Session == v.sessions[node] &&
			st.a.DC == rec.Node.DC && st.a.Rack == rec.Node.Rack && len(st.a.Prepull) == 0 && (r.ro == nil || len(r.ro.prepull[node]) == 0) {
			want[node] = st.a
		}
	}
	building := make(map[string]*cluster.NodeAssignment, len(n)-len(want))
	for _, p := range placements {
		if _, ok := want[p.Node]; ok {
			continue
		}
		a := building[p.Node]
		if a == nil {
			a = &cluster.NodeAssignment{Node: p.Node, Workers: make([]cluster.WorkerAssignment, 0, n[p.Node])}
			building[p.Node] = a
		}
		j, _ := v.record(p.Job)
		t := made[jobLink{p.Job, p.Link}]
		t.Key = p.Key()
		a.Workers = append(a.Workers, r.assignmentOf(v, j, t))
	}
	for node, ws := range stopping {
		a := building[node]
		if a == nil {
			a = &cluster.NodeAssignment{Node: node}
			building[node] = a
		}
		a.Workers = append(a.Workers, ws...)
	}
	r.making = next
	fresh := make(map[string]cluster.NodeAssignment, len(building)+len(v.nodes)-len(want))
	for node, a := range building {
		fresh[node] = *a
	}
	// Every live node gets an assignment stamped with the session its entry belongs to,
	// an empty one included: its agent acts only on that (see cluster.NodeAssignment).
	for node := range v.nodes {
		if _, ok := want[node]; !ok {
			if _, ok := fresh[node]; !ok {
				fresh[node] = cluster.NodeAssignment{Node: node}
			}
		}
	}
	for node, a := range fresh {
		if rec, ok := v.nodes[node]; ok {
			a.DC, a.Rack, a.Session = rec.Node.DC, rec.Node.Rack, v.sessions[node]
			if r.ro != nil {
				a.Prepull = r.ro.prepull[node]
				for _, ref := range a.Prepull {
					if a.PrepullTenants == nil {
						a.PrepullTenants = map[string]string{}
					}
					a.PrepullTenants[ref] = r.ro.prepullTenant[ref]
				}
			}
		} else {
			old := r.assign[node].a
			a.DC, a.Rack, a.Session = old.DC, old.Rack, old.Session
		}
		slices.SortFunc(a.Workers, func(x, y cluster.WorkerAssignment) int {
			if c := x.Key.Compare(y.Key); c != 0 {
				return c
			}
			return cmp.Compare(fmt.Sprint(x.Stop), fmt.Sprint(y.Stop))
		})
		want[node] = a
	}
	return want
}

// holds reports whether ws, sorted by key, assigns worker k (to run, not to stop).
func holds(ws []cluster.WorkerAssignment, k cluster.WorkerKey) bool {
	i, ok := slices.BinarySearchFunc(ws, k, func(w cluster.WorkerAssignment, k cluster.WorkerKey) int { return w.Key.Compare(k) })
	return ok && !ws[i].Stop
}

func workerAssignment(v *View, j cluster.JobRecord, k cluster.WorkerKey, outputKey []byte) cluster.WorkerAssignment {
	s := j.Spec
	env, live := s.SplitEnv()
	wa := cluster.WorkerAssignment{
		Key:        k,
		Generation: j.Generation,
		Tenant:     s.Tenant,
		Workers:    s.Workers,
		Epoch:      j.Epoch,
		LiveEnv:    live,
		Isolation:  s.IsolationMode(),
		Command:    s.Command,
		Image:      s.Image,
		Pinned:     j.Image.PinnedFor(j.Generation),
		Env:        env,
		Resources:  s.Resources,
		// The agent orders evictions and OOM scores by it: never above the tenant's cap.
		Priority: min(s.Priority, v.caps[s.Tenant]),
		Grace:    cluster.Duration(s.Grace()),
		Output:   s.Output,
		UID:      v.uids[s.Tenant],
		Secrets:  v.secretRefs(s.Tenant, s.Secrets),
	}
	if s.Mirrored() {
		// Link workers send to the job's routers, whose leader alone writes to the job's
		// output. Where the routers run reaches running workers through their live
		// configuration: a router moving restarts no link worker.
		wa.Output = ""
		wa.Routers = v.RouterURLs(s.Name)
		switch {
		case outputKey == nil:
		case len(j.OutputLinkTokenHashes) > 0:
			// A link's workers get their link's token: they cannot send as another link.
			wa.OutputToken = multidc.LinkSenderToken(outputKey, s.Name, k.Link, j.Submitted)
		default:
			// A job stored before per-link tokens: its router knows the job's token only.
			wa.OutputToken = multidc.SenderToken(outputKey, s.Name, j.Submitted)
		}
	}
	wa.System = isRouterJob(s.Name)
	if wa.System && wa.UID > 0 {
		// Routers hold the store's credentials and the job's output key: not the uid of
		// the tenant's own code, which could read them through /proc or ptrace.
		t := cluster.Tenant{UID: wa.UID}
		wa.UID = t.RouterUID()
	}
	return wa
}

// write stores the assignments that differ from what the nodes have, emptying those of
// nodes that lost everything first so that stops go out before starts. It returns how many
// keys it wrote. A node whose entry is gone is not emptied: no agent acts on its assignment
// any more (View.registered), and forgetLost removes it once the starts are out. A data
// center's loss would otherwise write a quarter of the cluster's assignments, empty, before
// the first of its workers could start elsewhere.
func (r *reconciler) write(ctx context.Context, v *View, want map[string]cluster.NodeAssignment) (int, error) {
	var changes []change
	for _, node := range slices.Sorted(maps.Keys(mergeKeys(want, r.assign))) {
		a, ok := want[node]
		if !ok && !v.registered(node) {
			continue
		}
		if !ok {
			old := r.assign[node].a
			a = cluster.NodeAssignment{Node: node, DC: old.DC, Rack: old.Rack, Workers: []cluster.WorkerAssignment{}}
		}
		if a.Workers == nil {
			a.Workers = []cluster.WorkerAssignment{}
		}
		st := r.assign[node]
		if st.exists && unchanged(st.a, a) {
			continue
		}
		val, err := json.Marshal(a)
		if err != nil {
			return 0, fmt.Errorf("master: encode assignment of %s: %w", node, err)
		}
		if st.exists && st.sum == sha256.Sum256(val) {
			continue
		}
		changes = append(changes, change{node: node, a: a, value: val, fewer: len(a.Workers) < len(st.a.Workers)})
	}
	slices.SortStableFunc(changes, func(x, y change) int {
		switch {
		case x.fewer == y.fewer:
			return 0
		case x.fewer:
			return -1
		}
		return 1
	})
	if err := r.commit(ctx, changes); err != nil {
		return 0, err
	}
	return len(changes), nil
}

func mergeKeys[A, B any](a map[string]A, b map[string]B) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// collectKilled deletes the records of killed jobs once no worker of theirs is assigned.
func (r *reconciler) collectKilled(ctx context.Context, v *View) error {
	killed := false
	for _, j := range v.jobs {
		killed = killed || j.rec.State == cluster.JobKilled
	}
	if !killed {
		return nil // nothing to collect: no list of every assigned worker's job
	}
	left := map[string]bool{}
	for _, st := range r.assign {
		for i := range st.a.Workers {
			left[st.a.Workers[i].Key.Job] = true
		}
	}
	for name, j := range v.jobs {
		if j.rec.State != cluster.JobKilled || left[name] {
			continue
		}
		jobKey, err := cluster.JobKey(name)
		if err != nil {
			return fmt.Errorf("master: %w", err)
		}
		if j.rec.Spec.Mirrored() {
			// The router's checkpoint and election go with the job.
			routerKey, err := cluster.RouterKey(name)
			if err != nil {
				return fmt.Errorf("master: %w", err)
			}
			if err := coord.DeleteTree(ctx, r.kv, routerKey); err != nil && !errors.Is(err, coord.ErrNotFound) {
				return fmt.Errorf("master: remove the router record of %s: %w", name, err)
			}
		}
		if historyKey, err := cluster.JobHistoryKey(name); err == nil {
			if err := r.kv.Delete(ctx, historyKey, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) {
				return fmt.Errorf("master: remove the history of %s: %w", name, err)
			}
		}
		err = r.kv.Delete(ctx, jobKey, j.version)
		r.m.metrics.storeWrites.Inc()
		if err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrConflict) {
			return fmt.Errorf("master: remove killed job %s: %w", name, err)
		}
		r.m.log.Info("job removed", "job", name)
	}
	return nil
}

// forgetLost deletes the assignments of nodes that are gone and that the plan puts nothing
// on (written empty or not: see write), so that the store does not collect one key per node
// that ever lived. An agent that comes back with the same id finds no assignment, which it
// reads as "run nothing".
func (r *reconciler) forgetLost(ctx context.Context, v *View, want map[string]cluster.NodeAssignment) error {
	var gone []change
	for node, st := range r.assign {
		if _, wanted := want[node]; wanted || !st.exists || v.registered(node) {
			continue
		}
		gone = append(gone, change{node: node, remove: true})
	}
	return r.commit(ctx, gone)
}

// withoutUIDs takes the workers of tenants without a uid out of the plan, as unplaced with
// the reason: they are not run as anyone else. Only a tenant stored before uids existed
// has none, until the leading master backfills it (at the start of its term; tried again
// here).
func (r *reconciler) withoutUIDs(ctx context.Context, v *View, res *placement.Result) {
	kept := res.Placements[:0]
	var missing []string
	for _, p := range res.Placements {
		tenant := v.TenantOf(p.Job) // a router's is its mirrored job's
		if v.uids[tenant] > 0 {
			kept = append(kept, p)
			continue
		}
		if !slices.Contains(missing, tenant) {
			missing = append(missing, tenant)
		}
		res.Unplaced = append(res.Unplaced, placement.Unplaced{Job: p.Job, Worker: p.Worker, Link: p.Link,
			Reason: fmt.Sprintf("waiting: tenant %s has no uid to run as yet (the leading master gives it one from --tenant-uids)", tenant)})
	}
	res.Placements = kept
	if len(missing) == 0 {
		return
	}
	slices.SortFunc(res.Unplaced, func(a, b placement.Unplaced) int {
		return cmp.Or(cmp.Compare(a.Job, b.Job), cmp.Compare(a.Link, b.Link), cmp.Compare(a.Worker, b.Worker))
	})
	r.m.log.Warn("workers of tenants without a uid wait", "tenants", missing)
	r.m.backfillUIDs(ctx, r.kv)
}
