package scheduler

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// The cluster map of GET /v1/watch is built in two steps: a mapBase from the mirrors, once
// per change whoever watches, then one encoding of it per viewer (the admin, or a tenant
// who sees only its own jobs).

// stamp tells whether the mirrors changed: for each one the number of entries and the
// largest and the sum of their store revisions. Every write gives an entry a revision above
// all earlier ones, and a removal changes the count.
type stamp [6][3]int64

func (m *Master) stamp() stamp {
	var s stamp
	for i, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs} {
		mr.mu.Lock()
		s[i][0] = int64(len(mr.entries))
		for _, e := range mr.entries {
			s[i][1] = max(s[i][1], e.ModRev)
			s[i][2] += e.ModRev
		}
		mr.mu.Unlock()
	}
	return s
}

// mapBase is everything every viewer's map of one moment is made from.
type mapBase struct {
	stamp   stamp
	impacts int // the generation of the data-center checks it holds
	v       *view
	nodes   []*mapNode // sorted by id, lost nodes included; unchanged nodes keep their pointer
	jobs    []api.MapJob
	dcs     []api.MapDC
	tenants []api.TenantView
}

// mapNode is a node with the tenant of each of its cells, for scoping.
type mapNode struct {
	api.MapNode
	tenants []string
}

// mapCache keeps what the last map was made from, so that the next one decodes and draws
// only what changed: node records change with every memory reading, and decoding a
// thousand of them is most of the cost of a map made from scratch.
type mapCache struct {
	nodes   map[string]*cachedNode
	assigns map[string]*cachedAssign
	drawn   map[string]*drawnNode
	impacts impactsCache
}

// impactsCache holds the data-center checks. Planning every data center's failure takes a
// few plans, so a cache that has mu plans them in the background, and a map goes out at
// once with the checks of the previous plan; without mu (tests) it plans in place.
type impactsCache struct {
	mu      *sync.Mutex // guards the cache; held by build's caller
	key     impactKey
	v       map[string]*dcImpact
	done    bool // v is of key
	running bool
	gen     int // grows with every new v
}

type cachedNode struct {
	rev, owner int64
	rec        cluster.NodeRecord
	// plan digests what placement reads of the node: its spec, health and evicted
	// workers; memory readings do not change it.
	plan uint64
}

type cachedAssign struct {
	rev int64
	a   cluster.NodeAssignment
}

// drawnNode is a node of the map with what it was drawn from.
type drawnNode struct {
	from drawKey
	n    *mapNode
}

// drawKey is everything a node's entry depends on: its record, its assignment, whether it
// drains, and what it reads of the job records (their tenants and memory requests: scaling
// a job does not draw every node again).
type drawKey struct {
	nodeRev, owner, assignRev int64
	draining                  bool
	jobs                      uint64
}

// jobsDigest digests what drawing a node reads of the jobs: each one's tenant and memory.
func jobsDigest(v *view) uint64 {
	h := fnv.New64a()
	names := slices.Collect(maps.Keys(v.jobs))
	for name := range v.routers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		rec, _ := v.record(name)
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", name, rec.Spec.Tenant, rec.Spec.Resources.Memory)
	}
	return h.Sum64()
}

// impactKey is everything the data-center checks depend on.
type impactKey struct {
	jobs, confs, assigns, dcs [3]int64
	nodes                     int
	plans                     uint64
}

func newMapCache() *mapCache {
	return &mapCache{nodes: map[string]*cachedNode{}, assigns: map[string]*cachedAssign{}, drawn: map[string]*drawnNode{}}
}

