package scheduler

import (
	"encoding/json"
	"log/slog"
	"maps"
	"reflect"
	"slices"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// view is the cluster as one reconcile sees it, decoded from the mirrors.
type view struct {
	jobs     map[string]jobEntry
	routers  map[string]cluster.JobRecord // output routers of mirrored jobs, by router job name
	nodes    map[string]cluster.NodeRecord
	sessions map[string]int64 // the store session owning each node's entry
	confs    map[string]cluster.NodeConf
	dcs      map[string]cluster.DCRecord
	statuses map[cluster.WorkerKey]nodeWorker // what agents report, by worker
	copies   []nodeWorker                     // every worker every agent reports
}

type jobEntry struct {
	rec     cluster.JobRecord
	version int64
}

// nodeWorker is a worker status with the node that reports it.
type nodeWorker struct {
	node   string
	status cluster.WorkerStatus
}

func decodeView(log *slog.Logger, jobs, nodes, confs, dcs map[string]coord.Entry) *view {
	v := &view{
		dcs:      make(map[string]cluster.DCRecord, len(dcs)),
		jobs:     make(map[string]jobEntry, len(jobs)),
		routers:  map[string]cluster.JobRecord{},
		nodes:    make(map[string]cluster.NodeRecord, len(nodes)),
		sessions: make(map[string]int64, len(nodes)),
		confs:    make(map[string]cluster.NodeConf, len(confs)),
		statuses: map[cluster.WorkerKey]nodeWorker{},
	}
	for name, e := range jobs {
		var rec cluster.JobRecord
		if err := json.Unmarshal(e.Value, &rec); err != nil || rec.Spec.Name != name {
			log.Warn("ignoring unreadable job record", "job", name, "err", err)
			continue
		}
		v.jobs[name] = jobEntry{rec: rec, version: e.Version}
	}
	for id, e := range nodes {
		var rec cluster.NodeRecord
		if err := json.Unmarshal(e.Value, &rec); err != nil || rec.Node.ID != id {
			log.Warn("ignoring unreadable node record", "node", id, "err", err)
			continue
		}
		v.addNode(id, e.Owner, rec)
	}
	for name, e := range dcs {
		var d cluster.DCRecord
		if err := json.Unmarshal(e.Value, &d); err != nil || d.Name != name {
			log.Warn("ignoring unreadable data-center record", "dc", name, "err", err)
			continue
		}
		v.dcs[name] = d
	}
	for id, e := range confs {
		var c cluster.NodeConf
		if len(e.Value) == 0 {
			continue
		}
		if err := json.Unmarshal(e.Value, &c); err != nil {
			log.Warn("ignoring unreadable node settings", "node", id, "err", err)
			continue
		}
		v.confs[id] = c
	}
	return v
}

// addNode adds a node's live record to the view: the node and every worker it reports.
func (v *view) addNode(id string, owner int64, rec cluster.NodeRecord) {
	v.nodes[id] = rec
	v.sessions[id] = owner
	for _, w := range rec.Workers {
		nw := nodeWorker{node: id, status: w}
		// Where two agents report one worker (an old copy still stopping), the one in
		// a running state wins.
		if old, ok := v.statuses[w.Key]; !ok || old.status.State != cluster.WorkerRunning {
			v.statuses[w.Key] = nw
		}
		v.copies = append(v.copies, nw)
	}
}

// isolationLabel is the node label an agent sets for each driver it offers.
func isolationLabel(mode string) string { return "isolation/" + mode }

// schedulable returns the nodes as placement sees them: health throttling and operator
// settings folded into the node.
func (v *view) schedulable() []cluster.Node {
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
func (v *view) runningJobs() []cluster.JobSpec {
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

// avoid maps each job to the nodes noted for its crash loops.
func (v *view) avoid() map[string][]string {
	out := map[string][]string{}
	for id, c := range v.confs {
		for _, job := range c.Avoid {
			out[job] = append(out[job], id)
		}
	}
	return out
}

// view decodes the mirrors.
func (m *Master) view() *view {
	v := decodeView(m.log, m.jobs.snapshot(), m.nodes.snapshot(), m.confs.snapshot(), m.dcs.snapshot())
	v.addRouters(m.cfg.RouterStore)
	return v
}

// nodeRelevant tells whether a node record changed in a way planning cares about: the
// node, its health, or which workers it runs in which state. Memory readings, pids and
// timestamps change all the time and do not matter.
func nodeRelevant(old, new []byte) bool {
	var a, b cluster.NodeRecord
	if json.Unmarshal(old, &a) != nil || json.Unmarshal(new, &b) != nil {
		return true
	}
	if a.Health != b.Health || a.Agent != b.Agent || !reflect.DeepEqual(a.Node, b.Node) || len(a.Workers) != len(b.Workers) {
		return true
	}
	type key struct {
		k       cluster.WorkerKey
		state   string
		crashes int
	}
	seen := make(map[key]int, len(a.Workers))
	for _, w := range a.Workers {
		seen[key{w.Key, w.State, w.RecentRestarts}]++
	}
	for _, w := range b.Workers {
		k := key{w.Key, w.State, w.RecentRestarts}
		if seen[k] == 0 {
			return true
		}
		seen[k]--
	}
	return false
}

// tenantView is a tenant with what its jobs ask for.
func (v *view) tenantView(t cluster.Tenant) api.TenantView {
	tv := api.TenantView{Tenant: t}
	for _, j := range v.jobs {
		if j.rec.Spec.Tenant == t.Name {
			n := j.rec.Spec.TotalWorkers()
			tv.Jobs++
			tv.UsedWorkers += n
			tv.UsedMemory += cluster.Bytes(n) * j.rec.Spec.Resources.Memory
		}
	}
	return tv
}
