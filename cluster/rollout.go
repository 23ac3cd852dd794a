package cluster

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// How `job update` replaces workers (the spec's `update:` block).
const (
	// RolloutByWorker replaces workers in index order, maxParallel at a time.
	RolloutByWorker = "worker"
	// RolloutByNode, RolloutByRack and RolloutByDC replace one failure domain after another:
	// the next starts once every replaced worker of the last is healthy.
	RolloutByNode = "node"
	RolloutByRack = "rack"
	RolloutByDC   = "dc"
)

// Defaults of an update policy.
const (
	DefaultMaxParallel = 1
	DefaultMinHealthy  = 10 * time.Second
	DefaultDeadline    = 5 * time.Minute
)

// UpdatePolicy says how a rollout replaces a job's workers. Zero fields take the defaults.
type UpdatePolicy struct {
	// MaxParallel is how many of the job's workers may be down for the rollout at once.
	MaxParallel int `json:"maxParallel,omitempty" yaml:"maxParallel,omitempty"`
	// Canary workers are replaced first and held until `job promote`.
	Canary int `json:"canary,omitempty" yaml:"canary,omitempty"`
	// By is worker, node, rack or dc: replace one failure domain at a time.
	By string `json:"by,omitempty" yaml:"by,omitempty"`
	// MinHealthy is how long a replaced worker must run without a restart to count as
	// healthy.
	MinHealthy Duration `json:"minHealthy,omitempty" yaml:"minHealthy,omitempty"`
	// Deadline bounds how long a replaced worker may take to become healthy; past it the
	// update fails.
	Deadline Duration `json:"deadline,omitempty" yaml:"deadline,omitempty"`
	// AutoRevert puts every replaced worker back on the previous generation when the update
	// fails.
	AutoRevert bool `json:"autoRevert,omitempty" yaml:"autoRevert,omitempty"`
}

// Effective returns the policy with defaults filled in.
func (p UpdatePolicy) Effective() UpdatePolicy {
	if p.MaxParallel <= 0 {
		p.MaxParallel = DefaultMaxParallel
	}
	if p.By == "" {
		p.By = RolloutByWorker
	}
	if p.MinHealthy <= 0 {
		p.MinHealthy = Duration(DefaultMinHealthy)
	}
	if p.Deadline <= 0 {
		p.Deadline = Duration(DefaultDeadline)
	}
	return p
}

// validate adds the policy's problems under the path prefix ("update.").
func (p UpdatePolicy) validate(ps *problems, prefix string, workers int) {
	if p.MaxParallel < 0 {
		ps.add(prefix+"maxParallel", "must not be negative (0 means 1)")
	}
	if p.Canary < 0 {
		ps.add(prefix+"canary", "must not be negative")
	} else if workers > 0 && p.Canary > workers {
		ps.add(prefix+"canary", "must be at most the job's %d workers", workers)
	}
	switch p.By {
	case "", RolloutByWorker, RolloutByNode, RolloutByRack, RolloutByDC:
	default:
		ps.add(prefix+"by", "must be worker, node, rack or dc, not %q", p.By)
	}
	if p.MinHealthy < 0 {
		ps.add(prefix+"minHealthy", "must not be negative")
	}
	if p.Deadline < 0 {
		ps.add(prefix+"deadline", "must not be negative")
	}
	if e := p.Effective(); p.MinHealthy >= 0 && p.Deadline >= 0 && e.Deadline <= e.MinHealthy {
		ps.add(prefix+"deadline", "must be longer than minHealthy (%s)", e.MinHealthy)
	}
}

// Validate checks a policy on its own (flags that override a spec's block).
func (p UpdatePolicy) Validate(workers int) error {
	var ps problems
	p.validate(&ps, "", workers)
	if len(ps) == 0 {
		return nil
	}
	return &ValidationError{What: "update policy", Problems: ps}
}

// Rollout kinds.
const (
	RolloutUpdate   = "update"   // job update: a new spec
	RolloutRollback = "rollback" // job rollback: an earlier generation's spec, as a new generation
	RolloutRestart  = "restart"  // job restart: the same spec, every (or one) worker restarted in place
	RolloutRevert   = "revert"   // a failed update's autoRevert: back to the generation before it
)

// Rollout states.
const (
	RolloutRunning = "running"
	RolloutPaused  = "paused"
	// RolloutCanary: the canaries are replaced and healthy; the rest waits for `job promote`.
	RolloutCanary    = "awaiting-promotion"
	RolloutDone      = "done"
	RolloutFailed    = "failed"
	RolloutReverting = "reverting"
	RolloutReverted  = "reverted"
)

