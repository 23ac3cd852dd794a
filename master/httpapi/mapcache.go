package httpapi

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/master"
)

// mapCache keeps what the last map was made from, so that the next one decodes and draws
// only what changed: node records change with every memory reading.
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
	v       map[string]*master.DCImpact
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
func jobsDigest(v *master.View) uint64 {
	h := fnv.New64a()
	names := slices.Collect(maps.Keys(v.Jobs()))
	for name := range v.Routers() {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		rec, _ := v.Record(name)
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00", name, rec.Spec.Tenant, rec.Spec.Resources.Memory)
	}
	return h.Sum64()
}

// impactKey is everything the data-center checks depend on.
type impactKey struct {
	jobs, confs, assigns, dcs uint64
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
func (c *mapCache) build(m *master.Master, st master.Stamp) *mapBase {
	// The records are the mirror's, decoded once as they arrived (unreadable ones left out):
	// the map keeps no copy of its own.
	records, assignEntries := m.NodeRecords(), m.AssignmentEntries()
	for id, e := range records {
		if cn, ok := c.nodes[id]; ok && cn.rev == e.Rev && cn.owner == e.Owner {
			continue
		}
		c.nodes[id] = &cachedNode{rev: e.Rev, owner: e.Owner, rec: e.Record, plan: planDigest(e.Record)}
	}
	for id := range c.nodes {
		if _, ok := records[id]; !ok {
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
	workers := 0
	nodes := make(map[string]master.NodeEntry, len(c.nodes))
	for id, cn := range c.nodes {
		nodes[id] = master.NodeEntry{Owner: cn.owner, Record: cn.rec}
		workers += len(cn.rec.Workers)
	}
	v := m.ViewOf(nodes)
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
	b.jobs = mapJobs(v, assigned, m.Snapshot().Unplaced())
	b.dcs = mapDCs(v, assigned, c.dcImpacts(m, v, assigns, st))
	b.impacts = c.impacts.gen
	b.tenants = mapTenants(v, m.TenantEntries())
	return b
}

// dcImpacts returns the data-center checks, planned again only when their input changed.
func (c *mapCache) dcImpacts(m *master.Master, v *master.View, assigns map[string]cluster.NodeAssignment, st master.Stamp) map[string]*master.DCImpact {
	key := impactKey{jobs: st[0], confs: st[2], assigns: st[3], dcs: st[5], nodes: len(c.nodes)}
	for _, cn := range c.nodes {
		key.plans += cn.plan
	}
	ic := &c.impacts
	if ic.done && ic.key == key || ic.running {
		return ic.v
	}
	if ic.mu == nil {
		ic.v, ic.key, ic.done = m.DCImpacts(v, assigns), key, true
		ic.gen++
		return ic.v
	}
	// The view and assignments of a build are not changed after it: the plans may read
	// them while the next build makes its own.
	ic.running = true
	go func() {
		res := m.DCImpacts(v, assigns)
		ic.mu.Lock()
		defer ic.mu.Unlock()
		ic.v, ic.key, ic.done, ic.running = res, key, true, false
		ic.gen++
	}()
	return ic.v
}

// drawNodes draws every live node, and every node that is gone while the plan still holds
// workers there, with its workers as cells; a node whose inputs did not change keeps its
// entry.
func (c *mapCache) drawNodes(v *master.View) []*mapNode {
	jobs := jobsDigest(v)
	ids := slices.Collect(maps.Keys(v.Nodes()))
	for id, ca := range c.assigns {
		if _, live := v.Nodes()[id]; !live && slices.ContainsFunc(ca.a.Workers, func(w cluster.WorkerAssignment) bool { return !w.Stop }) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]*mapNode, 0, len(ids))
	drawn := make(map[string]*drawnNode, len(ids))
	for _, id := range ids {
		key := drawKey{nodeRev: -1, assignRev: -1, draining: v.Confs()[id].Draining, jobs: jobs}
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
