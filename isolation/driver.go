package isolation

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Sentinel errors callers branch on. Driver errors wrap them together with the detail.
var (
	// ErrInvalidSpec: the spec cannot be run as given (bad id, limits below the minimum).
	ErrInvalidSpec = errors.New("invalid worker spec")
	// ErrExists: a worker with this id is already known to the driver (running or exited
	// and not yet stopped). Starting it again would run a duplicate.
	ErrExists = errors.New("worker already exists")
	// ErrNotFound: no worker with this id is known to the driver.
	ErrNotFound = errors.New("worker not found")
	// ErrUnavailable: the isolation mechanism itself is missing or unusable (no dockerd, no
	// writable cgroup hierarchy).
	ErrUnavailable = errors.New("isolation unavailable")
	// ErrImageNotFound: the docker image of the spec is not present on the node.
	ErrImageNotFound = errors.New("image not found")
	// ErrClosed: the driver was closed.
	ErrClosed = errors.New("driver closed")
)

// Worker describes one worker a driver runs or has run.
type Worker struct {
	Spec Spec
	// PID is the host pid of the worker's main process (process driver; docker: the
	// container's init as seen from the host, zero once it has exited).
	PID int
	// ContainerID is the docker container id (docker driver only).
	ContainerID string
	Started     time.Time
	// Adopted reports that an earlier driver instance started the worker.
	Adopted bool
	// Exit is set once the worker has ended.
	Exit *Exit
	// LogPath is where the worker's output goes (process driver: a capped file).
	LogPath string
}

// Running reports whether the worker has not ended yet.
func (w Worker) Running() bool { return w.Exit == nil }

// Exit says how a worker ended.
type Exit struct {
	// Code is the exit status; a worker killed by a signal reports 128+signal as a shell
	// (and docker) would. -1 means the status could not be observed: the worker ended while
	// no agent was its parent.
	Code int
	// Signal is the signal that killed the main process, or 0.
	Signal syscall.Signal
	// OOMKilled reports that the kernel killed a process of the worker because the worker
	// reached its memory limit.
	OOMKilled bool
	At        time.Time
}

// ExitUnknown is the Code of an exit whose status was not observable.
const ExitUnknown = -1

// Success reports a clean exit with status 0.
func (e Exit) Success() bool { return e.Code == 0 && e.Signal == 0 && !e.OOMKilled }

func (e Exit) String() string {
	var s string
	switch {
	case e.Signal != 0:
		s = fmt.Sprintf("killed by signal %d (%s)", int(e.Signal), e.Signal)
	case e.Code == ExitUnknown:
		s = "ended while unobserved (exit status unknown)"
	default:
		s = fmt.Sprintf("exited with code %d", e.Code)
	}
	if e.OOMKilled {
		s += ", OOM-killed at its memory limit"
	}
	return s
}

// Usage is a worker's resource use at one moment.
type Usage struct {
	// MemoryBytes excludes reclaimable page cache (inactive file pages), as docker stats does.
	MemoryBytes uint64
	// CPU is the cpu time used since the worker started.
	CPU time.Duration
	At  time.Time
}

// Limits are the limits actually in force for a worker, read back from the kernel (process
// driver) or the engine (docker driver).
type Limits struct {
	MemoryBytes     int64
	MemorySwapBytes int64 // memory+swap limit; equal to MemoryBytes means no swap
	CPUQuota        time.Duration
	CPUPeriod       time.Duration
	Pids            int64
}

// MilliCPU converts the quota back into a cpu request.
func (l Limits) MilliCPU() int64 {
	if l.CPUPeriod <= 0 {
		return 0
	}
	return int64(l.CPUQuota) * 1000 / int64(l.CPUPeriod)
}

// Starter starts workers.
type Starter interface {
	// Start runs the worker and returns once its program runs inside its limits. It fails
	// with ErrExists rather than start a second copy of a known worker.
	Start(ctx context.Context, spec Spec) (Worker, error)
}

// Stopper stops workers.
type Stopper interface {
	// Stop sends SIGTERM, waits up to grace for the worker to exit, then kills every process
	// of it, and releases everything the worker held (cgroup, container). It returns how the
	// worker ended. Stopping a worker that already ended just releases it.
	Stop(ctx context.Context, id string, grace time.Duration) (Exit, error)
}

// Waiter reports the end of workers.
type Waiter interface {
	// Wait blocks until the worker ends or ctx is done.
	Wait(ctx context.Context, id string) (Exit, error)
}

// Signaler delivers signals to running workers.
type Signaler interface {
	// Signal sends sig to the worker's main process: the lease launcher, which passes it
	// on, or the worker's own program. The agent sends SIGHUP after rewriting a worker's
	// live configuration. A worker that has ended is not signalled (no error).
	Signal(ctx context.Context, id string, sig syscall.Signal) error
}

// Lister lists and adopts workers.
type Lister interface {
	// Adopt takes over the workers an earlier driver instance on this node left behind,
	// running or ended, so that they are watched and stopped instead of duplicated.
	Adopt(ctx context.Context) ([]Worker, error)
	// List returns the workers the driver knows, started or adopted.
	List(ctx context.Context) ([]Worker, error)
}

// Meter reads what workers use and what they are allowed.
type Meter interface {
	Usage(ctx context.Context, id string) (Usage, error)
	Limits(ctx context.Context, id string) (Limits, error)
}

// Driver is everything an agent needs from an isolation mechanism.
type Driver interface {
	Starter
	Stopper
	Waiter
	Signaler
	Lister
	Meter
	// Close stops watching workers and releases the driver's resources. Workers keep
	// running; a new driver adopts them.
	Close() error
}
