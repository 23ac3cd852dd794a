package master

import (
	"context"
	"encoding/json"
	"errors"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/placement"
)

// The API answers reads from a Snapshot: the cluster as the leader's last reconcile saw it
// and left it, with what requests read worked out once per state (where each worker is
// assigned, why the unplaced ones are, each job's reported copies and summary). A request
// then costs what it returns, not the cluster's size, and no request plans: at ten thousand
// nodes, decoding every record and planning for each `job status` took a core per poller.
//
// A standby master, and the leader before its first reconcile, build the state from the
// mirrors instead, at most once per readRefresh while they change, planning only when some
// worker is unassigned (to say why).

// readRefresh bounds how often a master that does not lead rebuilds its read state.
const readRefresh = time.Second

// Snapshot is one state the API answers from (read through its methods). Its fields are not changed once published.
type Snapshot struct {
	v        *View
	assigns  map[string]cluster.NodeAssignment
	unplaced map[cluster.WorkerKey]string
	// why is the placement engine's explanation of each unplaced worker it found no node
	// for (the workers of one job or link share one).
	why   map[cluster.WorkerKey]*placement.Explanation
	stamp Stamp     // the mirrors' generations it reflects (at least)
	fresh readStamp // what must not have changed since for it to be served
	at    time.Time

	once    sync.Once
	placed  map[string][]placedWorker // each job's workers and their nodes, stopping ones excluded
	perNode map[string]int
	tallies map[string]jobTally

	mu        sync.Mutex
	listMu    sync.Mutex // held while a list is made
	summaries map[string]cachedSummary
	// lists caches `job list` as each viewer got it, for the jobs of one generation: ten
	// clients polling a thousand jobs would otherwise encode the same list over and over.
	lists map[string]cachedList
}

type cachedList struct {
	jobs uint64 // the jobs mirror's generation it was made from
	body []byte
}

// cachedSummary is a job's summary made from its record at version.
type cachedSummary struct {
	version int64
	s       api.JobSummary
}

// tally works out, once, what requests look up, in one pass over the nodes: where each
// job's workers are assigned, how many each node holds, and each job's counts. Ten pollers
// of `job list` at ten thousand nodes made each of a thousand summaries from maps of every
// worker, each poller on its own: 84 ms of both cores per state, paid at every reconcile
// (BenchmarkSnapshotJobList).
func (st *Snapshot) tally() {
	st.once.Do(func() {
		st.placed = make(map[string][]placedWorker, len(st.v.jobs)+len(st.v.routers))
		for name, j := range st.v.jobs {
			st.placed[name] = make([]placedWorker, 0, j.rec.Spec.TotalWorkers())
		}
		st.perNode = make(map[string]int, len(st.assigns))
		c := st.v.newCounts()
		for node, a := range st.assigns {
			for i := range a.Workers {
				if w := &a.Workers[i]; !w.Stop {
					st.placed[w.Key.Job] = append(st.placed[w.Key.Job], placedWorker{w: w, node: node})
					st.perNode[node]++
				}
			}
			// The node's assignment is in the cache now: a worker's is 312 bytes, and
			// walking them all is most of the cost.
			if rec, ok := st.v.nodes[node]; ok {
				c.node(rec.Workers, a.Workers)
			}
		}
		for id, rec := range st.v.nodes {
			if _, ok := st.assigns[id]; !ok {
				c.node(rec.Workers, nil)
			}
		}
		st.tallies = c.done(st.unplaced)
	})
}

// placedWorker is a worker's assignment (in the state's, not a copy: a hundred thousand of
// them) and the node it is assigned to.
type placedWorker struct {
	w    *cluster.WorkerAssignment
	node string
}

// Assigned is the node each of job's workers is assigned to, workers being stopped
// excluded (job may name an output router job).
func (st *Snapshot) Assigned(job string) map[cluster.WorkerKey]string {
	st.tally()
	out := make(map[cluster.WorkerKey]string, len(st.placed[job]))
	for _, p := range st.placed[job] {
		out[p.w.Key] = p.node
	}
	return out
}

