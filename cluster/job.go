package cluster

import (
	"slices"
	"time"
)

// Isolation modes a job's workers run under.
const (
	IsolationProcess = "process"
	IsolationDocker  = "docker"
)

// Placement strategies.
const (
	StrategySpread  = "spread"
	StrategyBinpack = "binpack"
)

// Failure domains a job can spread over, outermost first.
const (
	DomainDC   = "dc"
	DomainRack = "rack"
	DomainNode = "node"
)

// DefaultGracePeriod is how long a worker has to drain after SIGTERM when its job does not say.
const DefaultGracePeriod = 10 * time.Second

// Resources is what one worker asks for.
type Resources struct {
	Memory Bytes `json:"memory" yaml:"memory"`
	CPU    CPU   `json:"cpu" yaml:"cpu"`
}

// PlacementSpec constrains where a job's workers may go.
type PlacementSpec struct {
	// Spread lists failure domains to spread over evenly, outermost first ([dc, rack]).
	Spread []string `json:"spread,omitempty" yaml:"spread,omitempty"`
	// MaxPerNode caps the job's workers on one node; 0 means no cap.
	MaxPerNode int `json:"maxPerNode,omitempty" yaml:"maxPerNode,omitempty"`
	// DCs are the data centers the job may use; empty means all.
	DCs []string `json:"dcs,omitempty" yaml:"dcs,omitempty"`
	// NodeLabels must all be present, with these values, on a node that takes a worker.
	NodeLabels map[string]string `json:"nodeLabels,omitempty" yaml:"nodeLabels,omitempty"`
	// Strategy is spread (the default) or binpack.
	Strategy string `json:"strategy,omitempty" yaml:"strategy,omitempty"`
}

// JobSpec is what a user submits: a long-running streaming job of identical workers.
type JobSpec struct {
	Name      string            `json:"name" yaml:"name"`
	Tenant    string            `json:"tenant" yaml:"tenant"`
	Workers   int               `json:"workers" yaml:"workers"`
	Resources Resources         `json:"resources" yaml:"resources"`
	Isolation string            `json:"isolation,omitempty" yaml:"isolation,omitempty"`
	Command   []string          `json:"command,omitempty" yaml:"command,omitempty"`
	Image     string            `json:"image,omitempty" yaml:"image,omitempty"`
	Env       map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	Placement PlacementSpec     `json:"placement" yaml:"placement,omitempty"`
	// Links, when set, makes the job mirrored: a full copy of Workers workers runs in each
	// listed data center, and the output router forwards one link's output to Output.
	Links  []string `json:"links,omitempty" yaml:"links,omitempty"`
	Output string   `json:"output,omitempty" yaml:"output,omitempty"`
	// Priority orders jobs when capacity is short: larger is more important.
	Priority    int      `json:"priority,omitempty" yaml:"priority,omitempty"`
	GracePeriod Duration `json:"gracePeriod,omitempty" yaml:"gracePeriod,omitempty"`
	// LiveEnv lists keys of Env whose changes reach running workers through their live
	// configuration (STORMDOCK_CONFIG and SIGHUP) instead of replacing them.
	LiveEnv []string `json:"liveEnv,omitempty" yaml:"liveEnv,omitempty"`
	// Update says how `job update` replaces the workers whose run spec changed.
	Update UpdatePolicy `json:"update,omitzero" yaml:"update,omitempty"`
	// Secrets names tenant secrets each worker gets as a file, $STORMDOCK_SECRETS_DIR/NAME
	// (see secret.go); a new value reaches running workers live.
	Secrets []string `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	// OutputSecret names the tenant secret a mirrored job's output routers get, the same
	// way, for their sink's credentials (an HTTP sink sends it as a bearer token).
	OutputSecret string `json:"outputSecret,omitempty" yaml:"outputSecret,omitempty"`
	// Scaling, when set, lets the leading master change Workers on the job's metrics
	// (scaling.go).
	Scaling *ScalingPolicy `json:"scaling,omitempty" yaml:"scaling,omitempty"`
}

// SplitEnv splits the spec's environment into what a worker runs with (a change replaces
// it) and the keys listed in LiveEnv (a change reaches it live). Both are nil when empty.
func (j *JobSpec) SplitEnv() (run, live map[string]string) {
	for k, v := range j.Env {
		m := &run
		if slices.Contains(j.LiveEnv, k) {
			m = &live
		}
		if *m == nil {
			*m = map[string]string{}
		}
		(*m)[k] = v
	}
	return run, live
}

// Grace returns the job's grace period, or the default when it sets none.
func (j *JobSpec) Grace() time.Duration {
	if j.GracePeriod <= 0 {
		return DefaultGracePeriod
	}
	return j.GracePeriod.Std()
}

// Mirrored reports whether the job runs one copy per link.
func (j *JobSpec) Mirrored() bool { return len(j.Links) > 0 }

// TotalWorkers counts every worker of the job, over all its links.
func (j *JobSpec) TotalWorkers() int {
	if j.Mirrored() {
		return j.Workers * len(j.Links)
	}
	return j.Workers
}

// Keys lists the job's workers in a fixed order: link by link, then by index.
func (j *JobSpec) Keys() []WorkerKey {
	links := j.Links
	if len(links) == 0 {
		links = []string{""}
	}
	keys := make([]WorkerKey, 0, j.Workers*len(links))
	for _, l := range links {
		for i := 0; i < j.Workers; i++ {
			keys = append(keys, WorkerKey{Job: j.Name, Link: l, Worker: i})
		}
	}
	return keys
}

// HasKey reports whether k is one of the job's workers (one of Keys).
func (j *JobSpec) HasKey(k WorkerKey) bool {
	if k.Job != j.Name || k.Worker < 0 || k.Worker >= j.Workers {
		return false
	}
	if len(j.Links) == 0 {
		return k.Link == ""
	}
	return slices.Contains(j.Links, k.Link)
}

// IsolationMode returns the job's isolation, process when it sets none.
func (j *JobSpec) IsolationMode() string {
	if j.Isolation == "" {
		return IsolationProcess
	}
	return j.Isolation
}

// StrategyName returns the job's placement strategy, spread when it sets none.
func (j *JobSpec) StrategyName() string {
	if j.Placement.Strategy == "" {
		return StrategySpread
	}
	return j.Placement.Strategy
}
