package process

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/stormdock/stormdock/isolation"
)

// cpuPeriod is the CFS period quotas are expressed against (the kernel's default).
const cpuPeriod = 100 * time.Millisecond

// limits is what a worker's cgroup enforces.
type limits struct {
	memory   int64
	milliCPU int64
	pids     int64
}

func (l limits) cpuQuota() int64 { return l.milliCPU * cpuPeriod.Microseconds() / 1000 }

// slot is one worker's cgroup, on either cgroup version.
type slot interface {
	// add moves a process (all its threads) into the cgroup.
	add(pid int) error
	// procs lists the processes in the cgroup.
	procs() ([]int, error)
	// killAll SIGKILLs every process in the cgroup, frozen first so that none can fork while
	// the list is walked, and waits until the cgroup is empty or ctx is done.
	killAll(ctx context.Context) error
	// oomKills counts the processes the kernel killed at the memory limit.
	oomKills() (uint64, error)
	usage() (isolation.Usage, error)
	// limits reads back the limits from the kernel's files, not from what was asked.
	limits() (isolation.Limits, error)
	// remove deletes the cgroup; it must be empty.
	remove() error
}

// pauser is a slot whose processes can be paused and resumed as one (the freezer: v1's
// freezer controller, v2's cgroup.freeze). capLog pauses a worker for the instant between
// its last copy and the truncation, so that no output falls in between.
type pauser interface {
	// pause freezes the cgroup and waits until every process in it stopped, or ctx is done
	// (the cgroup is then thawed again and the error returned).
	pause(ctx context.Context) error
	resume() error
}

// cloneTarget is a slot a process can be started in directly (cgroup v2: clone3 with
// CLONE_INTO_CGROUP), instead of being moved there after the fork. Moving a process takes the
// kernel's cgroup threadgroup lock for writing, which waits for an RCU grace period: several
// milliseconds of wall time per start that a clone into the cgroup does not pay.
type cloneTarget interface {
	// openDir opens the cgroup's directory for clone3; the caller closes the descriptor.
	openDir() (int, error)
}

// selfPlaced is a slot the shim can move itself into (cgroup v1), thread by thread, without
// the kernel's global threadgroup lock that a move of another process takes (see package
// shim, MagicSelf).
type selfPlaced interface {
	// tasksFiles are the cgroup's tasks files, one per hierarchy.
	tasksFiles() []string
}

// hierarchy creates and finds worker cgroups under one parent.
type hierarchy interface {
	// version is 1 or 2.
	version() int
	// create makes the cgroup name (a path below the cgroup root) with the limits.
	create(name string, l limits) (slot, error)
	// load returns the existing cgroup name, or ok=false when it does not exist.
	load(name string) (s slot, ok bool, err error)
	// ensure creates the parent cgroup, proving that the hierarchy is writable.
	ensure(parent string) error
	// removeParent deletes the parent if it is empty (tests and tidy shutdowns).
	removeParent(parent string) error
}

// detect picks the hierarchy of the running system. Hybrid systems (v1 controllers plus an
// empty unified mount) are v1: the unified mount there has no controllers to limit with.
func detect(root string) (hierarchy, error) {
	switch cgroups.Mode() {
	case cgroups.Legacy, cgroups.Hybrid:
		return newV1()
	case cgroups.Unified:
		return newV2(root), nil
	default:
		return nil, fmt.Errorf("%w: no cgroup hierarchy mounted at %s: mount cgroup v1 controllers or cgroup2 there", isolation.ErrUnavailable, root)
	}
}

// waitEmpty polls until the slot holds no process. Killed processes leave the cgroup when
// they exit, which for a frozen-then-thawed tree takes a few milliseconds.
func waitEmpty(ctx context.Context, s slot) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		p, err := s.procs()
		if err != nil {
			return err
		}
		if len(p) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup still holds pids %v: %w", p, ctx.Err())
		case <-t.C:
		}
	}
}

// readInt reads a cgroup file holding one integer ("max" reads as -1).
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// readKey reads "key value" lines (memory.stat, memory.events, oom_control) and returns key's value.
func readKey(path, key string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %q line", path, key)
}

// sharesFor is the cpu.shares weight of a cpu request: 1024 per core, as docker sets it.
func sharesFor(milli int64) uint64 {
	s := uint64(milli * 1024 / 1000)
	if s < 2 {
		s = 2
	}
	return s
}