// PerNode is how many workers each node is assigned, workers being stopped excluded.
func (st *Snapshot) PerNode() map[string]int {
	st.tally()
	return st.perNode
}

// allAssigned is the node every worker is assigned to, workers being stopped excluded:
// what planning for a state that is not the leader's needs (before the state is tallied).
func (st *Snapshot) allAssigned() map[cluster.WorkerKey]string {
	n := 0
	for _, a := range st.assigns {
		n += len(a.Workers)
	}
	out := make(map[cluster.WorkerKey]string, n)
	for node, a := range st.assigns {
		for i := range a.Workers {
			if w := &a.Workers[i]; !w.Stop {
				out[w.Key] = node
			}
		}
	}
	return out
}

// Summary is the job's summary, j being its current record (which may be newer than the
// state: a job just submitted shows its workers pending).
func (st *Snapshot) Summary(j Job) api.JobSummary {
	st.tally()
	name := j.rec.Spec.Name
	if vj, ok := st.v.jobs[name]; ok && vj.version == j.version {
		return st.tallies[name].summary(j.rec)
	}
	// A record newer than the state: counted alone, once per version.
	st.mu.Lock()
	if c, ok := st.summaries[name]; ok && c.version == j.version {
		st.mu.Unlock()
		return c.s
	}
	st.mu.Unlock()
	sv := &View{statuses: st.v.statuses}
	for _, c := range st.v.copies {
		if c.status.Key.Job == name {
			sv.copies = append(sv.copies, c)
		}
	}
	s := summarize(sv, j.rec, st.Assigned(name), st.unplaced)
	st.mu.Lock()
	if st.summaries == nil {
		st.summaries = map[string]cachedSummary{}
	}
	st.summaries[name] = cachedSummary{version: j.version, s: s}
	st.mu.Unlock()
	return s
}

// List returns the encoded `job list` of viewer (the API's name of the caller: admin, or
// tenant/NAME) for the jobs of generation gen, making it with make when this state has none.
func (st *Snapshot) List(viewer string, gen uint64, make func() []byte) []byte {
	st.mu.Lock()
	if c, ok := st.lists[viewer]; ok && c.jobs == gen {
		st.mu.Unlock()
		return c.body
	}
	st.mu.Unlock()
	// One list made at a time: pollers that ask together wait for it instead of each
	// encoding their own.
	st.listMu.Lock()
	defer st.listMu.Unlock()
	st.mu.Lock()
	if c, ok := st.lists[viewer]; ok && c.jobs == gen {
		st.mu.Unlock()
		return c.body
	}
	st.mu.Unlock()
	body := make()
	st.mu.Lock()
	if st.lists == nil {
		st.lists = map[string]cachedList{}
	}
	st.lists[viewer] = cachedList{jobs: gen, body: body}
	st.mu.Unlock()
	return body
}

// reads is the master's read states.
type reads struct {
	mu        sync.Mutex
	published *Snapshot // the leader's last reconcile's
	built     *Snapshot // made from the mirrors
	// need is what a state must reflect: the mirrors as they were once the changes this
	// master's API made had reached them (read-your-writes).
	need Stamp
	// changed is closed, and replaced, whenever the leader publishes a state.
	changed chan struct{}
}

// Stamp tells whether the mirrors changed: each one's count of changes. It costs the same
// however large the cluster: every watch stream asks for it every api.WatchInterval.
type Stamp [6]uint64 // jobs, nodes, confs, assigns, tenants, dcs

func (m *Master) Stamp() Stamp {
	var s Stamp
	for i, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs} {
		s[i] = mr.generation()
	}
	return s
}

// readStamp is what a read state must still match to be served: which nodes are
// registered (and in which session), node settings, data centers and tenants. Node
// records' other changes (memory readings, each worker's state) and the leader's own
// assignments do not make it stale: they are what the state is for.
type readStamp struct{ nodes, confs, dcs, tenants uint64 }

func (m *Master) readStamp() readStamp {
	return readStamp{m.nodes.membership(), m.confs.generation(), m.dcs.generation(), m.tenants.generation()}
}

// covers reports whether s reflects at least what n does.
func (s Stamp) covers(n Stamp) bool {
	for i := range s {
		if s[i] < n[i] {
			return false
		}
	}
	return true
}

