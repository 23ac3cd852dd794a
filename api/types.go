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
	// Rollout is the state of a rollout in progress ("running", "paused",
	// "awaiting-promotion", "failed", "reverting"), empty when none is.
	Rollout string `json:"rollout,omitempty"`
}

// WorkerView is one worker of a job: where the plan put it and what its agent says.
type WorkerView struct {
	Job      string `json:"job"`
	Link     string `json:"link,omitempty"`
	Worker   int    `json:"worker"`
	Node     string `json:"node,omitempty"`
	DC       string `json:"dc,omitempty"`
	Rack     string `json:"rack,omitempty"`
	State    string `json:"state"` // agent state, "pending" before the agent reports, "unplaced"
	PID      int    `json:"pid,omitempty"`
	Restarts int    `json:"restarts"`
	LastExit string `json:"lastExit,omitempty"`
	// ExitReason says whose fault the last end was (cluster.ExitCrashed, ExitLeaseLapsed,
	// ExitStopped, ExitEvicted): only crashes count in Restarts. Lapses counts the stops
	// for a lapsed lease.
	ExitReason string        `json:"exitReason,omitempty"`
	Lapses     int           `json:"lapses,omitempty"`
	Memory     cluster.Bytes `json:"memory,omitempty"`
	Reason     string        `json:"reason,omitempty"` // why it is unplaced
	// Generation is the generation of the job's spec the worker runs, as its agent reports
	// (0 before it does).
	Generation int64 `json:"generation,omitempty"`
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
	// Avoided lists the nodes that avoid the job's workers now, after crash loops there,
	// and until when; its workers go there only when they fit nowhere else.
	Avoided []NodeAvoidance `json:"avoided,omitempty"`
	// Why says why the job's unplaced workers have no node, by link and reason (the
	// placement engine's explanation, check by check, where it found none).
	Why []UnplacedWhy `json:"why,omitempty"`
}

// NodeAvoidance is a node avoiding a job's workers after they crash-looped there.
type NodeAvoidance struct {
	Node string `json:"node"`
	// Since is when the crash loop that made it avoid the job was seen (zero when a master
	// of an earlier version recorded it).
	Since   time.Time `json:"since,omitzero"`
	Until   time.Time `json:"until"`
	Strikes int       `json:"strikes"`
}

// UnplacedWhy is why some workers of a job (or of one link) have no node. Reason is the
// one line `job status` prints; Fit, Total and Rejected are the placement engine's
// explanation when it found no node (Rejected is empty when the workers wait for another
// reason: held while their job cannot move whole, a tenant without a uid yet).
type UnplacedWhy struct {
	Link     string      `json:"link,omitempty"`
	Workers  []int       `json:"workers"`
	Reason   string      `json:"reason"`
	Fit      int         `json:"fit"`
	Total    int         `json:"total"`
	Rejected []Rejection `json:"rejected,omitempty"`
}

// Rejection is one placement check and how many nodes failed it: Nodes failed it first (in
// the order the engine checks; they add up to the nodes that do not fit), Failing failed it
// at all. Check is draining, unschedulable, link-dc, dc, other-pool, not-pool, label,
// avoided, max-per-node, throttled, slots, memory or cpu.
type Rejection struct {
	Check   string `json:"check"`
	Text    string `json:"text"`
	Nodes   int    `json:"nodes"`
	Failing int    `json:"failing"`
}

// SinkView is a mirrored job's output as its routers last recorded it in the store.
type SinkView struct {
	Routers   []string  `json:"routers"`          // where the job's routers serve
	Leader    string    `json:"leader,omitempty"` // the router that writes the sink
	Active    string    `json:"active,omitempty"` // the link it delivers from
	Delivered int64     `json:"delivered"`
	Updated   time.Time `json:"updated,omitempty"`
	// Fed is false when the sink is not being fed; Problem then says why (no router
	// leads, no link is active, the router stopped recording, the sink cannot be written).
	Fed     bool   `json:"fed"`
	Problem string `json:"problem,omitempty"`
	// Leading says how the leader came to lead: "elected", or "evidence" (it took a fencing
	// sink over from a leader that was gone); Epoch is its fencing epoch in such a sink.
	Leading string `json:"leading,omitempty"`
	Epoch   int64  `json:"epoch,omitempty"`
	// Failovers counts the switches of the active link; SpuriousFailovers those whose link
	// was alive again at once (late heartbeats, not a loss: harmless, counted).
	Failovers         int64 `json:"failovers"`
	SpuriousFailovers int64 `json:"spuriousFailovers,omitempty"`
	// SharedDC names the data center both routers run in, when they share one: its loss
	// would stop the output until a router starts elsewhere. The masters move the standby
	// to another data center as soon as one has room.
	SharedDC string `json:"sharedDC,omitempty"`
}

