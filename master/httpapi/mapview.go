package httpapi

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master"
)

// The cluster map of GET /v1/watch is built in two steps: a mapBase from the mirrors, once
// per change whoever watches, then one encoding of it per viewer (the admin, or a tenant
// who sees only its own jobs).

// mapBase is everything every viewer's map of one moment is made from.
type mapBase struct {
	stamp   master.Stamp
	impacts int // the generation of the data-center checks it holds
	v       *master.View
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

// drawNode draws one node from its record (none for a lost node) and its assignment.
func drawNode(v *master.View, id string, a cluster.NodeAssignment) *mapNode {
	var keys []cluster.WorkerKey
	for _, w := range a.Workers {
		if !w.Stop {
			keys = append(keys, w.Key)
		}
	}
	slices.SortFunc(keys, cluster.WorkerKey.Compare)
	n := &mapNode{}
	rec, live := v.Nodes()[id]
	if !live {
		n.MapNode = api.MapNode{ID: id, DC: a.DC, Rack: a.Rack, State: api.NodeLost, Slots: len(keys), Health: api.NodeLost, Cells: []api.Cell{}}
		for _, k := range keys {
			n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.NodeLost})
			n.tenants = append(n.tenants, v.TenantOf(k.Job))
		}
		return n
	}
	nd := rec.Node
	health := rec.Health.State
	if health == "" {
		health = cluster.HealthHealthy
	}
	n.MapNode = api.MapNode{ID: id, DC: nd.DC, Rack: nd.Rack, State: api.NodeUp, Slots: nd.Slots, Throttled: rec.Health.Throttled,
		Health: health, Reason: rec.Health.Reason, Draining: v.Confs()[id].Draining, Memory: nd.Memory, CPU: nd.CPU,
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
		if j, ok := v.Record(k.Job); ok {
			n.MemoryRequested += j.Spec.Resources.Memory
		}
		n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: state})
		n.tenants = append(n.tenants, v.TenantOf(k.Job))
	}
	stopping := slices.Collect(maps.Keys(here))
	slices.SortFunc(stopping, cluster.WorkerKey.Compare)
	for _, k := range stopping {
		if !mine[k] {
			n.Cells = append(n.Cells, api.Cell{Job: k.Job, Link: k.Link, Worker: k.Worker, State: api.CellStopping})
			n.tenants = append(n.tenants, v.TenantOf(k.Job))
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
func mapJobs(v *master.View, assigned, unplaced map[cluster.WorkerKey]string) []api.MapJob {
	sums := v.Summaries(assigned, unplaced)
	out := make([]api.MapJob, 0, len(v.Jobs()))
	for _, name := range slices.Sorted(maps.Keys(v.Jobs())) {
		rec := v.Jobs()[name].Record()
		j := api.MapJob{JobSummary: sums[name], Links: rec.Spec.Links}
		keys := rec.Spec.Keys()
		if rr, ok := v.Router(name); ok {
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
func mapDCs(v *master.View, assigned map[cluster.WorkerKey]string, impacts map[string]*master.DCImpact) []api.MapDC {
	perNode := map[string]int{}
	for _, node := range assigned {
		perNode[node]++
	}
	type sums struct{ nodes, slots, free, workers int }
	per := map[string]*sums{}
	for id, rec := range v.Nodes() {
		s := per[rec.Node.DC]
		if s == nil {
			s = &sums{}
			per[rec.Node.DC] = s
		}
		s.nodes++
		s.slots += rec.Node.Slots
		s.workers += perNode[id]
		free := max(rec.Node.Slots-perNode[id]-rec.Health.Throttled, 0)
		if v.Confs()[id].Draining {
			free = 0
		}
		s.free += free
	}
	names := slices.Collect(maps.Keys(v.DCs()))
	for dc := range per {
		if _, ok := v.DCs()[dc]; !ok {
			names = append(names, dc) // seen before the leader recorded it
		}
	}
	slices.Sort(names)
	out := make([]api.MapDC, 0, len(names))
	for _, name := range names {
		d := api.MapDC{DCView: api.DCView{Name: name, State: v.DCState(name), Since: v.DCs()[name].Since}}
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
func mapTenants(v *master.View, entries map[string]coord.Entry) []api.TenantView {
	out := make([]api.TenantView, 0, len(entries))
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		var t cluster.TenantRecord
		if json.Unmarshal(entries[name].Value, &t) != nil || t.Name != name {
			continue
		}
		out = append(out, master.TenantView(v.Jobs(), t.Tenant))
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
				if b.v.TenantOf(j.Job) == p.tenant {
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
