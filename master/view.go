package master

import (
	"cmp"
	"encoding/json"
	"fmt"
	fastjson "github.com/segmentio/encoding/json"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// view is the cluster as one reconcile sees it, decoded from the mirrors.
type View struct {
	jobs     map[string]Job
	routers  map[string]cluster.JobRecord // output routers of mirrored jobs, by router job name
	nodes    map[string]cluster.NodeRecord
	sessions map[string]int64 // the store session owning each node's entry
	// unreadable are the nodes whose entry is in the store but does not decode: their
	// session lives, so their agents may act on their assignments (see registered).
	unreadable map[string]bool
	confs      map[string]cluster.NodeConf
	dcs        map[string]cluster.DCRecord
	statuses   map[cluster.WorkerKey]nodeWorker // what agents report, by worker
	copies     []nodeWorker                     // every worker every agent reports
	evicted    []nodeWorker                     // the copies in state evicted
	caps       map[string]int                   // each tenant's priority cap
	uids       map[string]int                   // each tenant's uid (0 or missing: none yet)
	secrets    map[string]secretVersions        // each tenant's secrets' versions
}

type Job struct {
	rec     cluster.JobRecord
	version int64
}

// nodeWorker is a worker status with the node that reports it. status points into the
// node's decoded record, which is never changed once decoded (mirror.decode): a view, its
// snapshot and the events' memory of it share one copy of each status instead of three.
type nodeWorker struct {
	node   string
	status *cluster.WorkerStatus
}

func decodeView(log *slog.Logger, jobs, nodes, confs, dcs map[string]coord.Entry) *View {
	v := newView(len(jobs), len(nodes), len(confs), len(dcs))
	for name, e := range jobs {
		if j, err := decodeJobEntry(name, e); err != nil {
			log.Warn("ignoring unreadable job record", "job", name, "err", err)
		} else {
			v.jobs[name] = j
		}
	}
	for id, e := range nodes {
		if rec, err := decodeNodeEntry(id, e); err != nil {
			log.Warn("ignoring unreadable node record", "node", id, "err", err)
			v.unreadable[id] = true
		} else {
			v.addNode(id, e.Owner, rec)
		}
	}
	for name, e := range dcs {
		if d, err := decodeDCEntry(name, e); err != nil {
			log.Warn("ignoring unreadable data-center record", "dc", name, "err", err)
		} else {
			v.dcs[name] = d
		}
	}
	for id, e := range confs {
		if c, ok, err := decodeConfEntry(e); err != nil {
			log.Warn("ignoring unreadable node settings", "node", id, "err", err)
		} else if ok {
			v.confs[id] = c
		}
	}
	return v
}

func newView(jobs, nodes, confs, dcs int) *View {
	return &View{
		dcs:        make(map[string]cluster.DCRecord, dcs),
		jobs:       make(map[string]Job, jobs),
		routers:    map[string]cluster.JobRecord{},
		nodes:      make(map[string]cluster.NodeRecord, nodes),
		sessions:   make(map[string]int64, nodes),
		unreadable: map[string]bool{},
		confs:      make(map[string]cluster.NodeConf, confs),
		statuses:   map[cluster.WorkerKey]nodeWorker{},
	}
}

func decodeJobEntry(name string, e coord.Entry) (Job, error) {
	var rec cluster.JobRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return Job{}, err
	}
	if rec.Spec.Name != name {
		return Job{}, fmt.Errorf("record names job %q", rec.Spec.Name)
	}
	return Job{rec: rec, version: e.Version}, nil
}

func decodeNodeEntry(id string, e coord.Entry) (cluster.NodeRecord, error) {
	var rec cluster.NodeRecord
	if err := unmarshalNodeRecord(e.Value, &rec); err != nil {
		return rec, err
	}
	if rec.Node.ID != id {
		return rec, fmt.Errorf("record names node %q", rec.Node.ID)
	}
	return rec, nil
}

// unmarshalNodeRecord decodes a node record as encoding/json does, twice as fast
// (BenchmarkNodeDecoder): at ten thousand nodes the agents rewrite 2,000 records a second,
// and decoding them was a third of the master's cpu. FuzzNodeRecordDecode holds it to
// encoding/json's reading of any bytes.
func unmarshalNodeRecord(b []byte, rec *cluster.NodeRecord) error {
	return fastjson.Unmarshal(b, rec)
}

func decodeDCEntry(name string, e coord.Entry) (cluster.DCRecord, error) {
	var d cluster.DCRecord
	if err := json.Unmarshal(e.Value, &d); err != nil {
		return d, err
	}
	if d.Name != name {
		return d, fmt.Errorf("record names data center %q", d.Name)
	}
	return d, nil
}

