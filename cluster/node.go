package cluster

import "fmt"

// Health states of a node.
const (
	HealthHealthy   = "healthy"
	HealthThrottled = "throttled"
	HealthUnhealthy = "unhealthy"
)

// Usage is an amount of node capacity: slots, memory and cpu.
type Usage struct {
	Slots  int   `json:"slots,omitempty" yaml:"slots,omitempty"`
	Memory Bytes `json:"memory,omitempty" yaml:"memory,omitempty"`
	CPU    CPU   `json:"cpu,omitempty" yaml:"cpu,omitempty"`
}

// Node is one machine that runs workers, as its agent registers it and as the scheduler
// sees it.
type Node struct {
	ID   string `json:"id" yaml:"id"`
	Host string `json:"host,omitempty" yaml:"host,omitempty"`
	// Addr is the address other hosts reach this node's workers and services at (the
	// agent's --advertise-addr).
	Addr   string            `json:"addr,omitempty" yaml:"addr,omitempty"`
	DC     string            `json:"dc" yaml:"dc"`
	Rack   string            `json:"rack" yaml:"rack"`
	Slots  int               `json:"slots" yaml:"slots"`
	Memory Bytes             `json:"memory" yaml:"memory"`
	CPU    CPU               `json:"cpu" yaml:"cpu"`
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
	// Pool names the tenant this node is dedicated to; empty means shared.
	Pool string `json:"pool,omitempty" yaml:"pool,omitempty"`
	// Used is capacity taken by something other than the assignment being planned.
	Used Usage `json:"used,omitempty" yaml:"used,omitempty"`
	// Throttled is how many slots health checks withhold from new work.
	Throttled int `json:"throttled,omitempty" yaml:"throttled,omitempty"`
	// Unschedulable nodes (drained or unhealthy) keep what they run but take nothing new.
	Unschedulable bool `json:"unschedulable,omitempty" yaml:"unschedulable,omitempty"`
	// Draining nodes take nothing new and their workers are moved elsewhere.
	Draining bool `json:"draining,omitempty" yaml:"draining,omitempty"`
}

// Tenant is a team sharing the cluster, with its quota.
type Tenant struct {
	Name string `json:"name" yaml:"name"`
	// MaxWorkers and MaxMemory cap the tenant's jobs together; 0 means no cap.
	MaxWorkers int   `json:"maxWorkers,omitempty" yaml:"maxWorkers,omitempty"`
	MaxMemory  Bytes `json:"maxMemory,omitempty" yaml:"maxMemory,omitempty"`
	// MaxPriority is the highest priority the tenant's jobs may ask for, set by the admin
	// alone. The default, 0, is the lowest class: preemption takes only workers of strictly
	// lower priority, so a tenant without a cap (a record stored before caps existed
	// included) preempts no one.
	MaxPriority int `json:"maxPriority" yaml:"maxPriority"`
	// UID is the uid (and gid) the tenant's workers run as on every node, allocated by the
	// master from its --tenant-uids range when the tenant is created, never reused. UID+1
	// is its mirrored jobs' output routers' (RouterUID). 0: not allocated yet (a record
	// stored before uids existed, until the leading master backfills it). Set by the
	// master alone: a value in a create or update request is ignored.
	UID int `json:"uid,omitempty" yaml:"uid,omitempty"`
}

// WorkerUID is the uid (and gid) the tenant's workers run as; 0 when it has none yet.
func (t *Tenant) WorkerUID() int { return t.UID }

// RouterUID is the uid (and gid) its mirrored jobs' output routers run as: another than
// the workers', because a router holds the store's credentials and the job's output key,
// which the tenant's own code must not read through /proc or ptrace. 0 when it has none.
func (t *Tenant) RouterUID() int {
	if t.UID <= 0 {
		return 0
	}
	return t.UID + 1
}

// PriorityCap is the highest priority a job of t is placed with: its cap, within the
// range priorities have.
func (t *Tenant) PriorityCap() int { return min(max(t.MaxPriority, 0), MaxPriority) }

// Inventory is the nodes of a cluster as a file gives them: {"nodes": [...]}.
type Inventory struct {
	Nodes []Node `json:"nodes" yaml:"nodes"`
}

// Validate checks every node and that no id is used twice.
func (inv *Inventory) Validate() error {
	var ps problems
	seen := map[string]int{}
	for i := range inv.Nodes {
		n := &inv.Nodes[i]
		n.validate(&ps, fmt.Sprintf("nodes[%d].", i))
		if j, dup := seen[n.ID]; dup && n.ID != "" {
			ps.add(fmt.Sprintf("nodes[%d].id", i), "%q is already used by nodes[%d]", n.ID, j)
		}
		seen[n.ID] = i
	}
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{What: "cluster", Problems: ps}
}

// ParseInventory reads and validates a cluster's node list from JSON or YAML.
func ParseInventory(data []byte) (*Inventory, error) {
	var inv Inventory
	if err := Decode(data, &inv, "cluster"); err != nil {
		return nil, err
	}
	return &inv, nil
}
