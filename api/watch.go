package api

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// GET /v1/watch streams the cluster as the caller may see it, as server-sent events
// (text/event-stream, gzip-encoded when the request accepts it): first an EventSnapshot
// holding a ClusterMap, then an EventDelta holding a ClusterDelta after every change,
// at most WatchInterval apart. A tenant's stream holds its own jobs only; other tenants'
// workers appear on the map as anonymous cells. A client that loses the stream connects
// again and starts from a new snapshot.
const (
	EventSnapshot = "snapshot"
	EventDelta    = "delta"
	// EventEnd closes a stream with a reason (an ErrorBody): the token stopped being valid.
	EventEnd = "end"
)

// WatchInterval is how often a stream looks for changes: a change reaches a watcher within
// about this long after the master's mirrors see it.
const WatchInterval = 100 * time.Millisecond

// Node states on the map.
const (
	NodeUp   = "up"
	NodeLost = "lost" // no live entry, yet the plan still holds workers there
)

// Cell states the map adds to the agents' worker states.
const (
	// CellStopping is a copy the node's agent still runs that the plan no longer wants
	// there (scaled in, moved, or its job killed).
	CellStopping = "stopping"
)

// ClusterMap is the whole cluster as one caller may see it.
type ClusterMap struct {
	// Version grows by one with every event of a stream.
	Version int64        `json:"version"`
	Master  MapMaster    `json:"master"`
	Viewer  Viewer       `json:"viewer"`
	DCs     []MapDC      `json:"dcs"`
	Nodes   []MapNode    `json:"nodes"`
	Jobs    []MapJob     `json:"jobs"`
	Tenants []TenantView `json:"tenants"`
}

// ClusterDelta is what changed since the stream's previous event: entries are replaced
// whole (by id, name or tenant name); Gone* lists the ones that left.
type ClusterDelta struct {
	Version     int64        `json:"version"`
	Master      *MapMaster   `json:"master,omitempty"`
	DCs         []MapDC      `json:"dcs,omitempty"`
	GoneDCs     []string     `json:"goneDcs,omitempty"`
	Nodes       []MapNode    `json:"nodes,omitempty"`
	GoneNodes   []string     `json:"goneNodes,omitempty"`
	Jobs        []MapJob     `json:"jobs,omitempty"`
	GoneJobs    []string     `json:"goneJobs,omitempty"`
	Tenants     []TenantView `json:"tenants,omitempty"`
	GoneTenants []string     `json:"goneTenants,omitempty"`
}

// Apply folds a delta into the map, as a client of the stream does.
func (m *ClusterMap) Apply(d ClusterDelta) {
	m.Version = d.Version
	if d.Master != nil {
		m.Master = *d.Master
	}
	m.DCs = applyList(m.DCs, d.DCs, d.GoneDCs, func(x MapDC) string { return x.Name })
	m.Nodes = applyList(m.Nodes, d.Nodes, d.GoneNodes, func(x MapNode) string { return x.ID })
	m.Jobs = applyList(m.Jobs, d.Jobs, d.GoneJobs, func(x MapJob) string { return x.Name })
	m.Tenants = applyList(m.Tenants, d.Tenants, d.GoneTenants, func(x TenantView) string { return x.Name })
}

func applyList[T any](cur, upsert []T, gone []string, key func(T) string) []T {
	if len(upsert) == 0 && len(gone) == 0 {
		return cur
	}
	drop := make(map[string]bool, len(gone)+len(upsert))
	for _, g := range gone {
		drop[g] = true
	}
	repl := make(map[string]T, len(upsert))
	for _, x := range upsert {
		repl[key(x)] = x
	}
	out := cur[:0:0]
	for _, x := range cur {
		k := key(x)
		if drop[k] {
			continue
		}
		if y, ok := repl[k]; ok {
			x = y
			delete(repl, k)
		}
		out = append(out, x)
	}
	for _, x := range upsert {
		if _, ok := repl[key(x)]; ok {
			out = append(out, x)
		}
	}
	return out
}

// MapMaster is the master serving the stream.
type MapMaster struct {
	ID     string `json:"id"`
	Leader bool   `json:"leader"`
	// Store, when set, says that the master cannot reach its store: the map is as of
	// the last moment it could.
	Store string `json:"store,omitempty"`
}

// Viewer is who the stream is for.
type Viewer struct {
	Admin  bool   `json:"admin"`
	Tenant string `json:"tenant,omitempty"`
}

// MapNode is one node on the map: its slots as cells, its health and its memory.
type MapNode struct {
	ID    string `json:"id"`
	DC    string `json:"dc"`
	Rack  string `json:"rack"`
	State string `json:"state"` // NodeUp or NodeLost
	Slots int    `json:"slots"`
	// Throttled slots are withheld from new workers by the node's health checks.
	Throttled int               `json:"throttled,omitempty"`
	Health    string            `json:"health"`
	Reason    string            `json:"reason,omitempty"`
	Draining  bool              `json:"draining,omitempty"`
	Memory    cluster.Bytes     `json:"memory"`
	CPU       cluster.CPU       `json:"cpu"`
	Labels    map[string]string `json:"labels,omitempty"`
	Isolation []string          `json:"isolation,omitempty"`
	// MemoryUsed is what the node's workers use as its agent last read it, rounded to a
	// hundredth of the node's memory (finer readings would change the map with every
	// heartbeat); MemoryRequested is what they ask for.
	MemoryUsed      cluster.Bytes `json:"memoryUsed"`
	MemoryRequested cluster.Bytes `json:"memoryRequested"`
	// Cells are the workers on the node: the plan's, then copies its agent still stops.
	Cells []Cell `json:"cells"`
}