func planDigest(rec cluster.NodeRecord) uint64 {
	var evicted []cluster.WorkerKey
	for _, w := range rec.Workers {
		if w.State == cluster.WorkerEvicted {
			evicted = append(evicted, w.Key)
		}
	}
	b, _ := json.Marshal(struct {
		Node    cluster.Node
		Health  cluster.NodeHealth
		Evicted []cluster.WorkerKey
	}{rec.Node, rec.Health, evicted})
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// build makes the map of the mirrors as they are (stamped st), reusing what did not change.
func (c *mapCache) build(m *Master, st stamp) *mapBase {
	nodeEntries, assignEntries := m.nodes.snapshot(), m.assigns.snapshot()
	for id, e := range nodeEntries {
		if cn, ok := c.nodes[id]; ok && cn.rev == e.ModRev && cn.owner == e.Owner {
			continue
		}
		var rec cluster.NodeRecord
		if json.Unmarshal(e.Value, &rec) != nil || rec.Node.ID != id {
			delete(c.nodes, id) // the leader logs unreadable records
			continue
		}
		c.nodes[id] = &cachedNode{rev: e.ModRev, owner: e.Owner, rec: rec, plan: planDigest(rec)}
	}
	for id := range c.nodes {
		if _, ok := nodeEntries[id]; !ok {
			delete(c.nodes, id)
		}
	}
	for id, e := range assignEntries {
		if ca, ok := c.assigns[id]; ok && ca.rev == e.ModRev {
			continue
		}
		var a cluster.NodeAssignment
		if len(e.Value) > 0 && json.Unmarshal(e.Value, &a) != nil {
			delete(c.assigns, id)
			continue
		}
		c.assigns[id] = &cachedAssign{rev: e.ModRev, a: a}
	}
	for id := range c.assigns {
		if _, ok := assignEntries[id]; !ok {
			delete(c.assigns, id)
		}
	}
	v := decodeView(m.log, m.jobs.snapshot(), nil, m.confs.snapshot(), m.dcs.snapshot())
	workers := 0
	for _, cn := range c.nodes {
		workers += len(cn.rec.Workers)
	}
	v.nodes, v.sessions = make(map[string]cluster.NodeRecord, len(c.nodes)), make(map[string]int64, len(c.nodes))
	v.statuses, v.copies = make(map[cluster.WorkerKey]nodeWorker, workers), make([]nodeWorker, 0, workers)
	for id, cn := range c.nodes {
		v.addNode(id, cn.owner, cn.rec)
	}
	v.addRouters(m.cfg.RouterStore)
	assigns := make(map[string]cluster.NodeAssignment, len(c.assigns))
	assigned := make(map[cluster.WorkerKey]string, workers)
	for node, ca := range c.assigns {
		assigns[node] = ca.a
		for _, w := range ca.a.Workers {
			if !w.Stop {
				assigned[w.Key] = node
			}
		}
	}
	b := &mapBase{stamp: st, v: v}
	b.nodes = c.drawNodes(v)
	b.jobs = mapJobs(v, assigned, m.unplaced(v, assigned))
	b.dcs = mapDCs(v, assigned, c.dcImpacts(m, v, assigns, st))
	b.impacts = c.impacts.gen
	b.tenants = mapTenants(v, m.tenants.snapshot())
	return b
}

// dcImpacts returns the data-center checks, planned again only when their input changed.
func (c *mapCache) dcImpacts(m *Master, v *view, assigns map[string]cluster.NodeAssignment, st stamp) map[string]*dcImpact {
	key := impactKey{jobs: st[0], confs: st[2], assigns: st[3], dcs: st[5], nodes: len(c.nodes)}
	for _, cn := range c.nodes {
		key.plans += cn.plan
	}
	ic := &c.impacts
	if ic.done && ic.key == key || ic.running {
		return ic.v
	}
	if ic.mu == nil {
		ic.v, ic.key, ic.done = m.dcImpacts(v, assigns), key, true
		ic.gen++
		return ic.v
	}
	// The view and assignments of a build are not changed after it: the plans may read
	// them while the next build makes its own.
	ic.running = true
	go func() {
		res := m.dcImpacts(v, assigns)
		ic.mu.Lock()
		defer ic.mu.Unlock()
		ic.v, ic.key, ic.done, ic.running = res, key, true, false
		ic.gen++
	}()
	return ic.v
}

func tenantOf(v *view, job string) string {
	if rec, ok := v.record(job); ok {
		return rec.Spec.Tenant
	}
	return ""
}

// drawNodes draws every live node, and every node that is gone while the plan still holds
// workers there, with its workers as cells; a node whose inputs did not change keeps its
// entry.
func (c *mapCache) drawNodes(v *view) []*mapNode {
	jobs := jobsDigest(v)
	ids := slices.Collect(maps.Keys(v.nodes))
	for id, ca := range c.assigns {
		if _, live := v.nodes[id]; !live && slices.ContainsFunc(ca.a.Workers, func(w cluster.WorkerAssignment) bool { return !w.Stop }) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]*mapNode, 0, len(ids))
	drawn := make(map[string]*drawnNode, len(ids))
	for _, id := range ids {
		key := drawKey{nodeRev: -1, assignRev: -1, draining: v.confs[id].Draining, jobs: jobs}
		if cn, ok := c.nodes[id]; ok {
			key.nodeRev, key.owner = cn.rev, cn.owner
		}
		var a cluster.NodeAssignment
		if ca, ok := c.assigns[id]; ok {
			key.assignRev, a = ca.rev, ca.a
		}
		d, ok := c.drawn[id]
		if !ok || d.from != key {
			d = &drawnNode{from: key, n: drawNode(v, id, a)}
		}
		drawn[id] = d
		out = append(out, d.n)
	}
	c.drawn = drawn
	return out
}

