package scheduler

import (
	"encoding/json"
	"maps"
	"slices"

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
	v       *view
	nodes   []mapNode // sorted by id, lost nodes included
	jobs    []api.MapJob
	dcs     []api.MapDC
	impacts map[string]*dcImpact // by data center, for every viewer
	tenants []api.TenantView
}

// mapNode is a node with the tenant of each of its cells, for scoping.
type mapNode struct {
	api.MapNode
	tenants []string
}

// buildBase reads the mirrors once. It is the expensive step: it decodes every record,
// explains unplaced workers and plans each data center's failure.
func (m *Master) buildBase(st stamp) *mapBase {
	v := m.view()
	assigns := map[string]cluster.NodeAssignment{}
	for node, e := range m.assigns.snapshot() {
		var a cluster.NodeAssignment
		if json.Unmarshal(e.Value, &a) == nil {
			assigns[node] = a
		}
	}
	assigned := map[cluster.WorkerKey]string{}
	for node, a := range assigns {
		for _, w := range a.Workers {
			if !w.Stop {
				assigned[w.Key] = node
			}
		}
	}
	unplaced := m.unplaced(v, assigned)
	b := &mapBase{stamp: st, v: v}
	b.nodes = mapNodes(v, assigns)
	b.jobs = mapJobs(v, assigned, unplaced)
	b.impacts = m.dcImpacts(v, assigns)
	b.dcs = mapDCs(v, assigned, b.impacts)
	b.tenants = mapTenants(v, m.tenants.snapshot())
	return b
}

func tenantOf(v *view, job string) string {
	if rec, ok := v.record(job); ok {
		return rec.Spec.Tenant
	}
	return ""
}

// mapNodes draws every live node, and every node that is gone while the plan still holds
// workers there, with its workers as cells.
func mapNodes(v *view, assigns map[string]cluster.NodeAssignment) []mapNode {
	copies := map[string]map[cluster.WorkerKey]cluster.WorkerStatus{}
	for _, c := range v.copies {
		if copies[c.node] == nil {
			copies[c.node] = map[cluster.WorkerKey]cluster.WorkerStatus{}
		}
		copies[c.node][c.status.Key] = c.status
	}
	ids := slices.Collect(maps.Keys(v.nodes))
	for id, a := range assigns {
		if _, live := v.nodes[id]; !live && slices.ContainsFunc(a.Workers, func(w cluster.WorkerAssignment) bool { return !w.Stop }) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := make([]mapNode, 0, len(ids))
	for _, id := range ids {
		var n mapNode
		var keys []cluster.WorkerKey
		for _, w := range assigns[id].Workers {
			if !w.Stop {
				keys = append(keys, w.Key)
			}
		}
		slices.SortFunc(keys, cluster.WorkerKey.Compare)
		rec, live := v.nodes[id]
		if !live {
			a := assigns[id]
			n.MapNode = api.MapNode{ID: id, DC: a.DC, Rack: a.Rack, State: api.NodeLost, Slots: len(keys), Health: api.NodeLost}
			for _, k := range keys {
				n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.NodeLost})
				n.tenants = append(n.tenants, tenantOf(v, k.Job))
			}
			out = append(out, n)
			continue
		}
		nd := rec.Node
		health := rec.Health.State
		if health == "" {
			health = cluster.HealthHealthy
		}
		n.MapNode = api.MapNode{ID: id, DC: nd.DC, Rack: nd.Rack, State: api.NodeUp, Slots: nd.Slots, Throttled: rec.Health.Throttled,
			Health: health, Reason: rec.Health.Reason, Draining: v.confs[id].Draining, Memory: nd.Memory, CPU: nd.CPU,
			Labels: nd.Labels, Isolation: rec.Isolation, Cells: []api.Cell{}}
		here := copies[id]
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
		var used cluster.Bytes
		for _, w := range rec.Workers {
			used += w.Memory
		}
		n.MemoryUsed = roundTo(used, nd.Memory/100)
		out = append(out, n)
	}
	return out
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
	byJob := map[string][]nodeWorker{}
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

// scoped returns the base as p may see it: a tenant sees its own jobs and tenant, and
// the map with other tenants' workers as anonymous cells.
func (b *mapBase) scoped(p principal) (nodes []api.MapNode, jobs []api.MapJob, dcs []api.MapDC, tenants []api.TenantView) {
	if p.admin {
		nodes = make([]api.MapNode, len(b.nodes))
		for i, n := range b.nodes {
			nodes[i] = n.MapNode
		}
		return nodes, b.jobs, b.dcs, b.tenants
	}
	nodes = make([]api.MapNode, len(b.nodes))
	for i, n := range b.nodes {
		nodes[i] = n.MapNode
		nodes[i].Cells = make([]api.Cell, len(n.Cells))
		for c, cell := range n.Cells {
			if n.tenants[c] != p.tenant {
				cell = api.Cell{State: cell.State}
			}
			nodes[i].Cells[c] = cell
		}
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
	return nodes, jobs, dcs, tenants
}