// Cell is one worker on a node. On the wire it is an array, [job, link, worker, state],
// because a map of ten thousand workers is mostly cells. Job is "" for a worker of
// another tenant than the viewer.
type Cell struct {
	Job    string
	Link   string
	Worker int
	State  string
}

// MarshalJSON writes the cell as [job, link, worker, state].
func (c Cell) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{c.Job, c.Link, c.Worker, c.State})
}

// UnmarshalJSON reads [job, link, worker, state].
func (c *Cell) UnmarshalJSON(b []byte) error {
	var a []json.RawMessage
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	if len(a) != 4 {
		return fmt.Errorf("cell: want [job, link, worker, state], got %d elements", len(a))
	}
	for i, dst := range []any{&c.Job, &c.Link, &c.Worker, &c.State} {
		if err := json.Unmarshal(a[i], dst); err != nil {
			return fmt.Errorf("cell element %d: %w", i, err)
		}
	}
	return nil
}

// MapJob is one job of the map's job list.
type MapJob struct {
	JobSummary
	Links []string `json:"links,omitempty"`
	// Router is the job's output router, a job of its own on the map ("wc.router").
	Router string `json:"router,omitempty"`
	// Unplaced workers by reason.
	Reasons []ReasonCount `json:"reasons,omitempty"`
}

// ReasonCount is how many workers one reason holds back.
type ReasonCount struct {
	Reason  string `json:"reason"`
	Workers int    `json:"workers"`
}

// MapDC is a data center with the placement engine's answer to "if it failed now".
type MapDC struct {
	DCView
	// IfFailed is nil for a data center that is not active.
	IfFailed *DCFailover `json:"ifFailed,omitempty"`
}

// DCFailover is what failing a data center would do, planned over the current cluster
// with the data center's nodes draining, whole jobs moving by priority as the leader moves
// them.
type DCFailover struct {
	// Fits is true when every worker there finds room elsewhere and none elsewhere is
	// preempted for them. Links of mirrored jobs confined to the data center stop
	// whatever the room, and do not count against it: their other links carry the output.
	Fits bool `json:"fits"`
	// Workers are the workers in the data center now; Moving would find room elsewhere;
	// Waiting would not (their job moves only whole); Preempted are workers elsewhere that
	// would lose their place to higher-priority ones from the data center; LinksStopping
	// are mirrored jobs' link workers confined there.
	Workers       int `json:"workers"`
	Moving        int `json:"moving"`
	Waiting       int `json:"waiting"`
	Preempted     int `json:"preempted"`
	LinksStopping int `json:"linksStopping"`
	// Jobs lists the jobs that would wait or lose workers (the viewer's own only).
	Jobs []DCFailoverJob `json:"jobs,omitempty"`
}

// DCFailoverJob is one job a data center's failure would hurt.
type DCFailoverJob struct {
	Job       string `json:"job"`
	Waiting   int    `json:"waiting,omitempty"`
	Preempted int    `json:"preempted,omitempty"`
}

// Links is a mirrored job's output as its router reports it: GET /v1/jobs/{name}/links.
type Links struct {
	Job    string `json:"job"`
	Router string `json:"router"`
	// Source is "router" for a live answer, "store" for the router's last record when the
	// router cannot be reached (Error says why).
	Source       string        `json:"source"`
	Error        string        `json:"error,omitempty"`
	Active       string        `json:"active"`
	Delivered    int64         `json:"delivered"`
	Checkpoint   int64         `json:"checkpoint"`
	Failovers    int64         `json:"failovers"`
	LastFailover *LinkFailover `json:"lastFailover,omitempty"`
	Links        []LinkView    `json:"links"`
	Updated      time.Time     `json:"updated"`
}

// LinkView is one link of a mirrored job.
type LinkView struct {
	Link           string `json:"link"`
	Active         bool   `json:"active"`
	Alive          bool   `json:"alive"`
	Workers        int    `json:"workers"`
	WorkersAlive   int    `json:"workersAlive"`
	LastProduced   int64  `json:"lastProduced"`
	LastDelivered  int64  `json:"lastDelivered"`
	Lag            int64  `json:"lag"`
	HeartbeatAgeMs int64  `json:"heartbeatAgeMs"` // -1: a worker never sent one
}

// LinkFailover is a switch of the active link.
type LinkFailover struct {
	From       string    `json:"from"`
	To         string    `json:"to"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
	NextOffset int64     `json:"nextOffset"`
}

// FailoverRequest is the body of POST /v1/jobs/{name}/failover: To is the link to make
// active, "" for the most advanced live standby.
type FailoverRequest struct {
	To string `json:"to,omitempty"`
}
