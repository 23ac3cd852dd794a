package isolation

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

const (
	// MiB is one mebibyte, for limits written in code.
	MiB = int64(1) << 20

	// MinMemory is the smallest memory limit any driver accepts: below it even a static Go
	// program is killed by the limit before it reaches main, which looks like a crash loop
	// rather than the configuration error it is.
	MinMemory = 4 * MiB

	// MinMilliCPU is the smallest cpu request: the kernel refuses CFS quotas under 1ms per
	// 100ms period.
	MinMilliCPU = 10

	// DefaultPids is the process and thread limit of a worker whose spec leaves Pids zero.
	// Job specs name memory and cpu only; an unbounded pid count would let one worker's fork
	// loop exhaust the node's pid space.
	DefaultPids = 1024

	// DefaultGrace is how long a worker has to drain after SIGTERM when its spec says nothing.
	DefaultGrace = 10 * time.Second

	// DefaultLogMaxBytes caps a worker's log file when its spec says nothing.
	DefaultLogMaxBytes = 16 * MiB
)

// Spec says what to run for one worker and what it may use.
type Spec struct {
	// ID names the worker on its node: a cgroup, container and state-file name, so it is
	// restricted to [A-Za-z0-9][A-Za-z0-9_.-]*, at most 100 bytes.
	ID     string
	Job    string
	Tenant string
	Worker int // index within the job
	Node   string

	// Command is the program and its arguments. For docker it replaces the image's
	// entrypoint and cmd, unless ImageCommand is set.
	Command []string
	// ImageCommand (docker) runs the image's own entrypoint and cmd, as the image says
	// them: after Command, which is then a prefix (the lease launcher's, ending in "--"), or
	// alone when Command is empty. An image with neither is refused at start.
	ImageCommand bool `json:",omitempty"`
	// Env is added to the worker's environment; the STORMDOCK_JOB, _TENANT, _WORKER and _NODE
	// variables derived from the fields above win over entries of the same name.
	Env map[string]string
	// Dir is the working directory; empty means / (process driver) or the image's (docker).
	Dir string
	// Image is the docker image reference; unused by the process driver.
	Image string
	// Mounts are bind mounts into the container (docker driver). The process driver runs on
	// the host's file system and ignores them.
	Mounts []Mount
	// User, when set, is who the worker runs as, with no new privileges (setuid programs
	// gain nothing) and no capabilities: the process driver switches to it (and gives it
	// the worker's log file), the docker driver runs the container as UID:GID. Unset, the
	// process driver runs the worker as itself, the docker driver as 65534:65534
	// (docker.User). Agents always set it for tenants' workers (their tenant's uid).
	User *User `json:"user,omitempty"`

	MemoryBytes int64 // hard limit, swap included (no swap beyond it)
	MilliCPU    int64 // 1000 = one core, enforced as a CFS quota
	Pids        int64 // processes and threads; zero means DefaultPids

	// Grace is the default drain time callers pass to Stop; zero means DefaultGrace.
	Grace time.Duration

	// LogDir holds the worker's log file (process driver); empty means the driver's default.
	LogDir string
	// LogMaxBytes caps the log; zero means DefaultLogMaxBytes.
	LogMaxBytes int64
}

// User is a numeric identity to run a worker as.
type User struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"` // supplementary groups; none when empty
	Name   string   `json:"name,omitempty"`   // for messages
}

func (u User) String() string {
	if u.Name != "" {
		return fmt.Sprintf("%s (%d:%d)", u.Name, u.UID, u.GID)
	}
	return fmt.Sprintf("%d:%d", u.UID, u.GID)
}

// Mount is a bind mount of a host path into a worker's container.
type Mount struct {
	Source   string // absolute host path
	Target   string // absolute path in the container
	ReadOnly bool
}

// idRule is what a worker id is, ^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$, checked by hand: that
// expression compiles to a program of 99 copies, which every process would pay for at start.
const idRule = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"

func validID(id string) bool {
	if len(id) == 0 || len(id) > 100 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return false
		}
	}
	return true
}

// Validate checks the parts of a spec every driver needs. The error says what is wrong and
// what to do; it wraps ErrInvalidSpec.
func (s Spec) Validate() error {
	switch {
	case !validID(s.ID):
		return fmt.Errorf("%w: worker id %q must match %s: use letters, digits, '_', '.', '-'", ErrInvalidSpec, s.ID, idRule)
	case len(s.Command) == 0 && !s.ImageCommand || len(s.Command) > 0 && s.Command[0] == "":
		return fmt.Errorf("%w: worker %s has no command: give the program to run", ErrInvalidSpec, s.ID)
	case s.MemoryBytes <= 0:
		return fmt.Errorf("%w: worker %s has no memory limit: ask for one, e.g. 256Mi", ErrInvalidSpec, s.ID)
	case s.MemoryBytes < MinMemory:
		return fmt.Errorf("%w: memory limit %s of worker %s is below the %s a worker needs to start: ask for at least 4Mi",
			ErrInvalidSpec, FormatBytes(s.MemoryBytes), s.ID, FormatBytes(MinMemory))
	case s.MilliCPU < MinMilliCPU:
		return fmt.Errorf("%w: cpu request %s of worker %s is below the kernel's minimum quota of 0.01 cpu: ask for at least 0.01",
			ErrInvalidSpec, FormatCPU(s.MilliCPU), s.ID)
	case s.Pids < 0:
		return fmt.Errorf("%w: pids limit %d of worker %s is negative: leave it 0 for the default %d", ErrInvalidSpec, s.Pids, s.ID, DefaultPids)
	case slices.ContainsFunc(s.Mounts, func(m Mount) bool { return !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) }):
		return fmt.Errorf("%w: worker %s has a mount with a relative path: give absolute source and target paths", ErrInvalidSpec, s.ID)
	case s.Grace < 0:
		return fmt.Errorf("%w: grace %s of worker %s is negative", ErrInvalidSpec, s.Grace, s.ID)
	}
	return nil
}

// PidsLimit is the pids limit to apply: Pids, or DefaultPids when it is zero.
func (s Spec) PidsLimit() int64 {
	if s.Pids == 0 {
		return DefaultPids
	}
	return s.Pids
}

// GracePeriod is Grace, or DefaultGrace when it is zero.
func (s Spec) GracePeriod() time.Duration {
	if s.Grace == 0 {
		return DefaultGrace
	}
	return s.Grace
}

// LogLimit is LogMaxBytes, or DefaultLogMaxBytes when it is zero or negative.
func (s Spec) LogLimit() int64 {
	if s.LogMaxBytes <= 0 {
		return DefaultLogMaxBytes
	}
	return s.LogMaxBytes
}

// Environ is the worker's environment as sorted KEY=VALUE pairs: Env plus the identity
// variables of the worker contract.
func (s Spec) Environ() []string {
	env := maps.Clone(s.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["STORMDOCK_JOB"] = s.Job
	env["STORMDOCK_TENANT"] = s.Tenant
	env["STORMDOCK_WORKER"] = strconv.Itoa(s.Worker)
	env["STORMDOCK_NODE"] = s.Node
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// FormatBytes renders a byte count the way limits are written (64Mi), for messages.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "Gi"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "Mi"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "Ki"
	}
	return strconv.FormatInt(n, 10)
}

// FormatCPU renders milli-cpus as a core count (0.5), for messages.
func FormatCPU(milli int64) string {
	return strconv.FormatFloat(float64(milli)/1000, 'f', -1, 64)
}