// NodeView is one node as operators see it.
type NodeView struct {
	ID             string        `json:"id"`
	Host           string        `json:"host,omitempty"`
	DC             string        `json:"dc"`
	Rack           string        `json:"rack"`
	Slots          int           `json:"slots"`
	SlotsUsed      int           `json:"slotsUsed"`
	SlotsFree      int           `json:"slotsFree"`
	SlotsThrottled int           `json:"slotsThrottled"`
	Memory         cluster.Bytes `json:"memory"`
	CPU            cluster.CPU   `json:"cpu"`
	Health         string        `json:"health"`
	Reason         string        `json:"reason,omitempty"`
	Draining       bool          `json:"draining,omitempty"`
	Avoid          []string      `json:"avoid,omitempty"` // jobs moved off after crash loops, now
	// Avoided says until when the node avoids each job of Avoid, and after how many crash
	// loops there (each doubles the period).
	Avoided   []cluster.Avoidance `json:"avoided,omitempty"`
	Labels    map[string]string   `json:"labels,omitempty"`
	Workers   int                 `json:"workers"`
	Isolation []string            `json:"isolation,omitempty"`
	Started   time.Time           `json:"started"`
	// SessionTimeout is the store session timeout granted to the node, which its workers'
	// leases last; SessionRequested is what its agent asked for, only when it got less.
	SessionTimeout   cluster.Duration `json:"sessionTimeout,omitempty"`
	SessionRequested cluster.Duration `json:"sessionRequested,omitempty"`
}

// TenantView is a tenant with what its jobs use.
type TenantView struct {
	cluster.Tenant
	UsedWorkers int           `json:"usedWorkers"`
	UsedMemory  cluster.Bytes `json:"usedMemory"`
	Jobs        int           `json:"jobs"`
	// RegistryAuth tells whether the tenant has registry credentials of its own, and
	// RegistryHosts for which registries: never the credentials themselves.
	RegistryAuth  bool     `json:"registryAuth"`
	RegistryHosts []string `json:"registryHosts,omitempty"`
}

// RegistryAuthReply answers a change of a tenant's registry credentials (POST
// /v1/tenants/NAME/registry-auth and .../clear): the hosts they are for now, nothing else.
type RegistryAuthReply struct {
	Tenant string   `json:"tenant"`
	Hosts  []string `json:"hosts"`
}

// SecretView is what the API shows of a tenant secret: never its value.
type SecretView struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	Version   int64     `json:"version"`
	Size      int       `json:"size"`
	Created   time.Time `json:"created"`
	Updated   time.Time `json:"updated"`
	UpdatedBy string    `json:"updatedBy,omitempty"`
}

// SecretSetReply answers `secret set` (PUT /v1/tenants/NAME/secrets/SECRET): the secret as
// stored now, and whether the value changed (an equal value makes no new version).
type SecretSetReply struct {
	SecretView
	Changed bool `json:"changed"`
}

// SecretsRewrapReply answers POST /v1/secrets/rewrap: how many values were sealed again
// with the masters' active key, which one that is, and how many already were.
type SecretsRewrapReply struct {
	Key       string `json:"key"`
	Rewrapped int    `json:"rewrapped"`
	Current   int    `json:"current"`
}

// SharePrefix is the body of POST /v1/images/share and /v1/images/unshare.
type SharePrefix struct {
	Prefix string `json:"prefix"`
}

// SharedImages is the answer of GET /v1/images/shared and of a share or unshare: the
// repository prefixes whose images nodes fetch with their own registry credentials.
type SharedImages struct {
	Prefixes []string `json:"prefixes"`
}

// ScaleRequest changes a job's worker count.
type ScaleRequest struct {
	Workers int `json:"workers"`
}

// AutoscaleRequest pauses or resumes a job's scaling policy: exactly one is true.
type AutoscaleRequest struct {
	Pause  bool `json:"pause,omitempty"`
	Resume bool `json:"resume,omitempty"`
}

// KillRequest stops a job; Grace overrides the job's grace period when set.
type KillRequest struct {
	Grace cluster.Duration `json:"grace,omitempty"`
}

// Health is the answer of GET /v1/health.
type Health struct {
	ID     string `json:"id"`
	Leader bool   `json:"leader"`
	// Waiting says what the master waits for before it can serve (its store, unreachable or
	// without quorum, when it started): the answer is then 503 and nothing else is served.
	Waiting string `json:"waiting,omitempty"`
}