// publish makes what a reconcile saw and left the state the API answers from; s and rs were
// taken before v was made from the mirrors.
func (m *Master) publish(s Stamp, rs readStamp, v *View, assign map[string]assignState, res *placement.Result) *Snapshot {
	st := &Snapshot{v: v, assigns: make(map[string]cluster.NodeAssignment, len(assign)), at: time.Now(),
		stamp: s, fresh: rs}
	for node, a := range assign {
		st.assigns[node] = a.a
	}
	st.unplaced, st.why = unplacedOf(res)
	// Counted here, on the leader's thread, which needs the counts for its gauges anyway:
	// the API's first read of the state then finds them.
	st.tally()
	m.vc.mu.Lock()
	if len(m.vc.assigns) > 0 {
		// Decoded while this master did not lead: not read again (Snapshot). A new map,
		// as clear keeps the old one's buckets.
		m.vc.assigns = map[string]cached[cluster.NodeAssignment]{}
	}
	m.vc.mu.Unlock()
	m.reads.mu.Lock()
	m.reads.published = st
	if m.reads.changed != nil {
		close(m.reads.changed)
		m.reads.changed = nil
	}
	m.reads.mu.Unlock()
	return st
}

// leaderState returns the leader's last published state (nil before its first reconcile,
// or on a master that does not lead) and a channel closed when it publishes the next.
func (m *Master) leaderState() (*Snapshot, <-chan struct{}) {
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	if m.reads.changed == nil {
		m.reads.changed = make(chan struct{})
	}
	return m.reads.published, m.reads.changed
}

// unpublish drops the leader's state when it stops leading: another master plans now.
func (m *Master) unpublish() {
	m.reads.mu.Lock()
	m.reads.published = nil
	m.reads.mu.Unlock()
}

// Snapshot returns the state the API answers from now.
func (m *Master) Snapshot() *Snapshot {
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	rs, need := m.readStamp(), m.reads.need
	if p := m.reads.published; p != nil && p.fresh == rs && p.stamp.covers(need) {
		// What was built while the published state was stale is not needed again: a
		// state holds the cluster's decoded assignments, a third of the master's memory
		// at ten thousand nodes.
		m.reads.built = nil
		return p
	}
	s := m.Stamp()
	if b := m.reads.built; b != nil && b.fresh == rs && b.stamp.covers(need) && (b.stamp == s || time.Since(b.at) < readRefresh) {
		return b
	}
	v := m.view()
	assigns := m.decodedAssigns
	if p := m.reads.published; p != nil {
		// The leader writes every assignment and keeps what it wrote: its last state's are
		// the store's (or newer than the mirror's). Decoding the mirror instead kept a
		// second copy of every worker's assignment on the leader for good (the decoded
		// cache).
		assigns = func() map[string]cluster.NodeAssignment { return p.assigns }
	}
	st := &Snapshot{v: v, assigns: assigns(), stamp: s, fresh: rs, at: time.Now()}
	st.unplaced, st.why = m.unplaced(v, st.allAssigned())
	m.reads.built = st
	return st
}

// decodedAssigns decodes the assignments mirror, reusing what earlier calls decoded.
func (m *Master) decodedAssigns() map[string]cluster.NodeAssignment {
	c := &m.vc
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	entries := m.assigns.snapshot()
	out := make(map[string]cluster.NodeAssignment, len(entries))
	refresh(c.assigns, entries, func(node string, e coord.Entry) (cluster.NodeAssignment, bool) {
		var a cluster.NodeAssignment
		return a, json.Unmarshal(e.Value, &a) == nil
	}, func(node string, _ int64, a cluster.NodeAssignment) { out[node] = a })
	return out
}

// CurrentJobs returns the job records as the store has them now (an API read sees a job
// the moment it is submitted, not one reconcile later), decoded once per version. The map
// is shared until the jobs change: callers must not modify it.
func (m *Master) CurrentJobs() map[string]Job {
	jobs, _ := m.CurrentJobsGen()
	return jobs
}

