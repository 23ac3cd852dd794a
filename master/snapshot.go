package master

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/placement"
)

// What the HTTP API (package master/httpapi) reads of a master: its published Snapshot, the
// job records as the store has them, the mirrors' entries the console's map is drawn from,
// and the master's own state (leadership, the store's reachability). Everything returned is
// shared and read-only: callers must not modify it. Nothing here reaches into the leader's
// reconcile; planning for the API (why workers are unplaced, what failing a data center
// would do) is done here, over a view, as any master can.

// ID is the master's name in the election.
func (m *Master) ID() string { return m.cfg.ID }

// Store is the coordination store the master runs on.
func (m *Master) Store() coord.Store { return m.store }

// Logger is the master's logger.
func (m *Master) Logger() *slog.Logger { return m.log }

// Registry is where the master's metrics are registered (nil for none).
func (m *Master) Registry() prometheus.Registerer { return m.cfg.Registry }

// Events is the cluster's event log: queries, waits for new events, and Emit.
func (m *Master) Events() *eventlog.Log { return m.events }

// Stopped is closed when Run returns: streaming answers end then.
func (m *Master) Stopped() <-chan struct{} { return m.quit }

// StoreDownSince is when this master lost the coordination store, or zero while it
// reaches it.
func (m *Master) StoreDownSince() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.conn.down
}

// NodeRegistered reports whether node id is live (registered in the store) as the mirrors
// have it.
func (m *Master) NodeRegistered(id string) bool { return m.nodes.has(id) }

// NodeConfigured reports whether node id has operator settings in the store.
func (m *Master) NodeConfigured(id string) bool { return m.confs.has(id) }

// TenantEntries are the tenants' records as the mirror holds them, by name.
func (m *Master) TenantEntries() map[string]coord.Entry { return m.tenants.snapshot() }

// NodeEntries are the live nodes' entries, by node id, without their values: the mirror
// keeps each record decoded only (NodeRecords).
func (m *Master) NodeEntries() map[string]coord.Entry { return m.nodes.snapshot() }

// NodeRecords are the live nodes' records as the mirror decoded them, by node id; an entry
// whose record does not decode is left out (the leader logs it). The records are shared:
// callers must not modify them.
func (m *Master) NodeRecords() map[string]NodeEntry {
	decoded := m.nodes.decodedSnapshot()
	out := make(map[string]NodeEntry, len(decoded))
	for id, d := range decoded {
		if rec, ok := d.v.(cluster.NodeRecord); ok {
			out[id] = NodeEntry{Owner: d.owner, Rev: d.rev, Record: rec}
		}
	}
	return out
}

// AssignmentEntries are the nodes' assignments as the mirror holds them, by node id.
func (m *Master) AssignmentEntries() map[string]coord.Entry { return m.assigns.snapshot() }

// PinImage resolves a docker job's image to a digest with the master's resolver (see
// pinImage); nil for a job that needs none.
func (m *Master) PinImage(ctx context.Context, spec *cluster.JobSpec, gen int64) *cluster.ImagePin {
	ring, _ := m.Keyring()
	return pinImage(ctx, m.cfg.Resolver, m.store, ring, spec, gen)
}

// NodeEntry is a live node's record with the store session that owns its entry and the
// entry's revision.
type NodeEntry struct {
	Owner  int64
	Rev    int64
	Record cluster.NodeRecord
}

// ViewOf is the jobs, node settings and data centers as the mirrors hold them now, decoded,
// with the given node records and the output routers of mirrored jobs: the console's map
// keeps the node records it decoded across calls, and passes them in.
func (m *Master) ViewOf(nodes map[string]NodeEntry) *View {
	v := decodeView(m.log, m.jobs.snapshot(), nil, m.confs.snapshot(), m.dcs.snapshot())
	v.setCaps(m.log, m.tenants.snapshot())
	workers := 0
	for _, n := range nodes {
		workers += len(n.Record.Workers)
	}
	v.nodes, v.sessions = make(map[string]cluster.NodeRecord, len(nodes)), make(map[string]int64, len(nodes))
	v.statuses, v.copies = make(map[cluster.WorkerKey]nodeWorker, workers), make([]nodeWorker, 0, workers)
	for id, n := range nodes {
		v.addNode(id, n.Owner, n.Record)
	}
	v.addRouters(m.cfg.RouterStore)
	return v
}

// Record is the job's record.
func (j Job) Record() cluster.JobRecord { return j.rec }

// Version is the store version of the job's record.
func (j Job) Version() int64 { return j.version }

// View is the view the snapshot was made from.
func (st *Snapshot) View() *View { return st.v }

// Unplaced is why each worker no node takes waits, by worker.
func (st *Snapshot) Unplaced() map[cluster.WorkerKey]string { return st.unplaced }

// Why is the placement engine's explanation for an unplaced worker it found no node for:
// nil for a worker that is placed, held or waits for a reason of its master's (see Unplaced).
func (st *Snapshot) Why(k cluster.WorkerKey) *placement.Explanation { return st.why[k] }

// Jobs are the job records of the view, by name.
func (v *View) Jobs() map[string]Job { return v.jobs }

// Nodes are the live nodes' records, by id.
func (v *View) Nodes() map[string]cluster.NodeRecord { return v.nodes }

// Confs are the operator's node settings, by node id.
func (v *View) Confs() map[string]cluster.NodeConf { return v.confs }

// DCs are the data centers' records, by name.
func (v *View) DCs() map[string]cluster.DCRecord { return v.dcs }

// DCState is the state of data center dc (see dcState).
func (v *View) DCState(dc string) string { return v.dcState(dc) }

// Record finds a job, or an output router job (JOB.router), by name.
func (v *View) Record(name string) (cluster.JobRecord, bool) { return v.record(name) }

// Router is the output router job of the mirrored job named job.
func (v *View) Router(job string) (cluster.JobRecord, bool) {
	r, ok := v.routers[job+routerSuffix]
	return r, ok
}

// Routers are the output router jobs, by router job name.
func (v *View) Routers() map[string]cluster.JobRecord { return v.routers }

// TenantOf is the tenant of a job, or of the mirrored job a router job runs for (tenantOf).
func (v *View) TenantOf(job string) string { return tenantOf(v.jobs, job) }

// Status is what an agent reports of worker k, and the node that reports it; where two
// agents report it, the copy in a running state.
func (v *View) Status(k cluster.WorkerKey) (node string, s cluster.WorkerStatus, ok bool) {
	nw, ok := v.statuses[k]
	if !ok {
		return "", s, false
	}
	return nw.node, *nw.status, true
}

// Summaries are every job's summary, given where workers are assigned (stopping ones
// excluded) and why the unplaced ones wait.
func (v *View) Summaries(assigned, unplaced map[cluster.WorkerKey]string) map[string]api.JobSummary {
	// summarize scans every reported copy; group them by job once.
	byJob := make(map[string][]nodeWorker, len(v.jobs)+len(v.routers))
	for _, c := range v.copies {
		byJob[c.status.Key.Job] = append(byJob[c.status.Key.Job], c)
	}
	out := make(map[string]api.JobSummary, len(v.jobs))
	for name, j := range v.jobs {
		sv := &View{statuses: v.statuses, copies: byJob[name]}
		out[name] = summarize(sv, j.rec, assigned, unplaced)
	}
	return out
}