// decodeConfEntry decodes a node's settings; ok is false for an empty entry.
func decodeConfEntry(e coord.Entry) (c cluster.NodeConf, ok bool, err error) {
	if len(e.Value) == 0 {
		return c, false, nil
	}
	if err := json.Unmarshal(e.Value, &c); err != nil {
		return c, false, err
	}
	return c, true, nil
}

// viewCache keeps every record the last view decoded, with the store revision it was
// decoded at: a view decodes only the records written since. Node records are decoded by
// their mirror as they arrive (nodeDecoder): rewritten with every memory reading, decoding
// ten thousand of them for every plan and every API read was most of the master's cpu at
// that size.
type viewCache struct {
	mu    sync.Mutex
	jobs  map[string]cached[Job]
	confs map[string]cached[cluster.NodeConf]
	dcs   map[string]cached[cluster.DCRecord]
	// assigns is for the API of a master that does not lead (see Snapshot).
	assigns map[string]cached[cluster.NodeAssignment]
	// current is the jobs as of the jobs mirror's generation currentGen (CurrentJobs).
	current    map[string]Job
	currentGen uint64
}

// init makes the maps; mu is held.
func (c *viewCache) init() {
	if c.jobs == nil {
		c.jobs = map[string]cached[Job]{}
		c.confs, c.dcs = map[string]cached[cluster.NodeConf]{}, map[string]cached[cluster.DCRecord]{}
		c.assigns = map[string]cached[cluster.NodeAssignment]{}
	}
}

// tenantOf is the tenant of a job in jobs, or of the mirrored job an output router job
// (JOB.router) runs for; "" when unknown. It is the one lookup of a job's tenant: events,
// the map and its scoping all go through it.
func tenantOf(jobs map[string]Job, job string) string {
	if j, ok := jobs[strings.TrimSuffix(job, routerSuffix)]; ok {
		return j.rec.Spec.Tenant
	}
	return ""
}

// decodeJob decodes a job record for the cache, logging one that does not decode.
func (m *Master) decodeJob(name string, e coord.Entry) (Job, bool) {
	j, err := decodeJobEntry(name, e)
	if err != nil {
		m.log.Warn("ignoring unreadable job record", "job", name, "err", err)
	}
	return j, err == nil
}

// cached is one decoded record; ok is false for a record that did not decode (it is logged
// once, when read).
type cached[T any] struct {
	rev, owner int64
	v          T
	ok         bool
}

// refresh brings c in line with entries, decoding only what is new or changed, and calls
// use for every record that decodes.
func refresh[T any](c map[string]cached[T], entries map[string]coord.Entry, decode func(string, coord.Entry) (T, bool), use func(string, int64, T)) {
	for name := range c {
		if _, ok := entries[name]; !ok {
			delete(c, name)
		}
	}
	for name, e := range entries {
		d, ok := c[name]
		if !ok || d.rev != e.ModRev || d.owner != e.Owner {
			d = cached[T]{rev: e.ModRev, owner: e.Owner}
			d.v, d.ok = decode(name, e)
			c[name] = d
		}
		if d.ok {
			use(name, d.owner, d.v)
		}
	}
}

// view returns the mirrors decoded, reusing the records decoded by earlier views.
func (m *Master) view() *View {
	c := &m.vc
	c.mu.Lock()
	defer c.mu.Unlock()
	c.init()
	jobs, nodes, confs, dcs := m.jobs.snapshot(), m.nodes.decodedSnapshot(), m.confs.snapshot(), m.dcs.snapshot()
	v := newView(len(jobs), len(nodes), len(confs), len(dcs))
	workers := 0
	refresh(c.jobs, jobs, m.decodeJob, func(name string, _ int64, j Job) { v.jobs[name] = j })
	var ids []string
	for id, d := range nodes {
		if rec, ok := d.v.(cluster.NodeRecord); ok {
			ids = append(ids, id)
			workers += len(rec.Workers)
		} else {
			v.unreadable[id] = true
		}
	}
	v.statuses, v.copies = make(map[cluster.WorkerKey]nodeWorker, workers), make([]nodeWorker, 0, workers)
	for _, id := range ids {
		d := nodes[id]
		v.addNode(id, d.owner, d.v.(cluster.NodeRecord))
	}
	refresh(c.dcs, dcs, func(name string, e coord.Entry) (cluster.DCRecord, bool) {
		d, err := decodeDCEntry(name, e)
		if err != nil {
			m.log.Warn("ignoring unreadable data-center record", "dc", name, "err", err)
		}
		return d, err == nil
	}, func(name string, _ int64, d cluster.DCRecord) { v.dcs[name] = d })
	refresh(c.confs, confs, func(id string, e coord.Entry) (cluster.NodeConf, bool) {
		conf, ok, err := decodeConfEntry(e)
		if err != nil {
			m.log.Warn("ignoring unreadable node settings", "node", id, "err", err)
		}
		return conf, ok
	}, func(id string, _ int64, conf cluster.NodeConf) { v.confs[id] = conf })
	v.setCaps(m.log, m.tenants.snapshot())
	v.setSecrets(m.secrets.decodedSnapshot())
	v.addRouters(m.cfg.RouterStore)
	return v
}