// CurrentJobsGen is CurrentJobs with the generation of the jobs mirror it is of.
func (m *Master) CurrentJobsGen() (map[string]Job, uint64) {
	c := &m.vc
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	gen := m.jobs.generation()
	if c.current != nil && c.currentGen == gen {
		return c.current, gen
	}
	entries := m.jobs.snapshot()
	out := make(map[string]Job, len(entries))
	refresh(c.jobs, entries, m.decodeJob, func(name string, _ int64, j Job) { out[name] = j })
	c.current, c.currentGen = out, gen
	return out, gen
}

// writeVisibleWait bounds how long an answer to a change waits for the change to reach
// this master's mirrors: milliseconds, unless the store is slow to tell its watchers.
const writeVisibleWait = 2 * time.Second

// ReadYourWrite waits, before a change's answer goes out, until the changed object (as
// the API's audit names it: job/NAME, node/ID, dc/NAME, tenant/NAME) is in this master's
// mirrors as the store has it now, and makes every later read reflect at least the mirrors
// as they are then. A client that submits a job, or undrains a node, and reads it back
// sees its change, though the leader may not have planned since.
func (m *Master) ReadYourWrite(ctx context.Context, object string) {
	kind, name, ok := strings.Cut(object, "/")
	if !ok {
		return
	}
	mr := map[string]*mirror{"job": m.jobs, "node": m.confs, "dc": m.dcs, "tenant": m.tenants}[kind]
	if mr == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, writeVisibleWait)
	defer cancel()
	e, err := m.store.Get(ctx, path.Join(mr.dir, name))
	switch {
	case err == nil:
		err = mr.waitFor(ctx, name, func(cur coord.Entry, exists bool) bool { return exists && cur.ModRev >= e.ModRev })
	case errors.Is(err, coord.ErrNotFound):
		err = mr.waitFor(ctx, name, func(_ coord.Entry, exists bool) bool { return !exists })
	}
	if err != nil {
		m.log.Debug("a change not yet in the mirrors when answered", "object", object, "err", err)
	}
	s := m.Stamp()
	m.reads.mu.Lock()
	for i := range s {
		m.reads.need[i] = max(m.reads.need[i], s[i])
	}
	m.reads.mu.Unlock()
}

// unplaced explains the workers no node takes, by planning over the same view the leader
// plans from. Placement is pure, so any master can give the leader's reasons. When every
// worker of every job is assigned there is nothing to explain, and no plan is made. Only a
// master that does not lead plans for this (see Snapshot); the leader's reconcile says why.
func (m *Master) unplaced(v *View, assigned map[cluster.WorkerKey]string) (map[cluster.WorkerKey]string, map[cluster.WorkerKey]*placement.Explanation) {
	missing := false
	for _, j := range v.jobs {
		if j.rec.State != cluster.JobRunning {
			continue
		}
		for _, k := range j.rec.Spec.Keys() {
			node, ok := assigned[k]
			if _, alive := v.nodes[node]; !ok || !alive {
				missing = true // unassigned, or held on a lost node
				break
			}
		}
		if missing {
			break
		}
	}
	if !missing {
		return map[cluster.WorkerKey]string{}, nil
	}
	var cur []cluster.Placement
	for k, node := range assigned {
		if rec, ok := v.record(k.Job); ok && rec.State == cluster.JobRunning {
			cur = append(cur, cluster.Placement{Job: k.Job, Link: k.Link, Worker: k.Worker, Node: node})
		}
	}
	r := &reconciler{m: m, assign: map[string]assignState{}}
	for node, a := range m.decodedAssigns() {
		r.assign[node] = assignState{a: a, exists: true}
	}
	res, _, err := r.planWhole(v, placement.Input{Nodes: v.schedulable(), Jobs: v.runningJobs(), Current: cur, Avoid: v.avoid()})
	if err != nil {
		return map[cluster.WorkerKey]string{}, nil
	}
	return unplacedOf(res)
}