// drawNode draws one node from its record (none for a lost node) and its assignment.
func drawNode(v *view, id string, a cluster.NodeAssignment) *mapNode {
	var keys []cluster.WorkerKey
	for _, w := range a.Workers {
		if !w.Stop {
			keys = append(keys, w.Key)
		}
	}
	slices.SortFunc(keys, cluster.WorkerKey.Compare)
	n := &mapNode{}
	rec, live := v.nodes[id]
	if !live {
		n.MapNode = api.MapNode{ID: id, DC: a.DC, Rack: a.Rack, State: api.NodeLost, Slots: len(keys), Health: api.NodeLost, Cells: []api.Cell{}}
		for _, k := range keys {
			n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.NodeLost})
			n.tenants = append(n.tenants, tenantOf(v, k.Job))
		}
		return n
	}
	nd := rec.Node
	health := rec.Health.State
	if health == "" {
		health = cluster.HealthHealthy
	}
	n.MapNode = api.MapNode{ID: id, DC: nd.DC, Rack: nd.Rack, State: api.NodeUp, Slots: nd.Slots, Throttled: rec.Health.Throttled,
		Health: health, Reason: rec.Health.Reason, Draining: v.confs[id].Draining, Memory: nd.Memory, CPU: nd.CPU,
		Labels: nd.Labels, Isolation: rec.Isolation, Cells: []api.Cell{}}
	here := make(map[cluster.WorkerKey]cluster.WorkerStatus, len(rec.Workers))
	var used cluster.Bytes
	for _, w := range rec.Workers {
		here[w.Key] = w
		used += w.Memory
	}
	mine := make(map[cluster.WorkerKey]bool, len(keys))
	for _, k := range keys {
		mine[k] = true
		state := api.WorkerPending
		if s, ok := here[k]; ok {
			state = s.State
		}
		if j, ok := v.record(k.Job); ok {
			n.MemoryRequested += j.Spec.Resources.Memory
		}
		n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: state})
		n.tenants = append(n.tenants, tenantOf(v, k.Job))
	}
	stopping := slices.Collect(maps.Keys(here))
	slices.SortFunc(stopping, cluster.WorkerKey.Compare)
	for _, k := range stopping {
		if !mine[k] {
			n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.CellStopping})
			n.tenants = append(n.tenants, tenantOf(v, k.Job))
		}
	}
	n.MemoryUsed = roundTo(used, nd.Memory/100)
	return n
}

func roundTo(b, unit cluster.Bytes) cluster.Bytes {
	if unit <= 0 {
		return b
	}
	return (b + unit/2) / unit * unit
}

// mapJobs lists every job with its summary and why its unplaced workers wait.
func mapJobs(v *view, assigned, unplaced map[cluster.WorkerKey]string) []api.MapJob {
	// summarize scans every reported copy; group them by job once.
	byJob := make(map[string][]nodeWorker, len(v.jobs)+len(v.routers))
	for _, c := range v.copies {
		byJob[c.status.Key.Job] = append(byJob[c.status.Key.Job], c)
	}
	out := make([]api.MapJob, 0, len(v.jobs))
	for _, name := range slices.Sorted(maps.Keys(v.jobs)) {
		rec := v.jobs[name].rec
		sv := &view{statuses: v.statuses, copies: byJob[name]}
		j := api.MapJob{JobSummary: summarize(sv, rec, assigned, unplaced), Links: rec.Spec.Links}
		keys := rec.Spec.Keys()
		if rr, ok := v.routers[name+routerSuffix]; ok {
			j.Router = rr.Spec.Name
			keys = append(keys, rr.Spec.Keys()...)
		}
		count := map[string]int{}
		for _, k := range keys {
			if r, ok := unplaced[k]; ok {
				count[r]++
			}
		}
		for _, r := range slices.Sorted(maps.Keys(count)) {
			j.Reasons = append(j.Reasons, api.ReasonCount{Reason: r, Workers: count[r]})
		}
		out = append(out, j)
	}
	return out
}