// registered reports whether the node's entry is in the store, readable or not: whether a
// session of its agent's keeper lives. An agent acts only on an assignment stamped with its
// keeper's current session (cluster.NodeAssignment.Session), so one whose entry is gone acts
// on nothing the master wrote before: a later session of its gets a new assignment first.
func (v *View) registered(node string) bool {
	_, ok := v.nodes[node]
	return ok || v.unreadable[node]
}

// setCaps notes each tenant's priority cap and uid from its record. A tenant without a readable
// record has none: its jobs are placed at the lowest priority.
func (v *View) setCaps(log *slog.Logger, tenants map[string]coord.Entry) {
	v.caps = make(map[string]int, len(tenants))
	v.uids = make(map[string]int, len(tenants))
	for name, e := range tenants {
		var t cluster.TenantRecord
		if err := json.Unmarshal(e.Value, &t); err != nil {
			log.Warn("ignoring unreadable tenant record", "tenant", name, "err", err)
			continue
		}
		v.caps[name] = t.PriorityCap()
		v.uids[name] = t.UID
	}
}

// addNode adds a node's live record to the view: the node and every worker it reports.
func (v *View) addNode(id string, owner int64, rec cluster.NodeRecord) {
	v.nodes[id] = rec
	v.sessions[id] = owner
	for i := range rec.Workers {
		w := &rec.Workers[i]
		nw := nodeWorker{node: id, status: w}
		// Where two agents report one worker (an old copy still stopping), the one in
		// a running state wins.
		if old, ok := v.statuses[w.Key]; !ok || old.status.State != cluster.WorkerRunning {
			v.statuses[w.Key] = nw
		}
		v.copies = append(v.copies, nw)
		if w.State == cluster.WorkerEvicted {
			v.evicted = append(v.evicted, nw)
		}
	}
}

// evictedOn is the node of each worker that its node evicted under memory pressure, as
// statuses has it (a running copy elsewhere wins): a list as short as the evictions, so
// that the reconcile does not look up every worker's status to find them.
func (v *View) evictedOn() map[cluster.WorkerKey]string {
	out := map[cluster.WorkerKey]string{}
	for _, c := range v.evicted {
		if s := v.statuses[c.status.Key]; s.node == c.node && s.status.State == cluster.WorkerEvicted {
			out[c.status.Key] = c.node
		}
	}
	return out
}

// isolationLabel is the node label an agent sets for each driver it offers.
func isolationLabel(mode string) string { return "isolation/" + mode }

// schedulable returns the nodes as placement sees them: health throttling and operator
// settings folded into the node.
func (v *View) schedulable() []cluster.Node {
	out := make([]cluster.Node, 0, len(v.nodes))
	for _, id := range slices.Sorted(maps.Keys(v.nodes)) {
		rec := v.nodes[id]
		n := rec.Node
		n.Labels = maps.Clone(n.Labels)
		n.Throttled = rec.Health.Throttled
		n.Unschedulable = rec.Health.State == cluster.HealthUnhealthy
		if v.dcs[n.DC].State == cluster.DCFailed {
			n.Draining = true // an operator failed its data center: everything moves out
		}
		if c, ok := v.confs[id]; ok {
			n.Draining = n.Draining || c.Draining
			if c.Pool != "" {
				n.Pool = c.Pool
			}
		}
		out = append(out, n)
	}
	return out
}

