package process

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// A worker's reaper removes its cgroup while Stop may still be killing what is in it: on a
// removed cgroup, kill and the process list find nothing left rather than fail (v2 reads
// ENOENT, or ENODEV from a file opened before the removal; v1 its own errors).
func TestSlotRemovedUnderneath(t *testing.T) {
	testenv.Cgroups(t)
	h, err := detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("/stormdock-slot-test-%d", os.Getpid())
	if err := h.ensure(parent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.RemoveCgroupTree(parent) })
	sl, err := h.create(parent+"/w", limits{memory: 64 << 20, milliCPU: 500, pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := sl.remove(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ps, err := sl.procs(); err != nil || len(ps) != 0 {
		t.Errorf("procs of a removed cgroup: %v, %v; want none", ps, err)
	}
	if err := sl.killAll(ctx); err != nil {
		t.Errorf("kill in a removed cgroup (v%d): %v; want nothing to do", h.version(), err)
	}
}
