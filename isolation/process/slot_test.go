package process

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// testSlot creates a worker cgroup under a parent of the test's own, removed at its end.
func testSlot(t *testing.T, name string) (hierarchy, slot) {
	t.Helper()
	testenv.Cgroups(t)
	h, err := detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("/stormdock-slot-%s-%d", name, os.Getpid())
	if err := h.ensure(parent); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testenv.RemoveCgroupTree(parent) })
	sl, err := h.create(parent+"/w", limits{memory: 64 << 20, milliCPU: 500, pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	return h, sl
}

// A worker's reaper removes its cgroup while Stop may still be killing what is in it: on a
// removed cgroup, kill and the process list find nothing left rather than fail (v2 reads
// ENOENT, or ENODEV from a file opened before the removal; v1 its own errors).
func TestSlotRemovedUnderneath(t *testing.T) {
	h, sl := testSlot(t, "test")
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

// pause freezes a cgroup with a running process in it until the kernel says every process
// stopped, and resume lets them run again: capLog rotates a worker's log in that pause.
func TestSlotPause(t *testing.T) {
	h, sl := testSlot(t, "pause")
	p, ok := sl.(pauser)
	if !ok {
		t.Fatalf("the v%d slot cannot pause", h.version())
	}
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Process.Kill(); busy.Wait() })
	if err := sl.add(busy.Process.Pid); err != nil {
		t.Fatal(err)
	}
	frozen := func() bool {
		if s, ok := sl.(*v1slot); ok {
			b, _ := os.ReadFile(s.file("freezer", "freezer.state"))
			return strings.TrimSpace(string(b)) == "FROZEN"
		}
		n, _ := readKey(sl.(*v2slot).file("cgroup.events"), "frozen")
		return n == 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.pause(ctx); err != nil {
		t.Fatal(err)
	}
	if !frozen() {
		t.Fatal("pause returned with the cgroup not frozen")
	}
	before, err := sl.usage()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.resume(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the process running again", 30*time.Second, func() bool {
		u, err := sl.usage()
		return !frozen() && err == nil && u.CPU > before.CPU
	})
}