// runningJobs returns the specs placement must place, routers included, each requiring a
// node that offers its isolation.
func (v *View) runningJobs() []cluster.JobSpec {
	recs := make(map[string]cluster.JobRecord, len(v.jobs)+len(v.routers))
	for name, j := range v.jobs {
		recs[name] = j.rec
	}
	maps.Copy(recs, v.routers)
	out := make([]cluster.JobSpec, 0, len(recs))
	for _, name := range slices.Sorted(maps.Keys(recs)) {
		rec := recs[name]
		if rec.State != cluster.JobRunning {
			continue
		}
		spec := rec.Spec
		// Placement sees a job at most at its tenant's cap: a spec stored before the cap
		// was lowered (or forced into the store) cannot preempt beyond what the admin allows.
		spec.Priority = min(spec.Priority, v.caps[spec.Tenant])
		labels := maps.Clone(spec.Placement.NodeLabels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[isolationLabel(spec.IsolationMode())] = "true"
		spec.Placement.NodeLabels = labels
		out = append(out, spec)
	}
	return out
}

// avoid maps each job to the nodes that avoid it now, after its crash loops there.
func (v *View) avoid() map[string][]string {
	out := map[string][]string{}
	now := time.Now()
	for id, c := range v.confs {
		for _, job := range c.Avoid {
			if c.Avoiding(job, now) {
				out[job] = append(out[job], id)
			}
		}
	}
	return out
}

// nodeDecoder decodes a node record as it arrives, once (see mirror.decode), and digests
// what planning reads of it: the node, its health, its agent instance, and which workers it
// runs in which state. Memory readings, pids and timestamps change all the time and do not
// matter: a record whose digest did not change wakes no plan. Ten thousand agents' memory
// readings are a thousand changes a second; each costs one decode, not one per plan.
func (m *Master) nodeDecoder(id string, value []byte) (any, uint64) {
	rec, err := decodeNodeEntry(id, coord.Entry{Value: value})
	if err != nil {
		m.log.Warn("ignoring unreadable node record", "node", id, "err", err)
		return nil, 0 // every unreadable record digests alike, and the change of a good one to it shows
	}
	compactNodeRecord(&rec)
	ws := make([]digestWorker, len(rec.Workers))
	for i, w := range rec.Workers {
		ws[i] = digestWorker{Key: w.Key, State: w.State, RecentRestarts: w.RecentRestarts, Generation: w.Generation, Restart: w.Restart}
	}
	// Images a node holds or pulls: a pinned job waits for its image on the node.
	imgs := make([]cluster.ImageStatus, len(rec.Images))
	for i, im := range rec.Images {
		imgs[i] = cluster.ImageStatus{Ref: im.Ref, State: im.State}
	}
	slices.SortFunc(imgs, func(a, b cluster.ImageStatus) int {
		return cmp.Or(cmp.Compare(a.Ref, b.Ref), cmp.Compare(a.State, b.State))
	})
	slices.SortFunc(ws, func(a, b digestWorker) int {
		if c := a.Key.Compare(b.Key); c != 0 {
			return c
		}
		if c := cmp.Compare(a.State, b.State); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.RecentRestarts, b.RecentRestarts), cmp.Compare(a.Generation, b.Generation), cmp.Compare(a.Restart, b.Restart))
	})
	b, _ := json.Marshal(struct {
		Node    cluster.Node
		Health  cluster.NodeHealth
		Agent   string
		Workers []digestWorker
		Images  []cluster.ImageStatus
	}{rec.Node, rec.Health, rec.Agent, ws, imgs})
	h := fnv.New64a()
	_, _ = h.Write(b)
	return rec, h.Sum64() | 1 // never 0, the digest of an unreadable record
}

// compactNodeRecord makes a decoded record as small as it can be kept: the mirror keeps one
// per node for as long as the node reports, and views and events point into it. The
// workers' slice takes its exact length (the decoder's append growth left room for up to
// twice as many), and the strings every node repeats (job and link names, states, exit
// reasons, the data center and rack) are interned: one copy each in the process, not one
// per worker per record.
func compactNodeRecord(rec *cluster.NodeRecord) {
	in := func(s *string) {
		if *s != "" {
			*s = unique.Make(*s).Value()
		}
	}
	in(&rec.Node.DC)
	in(&rec.Node.Rack)
	if l := rec.Node.Labels; l != nil {
		// The decoder makes every map with room for 64 entries: 7 KiB a node, 75 MiB at
		// ten thousand nodes, for the two or three labels a node has.
		exact := make(map[string]string, len(l))
		for k, v := range l {
			in(&k)
			in(&v)
			exact[k] = v
		}
		rec.Node.Labels = exact
	}
	if len(rec.Workers) > 0 {
		rec.Workers = slices.Clip(append(make([]cluster.WorkerStatus, 0, len(rec.Workers)), rec.Workers...))
	}
	for i := range rec.Workers {
		w := &rec.Workers[i]
		in(&w.Key.Job)
		in(&w.Key.Link)
		in(&w.State)
		in(&w.ExitReason)
	}
}

// digestWorker is what planning reads of a worker's status.
type digestWorker struct {
	Key            cluster.WorkerKey
	State          string
	RecentRestarts int
	Generation     int64
	Restart        int64
}

// TenantView is a tenant with what its jobs ask for.
func TenantView(jobs map[string]Job, t cluster.Tenant) api.TenantView {
	tv := api.TenantView{Tenant: t}
	for _, j := range jobs {
		if j.rec.Spec.Tenant == t.Name {
			n := j.rec.Spec.TotalWorkers()
			tv.Jobs++
			tv.UsedWorkers += n
			tv.UsedMemory += cluster.Bytes(n) * j.rec.Spec.Resources.Memory
		}
	}
	return tv
}