// TenantChange is what the admin changes on an existing tenant (POST
// /v1/tenants/NAME/update); nil fields stay as they are.
type TenantChange struct {
	MaxWorkers  *int           `json:"maxWorkers,omitempty"`
	MaxMemory   *cluster.Bytes `json:"maxMemory,omitempty"`
	MaxPriority *int           `json:"maxPriority,omitempty"`
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

// UndrainRequest is the body of an undrain (optional). With Job, only that job's avoidance
// of the node ends, its crash loops there forgotten, and the node's draining stays as it
// is; without, the node takes work again and every avoidance of it ends.
type UndrainRequest struct {
	Job string `json:"job,omitempty"`
}

// DCRequest is the body of a data-center restore.
type DCRequest struct {
	Rebalance bool `json:"rebalance,omitempty"`
}

// UpdateRequest changes a running job's spec: a new generation, rolled out by the spec's
// `update:` block with Policy's fields on top.
type UpdateRequest struct {
	// Spec is the job spec as written (YAML or JSON), validated with field and line.
	Spec   string          `json:"spec"`
	Policy PolicyOverrides `json:"policy,omitzero"`
	// DryRun checks the update as it would be made (the spec, what may not change, the
	// policy, quota and priority caps) and answers what it would change, storing nothing.
	DryRun bool `json:"dryRun,omitempty"`
}

// PolicyOverrides are the CLI's flags over a spec's `update:` block; nil keeps the spec's.
type PolicyOverrides struct {
	MaxParallel *int              `json:"maxParallel,omitempty"`
	Canary      *int              `json:"canary,omitempty"`
	By          *string           `json:"by,omitempty"`
	MinHealthy  *cluster.Duration `json:"minHealthy,omitempty"`
	Deadline    *cluster.Duration `json:"deadline,omitempty"`
	AutoRevert  *bool             `json:"autoRevert,omitempty"`
}

// Apply returns p with the overrides set.
func (o PolicyOverrides) Apply(p cluster.UpdatePolicy) cluster.UpdatePolicy {
	if o.MaxParallel != nil {
		p.MaxParallel = *o.MaxParallel
	}
	if o.Canary != nil {
		p.Canary = *o.Canary
	}
	if o.By != nil {
		p.By = *o.By
	}
	if o.MinHealthy != nil {
		p.MinHealthy = *o.MinHealthy
	}
	if o.Deadline != nil {
		p.Deadline = *o.Deadline
	}
	if o.AutoRevert != nil {
		p.AutoRevert = *o.AutoRevert
	}
	return p
}

// UpdateReply is the answer of an update or rollback: the job as stored, and whether the
// spec changed at all (an unchanged spec makes no generation and no rollout).
type UpdateReply struct {
	Job     cluster.JobRecord `json:"job"`
	Changed bool              `json:"changed"`
	// Changes are the spec's fields the update changes (an update's answer only).
	Changes []SpecChange `json:"changes,omitempty"`
	// DryRun: nothing was stored; Job is the job as the update would make it.
	DryRun bool `json:"dryRun,omitempty"`
}

// JobSpecText is a job's spec as YAML (GET /v1/jobs/NAME/spec), to edit and send back as an
// update: the current generation's, or an earlier one's from the job's history.
type JobSpecText struct {
	Job        string `json:"job"`
	Generation int64  `json:"generation"`
	Spec       string `json:"spec"`
}

// RollbackRequest rolls a job back to an earlier generation's spec (To; 0: the one before
// the current), as a new generation.
type RollbackRequest struct {
	To     int64           `json:"to,omitempty"`
	Policy PolicyOverrides `json:"policy,omitzero"`
}

// RestartRequest restarts a job's workers in place, as a rollout with the job's rules:
// Workers limits it to these indexes (empty: all); By and MaxParallel override the spec's.
type RestartRequest struct {
	Workers     []int  `json:"workers,omitempty"`
	By          string `json:"by,omitempty"`
	MaxParallel int    `json:"maxParallel,omitempty"`
}

// JobHistory is every generation of a job the master keeps, oldest first.
type JobHistory struct {
	Job string `json:"job"`
	// Current is the generation the job's spec is now.
	Current     int64            `json:"current"`
	Generations []GenerationView `json:"generations"`
}

// GenerationView is one generation: when, who, and how its spec differs from the one
// before it.
type GenerationView struct {
	Generation int64        `json:"generation"`
	At         time.Time    `json:"at"`
	Who        string       `json:"who,omitempty"`
	Kind       string       `json:"kind"` // submit, update, rollback
	Image      string       `json:"image,omitempty"`
	Changes    []SpecChange `json:"changes,omitempty"`
}

// SpecChange is one field that differs between two generations' specs: Field is its path
// (env.LEVEL, command[2], update.maxParallel), From and To its values ("" when absent).
type SpecChange struct {
	Field string `json:"field"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
}
