package api

import (
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// MaxBodyBytes bounds a request body; a job spec is a few hundred bytes. Every body is
// JSON (a job spec may be YAML); errors are an ErrorBody.
const MaxBodyBytes = 1 << 20

// JobSummary is one row of the job list.
type JobSummary struct {
	Name     string `json:"name"`
	Tenant   string `json:"tenant"`
	State    string `json:"state"`
	Workers  int    `json:"workers"` // desired, over all links
	Running  int    `json:"running"`
	Unplaced int    `json:"unplaced"`
	// Stopping counts copies agents still run that the plan no longer wants: surplus
	// workers after a scale-in, or old copies of moved ones.
	Stopping   int   `json:"stopping"`
	Priority   int   `json:"priority"`
	Generation int64 `json:"generation"`
}

// WorkerView is one worker of a job: where the plan put it and what its agent says.
type WorkerView struct {
	Job      string        `json:"job"`
	Link     string        `json:"link,omitempty"`
	Worker   int           `json:"worker"`
	Node     string        `json:"node,omitempty"`
	DC       string        `json:"dc,omitempty"`
	Rack     string        `json:"rack,omitempty"`
	State    string        `json:"state"` // agent state, "pending" before the agent reports, "unplaced"
	PID      int           `json:"pid,omitempty"`
	Restarts int           `json:"restarts"`
	LastExit string        `json:"lastExit,omitempty"`
	Memory   cluster.Bytes `json:"memory,omitempty"`
	Reason   string        `json:"reason,omitempty"` // why it is unplaced
}

// Worker states the API adds to the agents' own.
const (
	WorkerPending  = "pending"  // assigned, not yet reported by its agent
	WorkerUnplaced = "unplaced" // no node can take it
)

// JobStatus is a job with every worker.
type JobStatus struct {
	Job     cluster.JobRecord `json:"job"`
	Summary JobSummary        `json:"summary"`
	Workers []WorkerView      `json:"workers"`
	// Sink is where a mirrored job's output stands; nil for other jobs.
	Sink *SinkView `json:"sink,omitempty"`
}

// SinkView is a mirrored job's output as its routers last recorded it in the store.
type SinkView struct {
	Routers   []string  `json:"routers"`          // where the job's routers serve
	Leader    string    `json:"leader,omitempty"` // the router that writes the sink
	Active    string    `json:"active,omitempty"` // the link it delivers from
	Delivered int64     `json:"delivered"`
	Updated   time.Time `json:"updated,omitempty"`
	// Fed is false when the sink is not being fed; Problem then says why (no router
	// leads, no link is active, the router stopped recording).
	Fed     bool   `json:"fed"`
	Problem string `json:"problem,omitempty"`
}

// NodeView is one node as operators see it.
type NodeView struct {
	ID             string            `json:"id"`
	Host           string            `json:"host,omitempty"`
	DC             string            `json:"dc"`
	Rack           string            `json:"rack"`
	Slots          int               `json:"slots"`
	SlotsUsed      int               `json:"slotsUsed"`
	SlotsFree      int               `json:"slotsFree"`
	SlotsThrottled int               `json:"slotsThrottled"`
	Memory         cluster.Bytes     `json:"memory"`
	CPU            cluster.CPU       `json:"cpu"`
	Health         string            `json:"health"`
	Reason         string            `json:"reason,omitempty"`
	Draining       bool              `json:"draining,omitempty"`
	Avoid          []string          `json:"avoid,omitempty"` // jobs moved off after crash loops
	Labels         map[string]string `json:"labels,omitempty"`
	Workers        int               `json:"workers"`
	Isolation      []string          `json:"isolation,omitempty"`
	Started        time.Time         `json:"started"`
}

// TenantView is a tenant with what its jobs use.
type TenantView struct {
	cluster.Tenant
	UsedWorkers int           `json:"usedWorkers"`
	UsedMemory  cluster.Bytes `json:"usedMemory"`
	Jobs        int           `json:"jobs"`
}

// ScaleRequest changes a job's worker count.
type ScaleRequest struct {
	Workers int `json:"workers"`
}

// KillRequest stops a job; Grace overrides the job's grace period when set.
type KillRequest struct {
	Grace cluster.Duration `json:"grace,omitempty"`
}

// Health is the answer of GET /v1/health.
type Health struct {
	ID     string `json:"id"`
	Leader bool   `json:"leader"`
}

// TokenReply carries a new tenant token; it is shown once and only its hash is kept.
type TokenReply struct {
	Tenant string `json:"tenant"`
	Token  string `json:"token"`
}

// DCView is one data center as operators see it.
type DCView struct {
	Name      string    `json:"name"`
	State     string    `json:"state"` // active, failed or lost
	Since     time.Time `json:"since"`
	Nodes     int       `json:"nodes"`
	Slots     int       `json:"slots"`
	SlotsFree int       `json:"slotsFree"`
	Workers   int       `json:"workers"`
}

// DCRequest is the body of a data-center restore.
type DCRequest struct {
	Rebalance bool `json:"rebalance,omitempty"`
}