// unplacedOf is a plan's unplaced workers: why each waits, and the placement engine's
// explanation where it found no node.
func unplacedOf(res *placement.Result) (map[cluster.WorkerKey]string, map[cluster.WorkerKey]*placement.Explanation) {
	reasons := make(map[cluster.WorkerKey]string, len(res.Unplaced))
	var why map[cluster.WorkerKey]*placement.Explanation
	for _, u := range res.Unplaced {
		reasons[u.Key()] = u.Reason
		if u.Why != nil {
			if why == nil {
				why = map[cluster.WorkerKey]*placement.Explanation{}
			}
			why[u.Key()] = u.Why
		}
	}
	return reasons, why
}

// jobTally is what a job's summary counts of a state.
type jobTally struct{ running, unplaced, stopping int }

func (t jobTally) summary(rec cluster.JobRecord) api.JobSummary {
	s := summaryOf(rec)
	s.Running, s.Unplaced, s.Stopping = t.running, t.unplaced, t.stopping
	return s
}

// counts are jobs' tallies being counted.
type counts map[string]*counting

type counting struct {
	rec *cluster.JobRecord
	t   jobTally
}

func (v *View) newCounts() counts {
	// One lookup per worker, of a hundred thousand.
	c := make(counts, len(v.jobs)+len(v.routers))
	for name, j := range v.jobs {
		c[name] = &counting{rec: &j.rec}
	}
	for name, rec := range v.routers {
		c[name] = &counting{rec: &rec} // for the leader's gauges, which count routers too
	}
	return c
}

// node counts what a node reports (reported) given its assignment (assigned): a worker
// runs when the node it is assigned to reports it running; a reported copy stops when it
// is not in its job's spec, not assigned to the node that reports it, or its job is not
// running.
func (c counts) node(reported []cluster.WorkerStatus, assigned []cluster.WorkerAssignment) {
	for i := range reported {
		w := &reported[i]
		j, ok := c[w.Key.Job]
		if !ok {
			continue
		}
		in := inSpec(&j.rec.Spec, w.Key)
		here := false
		for x := range assigned {
			if k := &assigned[x].Key; k.Worker == w.Key.Worker && *k == w.Key {
				here = !assigned[x].Stop
				break
			}
		}
		if in && here && w.State == cluster.WorkerRunning {
			j.t.running++
		}
		if !in || !here || j.rec.State != cluster.JobRunning {
			j.t.stopping++
		}
	}
}

// done counts the unplaced workers and returns every job's tally.
func (c counts) done(unplaced map[cluster.WorkerKey]string) map[string]jobTally {
	for k := range unplaced {
		if j, ok := c[k.Job]; ok && inSpec(&j.rec.Spec, k) {
			j.t.unplaced++
		}
	}
	out := make(map[string]jobTally, len(c))
	for name, j := range c {
		out[name] = j.t
	}
	return out
}

// inSpec reports whether worker k is one of spec's.
func inSpec(spec *cluster.JobSpec, k cluster.WorkerKey) bool {
	if k.Worker >= spec.Workers {
		return false
	}
	return k.Link == "" && !spec.Mirrored() || slices.Contains(spec.Links, k.Link)
}

// summaryOf is a job's summary without its counts.
func summaryOf(rec cluster.JobRecord) api.JobSummary {
	s := api.JobSummary{Name: rec.Spec.Name, Tenant: rec.Spec.Tenant, State: rec.State, Workers: rec.Spec.TotalWorkers(),
		Priority: rec.Spec.Priority, Generation: rec.Generation}
	if rec.Rollout.Active() {
		s.Rollout = rec.Rollout.State
	}
	return s
}

func summarize(v *View, rec cluster.JobRecord, assigned map[cluster.WorkerKey]string, unplaced map[cluster.WorkerKey]string) api.JobSummary {
	s := summaryOf(rec)
	for _, k := range rec.Spec.Keys() {
		if st, ok := v.statuses[k]; ok && st.status.State == cluster.WorkerRunning && st.node == assigned[k] {
			s.Running++
		}
		if _, ok := unplaced[k]; ok {
			s.Unplaced++
		}
	}
	for _, c := range v.copies {
		if k := c.status.Key; k.Job == rec.Spec.Name && (!inSpec(&rec.Spec, k) || assigned[k] != c.node || rec.State != cluster.JobRunning) {
			s.Stopping++
		}
	}
	return s
}