// Rollout is a job's rolling replacement of workers, kept in its JobRecord, so that a new
// leader continues where the last one stopped. Which workers run which generation is in the
// node assignments; the rollout holds what cannot be derived from them.
type Rollout struct {
	// ID numbers the job's rollouts; a restart's workers carry it (WorkerAssignment.Restart).
	ID   int64  `json:"id"`
	Kind string `json:"kind"`
	// From is the generation the job had before; To the one its workers move to.
	From   int64        `json:"from"`
	To     int64        `json:"to"`
	State  string       `json:"state"`
	Policy UpdatePolicy `json:"policy"` // effective: defaults filled, flags applied
	// Workers limits a restart to these indexes (every link's); empty means all.
	Workers []int `json:"workers,omitempty"`
	// Batch numbers the current batch from 1: the canaries, then one failure domain (or, by
	// worker, the rest of the job) after another. Domain names the current one.
	Batch  int    `json:"batch"`
	Domain string `json:"domain,omitempty"`
	// Canaries are the workers replaced first; Promoted is set by `job promote`.
	Canaries []WorkerKey `json:"canaries,omitempty"`
	Promoted bool        `json:"promoted,omitempty"`
	// InFlight are the workers being replaced and not healthy yet.
	InFlight []RolloutWorker `json:"inFlight,omitempty"`
	// Healthy of Total workers run the target and are healthy, as the leader last saw.
	Healthy int `json:"healthy"`
	Total   int `json:"total"`
	// Reason says why the rollout stopped (paused, failed, reverted).
	Reason   string    `json:"reason,omitempty"`
	Started  time.Time `json:"started"`
	Updated  time.Time `json:"updated"`
	Finished time.Time `json:"finished,omitzero"`
	// Who started it (admin, tenant/NAME).
	Who string `json:"who,omitempty"`
}

// RolloutWorker is one worker being replaced.
type RolloutWorker struct {
	Key WorkerKey `json:"key"`
	// Since is when the leader let it be stopped for its replacement: its deadline runs from
	// there.
	Since time.Time `json:"since"`
}

// Active reports whether the rollout still holds workers on their old run spec (it is not
// done or reverted).
func (r *Rollout) Active() bool {
	return r != nil && r.State != RolloutDone && r.State != RolloutReverted
}

// Covers reports whether a restart rollout includes worker index i.
func (r *Rollout) Covers(i int) bool {
	return len(r.Workers) == 0 || slices.Contains(r.Workers, i)
}

// Summary is the rollout in one line, for job status and events.
func (r *Rollout) Summary() string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	switch r.Kind {
	case RolloutRestart:
		fmt.Fprintf(&b, "rollout %d (restart of generation %d)", r.ID, r.To)
	default:
		fmt.Fprintf(&b, "rollout %d (%s %d -> %d)", r.ID, r.Kind, r.From, r.To)
	}
	fmt.Fprintf(&b, ": %s, batch %d", r.State, r.Batch)
	if r.Domain != "" {
		fmt.Fprintf(&b, " (%s %s)", r.Policy.By, r.Domain)
	}
	fmt.Fprintf(&b, ", %d/%d healthy", r.Healthy, r.Total)
	if r.Reason != "" {
		b.WriteString(": " + r.Reason)
	}
	return b.String()
}

// HistoryKey holds one JobHistory per job: /history/<job>.
const HistoryKey = "/history"

// JobHistoryKey is the store key of a job's history.
func JobHistoryKey(name string) (string, error) { return nameKey(HistoryKey, "job", name) }

// MaxHistory is how many generations a job's history keeps (the oldest go first).
const MaxHistory = 50

// JobHistory is every generation of a job's spec, oldest first.
type JobHistory struct {
	Job         string             `json:"job"`
	Generations []GenerationRecord `json:"generations"`
}

// GenerationRecord is one generation of a job: its spec, when and by whom it was made.
type GenerationRecord struct {
	Generation int64     `json:"generation"`
	Spec       JobSpec   `json:"spec"`
	Image      *ImagePin `json:"image,omitempty"`
	At         time.Time `json:"at"`
	Who        string    `json:"who,omitempty"`
	// Kind is submit, update or rollback.
	Kind string `json:"kind"`
}

// Find returns the record of generation gen.
func (h *JobHistory) Find(gen int64) (GenerationRecord, bool) {
	for _, g := range h.Generations {
		if g.Generation == gen {
			return g, true
		}
	}
	return GenerationRecord{}, false
}

// Latest is the highest generation the history holds (0 when empty).
func (h *JobHistory) Latest() int64 {
	var n int64
	for _, g := range h.Generations {
		n = max(n, g.Generation)
	}
	return n
}

// Add appends a generation, dropping the oldest beyond MaxHistory except keep.
func (h *JobHistory) Add(g GenerationRecord, keep int64) {
	h.Generations = append(h.Generations, g)
	for len(h.Generations) > MaxHistory {
		i := 0
		if h.Generations[0].Generation == keep {
			i = 1
		}
		h.Generations = slices.Delete(h.Generations, i, i+1)
	}
}