// mapDCs is GET /v1/dcs with what failing each active data center would do.
func mapDCs(v *view, assigned map[cluster.WorkerKey]string, impacts map[string]*dcImpact) []api.MapDC {
	perNode := map[string]int{}
	for _, node := range assigned {
		perNode[node]++
	}
	type sums struct{ nodes, slots, free, workers int }
	per := map[string]*sums{}
	for id, rec := range v.nodes {
		s := per[rec.Node.DC]
		if s == nil {
			s = &sums{}
			per[rec.Node.DC] = s
		}
		s.nodes++
		s.slots += rec.Node.Slots
		s.workers += perNode[id]
		free := max(rec.Node.Slots-perNode[id]-rec.Health.Throttled, 0)
		if v.confs[id].Draining {
			free = 0
		}
		s.free += free
	}
	names := slices.Collect(maps.Keys(v.dcs))
	for dc := range per {
		if _, ok := v.dcs[dc]; !ok {
			names = append(names, dc) // seen before the leader recorded it
		}
	}
	slices.Sort(names)
	out := make([]api.MapDC, 0, len(names))
	for _, name := range names {
		d := api.MapDC{DCView: api.DCView{Name: name, State: v.dcState(name), Since: v.dcs[name].Since}}
		if s := per[name]; s != nil {
			d.Nodes, d.Slots, d.SlotsFree, d.Workers = s.nodes, s.slots, s.free, s.workers
		}
		if imp, ok := impacts[name]; ok {
			f := imp.DCFailover
			d.IfFailed = &f
		}
		out = append(out, d)
	}
	return out
}

// mapTenants is every tenant with its quota use.
func mapTenants(v *view, entries map[string]coord.Entry) []api.TenantView {
	out := make([]api.TenantView, 0, len(entries))
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		var t cluster.TenantRecord
		if json.Unmarshal(entries[name].Value, &t) != nil || t.Name != name {
			continue
		}
		tv := api.TenantView{Tenant: t.Tenant}
		for _, j := range v.jobs {
			if j.rec.Spec.Tenant == name {
				n := j.rec.Spec.TotalWorkers()
				tv.Jobs++
				tv.UsedWorkers += n
				tv.UsedMemory += cluster.Bytes(n) * j.rec.Spec.Resources.Memory
			}
		}
		out = append(out, tv)
	}
	return out
}

// scopeNode is a node as p may see it: a tenant sees other tenants' workers as
// anonymous cells.
func scopeNode(n *mapNode, p principal) api.MapNode {
	if p.admin {
		return n.MapNode
	}
	out := n.MapNode
	out.Cells = make([]api.Cell, len(n.Cells))
	for i, c := range n.Cells {
		if n.tenants[i] != p.tenant {
			c = api.Cell{State: c.State}
		}
		out.Cells[i] = c
	}
	return out
}

// scoped returns the lists of the base that p may see: a tenant sees its own jobs and
// tenant, and only its own jobs among those a data center's failure would hurt.
func (b *mapBase) scoped(p principal) (jobs []api.MapJob, dcs []api.MapDC, tenants []api.TenantView) {
	if p.admin {
		return b.jobs, b.dcs, b.tenants
	}
	for _, j := range b.jobs {
		if j.Tenant == p.tenant {
			jobs = append(jobs, j)
		}
	}
	dcs = make([]api.MapDC, len(b.dcs))
	for i, d := range b.dcs {
		dcs[i] = d
		if d.IfFailed != nil {
			f := *d.IfFailed
			f.Jobs = nil
			for _, j := range d.IfFailed.Jobs {
				if tenantOf(b.v, j.Job) == p.tenant {
					f.Jobs = append(f.Jobs, j)
				}
			}
			dcs[i].IfFailed = &f
		}
	}
	for _, t := range b.tenants {
		if t.Name == p.tenant {
			tenants = append(tenants, t)
		}
	}
	return jobs, dcs, tenants
}
