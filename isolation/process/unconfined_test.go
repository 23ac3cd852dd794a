package process_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/process"
)

// Without cgroups a worker is its process group: stop still takes its children, a new
// driver adopts it, and usage is read from /proc. It needs no privileges, so it runs
// everywhere.
func TestUnconfined(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	state := t.TempDir()
	cfg := process.Config{StateDir: state, PollInterval: 20 * time.Millisecond, Unconfined: true, Logger: quietLogger()}
	d, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.CgroupVersion() != 0 {
		t.Fatalf("cgroup version %d, want 0 when unconfined", d.CgroupVersion())
	}
	spec := harness().Spec(t, "unconfined", "tree", "3")
	w, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var group []int
	testenv.EventuallyWith(t, "the worker and its 3 children", 10*time.Second, func() (bool, string) {
		var err error
		group, err = d.Processes(ctx, spec.ID)
		return len(group) >= 4, fmt.Sprintf("process group %v, %v", group, err)
	})
	if u, err := d.Usage(ctx, spec.ID); err != nil || u.MemoryBytes == 0 {
		t.Errorf("usage = %+v, %v", u, err)
	}
	d.Close()

	d2, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	adopted, err := d2.Adopt(ctx)
	if err != nil || len(adopted) != 1 || adopted[0].PID != w.PID {
		t.Fatalf("adopted %+v, %v; want pid %d", adopted, err, w.PID)
	}
	if _, err := d2.Stop(ctx, spec.ID, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, pid := range group {
		if running(pid) {
			t.Errorf("process %d of the worker survived stop", pid)
		}
	}
}

// running reports a process that exists and is not a zombie waiting to be reaped.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
