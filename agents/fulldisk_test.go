package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// mountTmpfs mounts a tmpfs of size at dir (created) until the test ends.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	testenv.Root(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// fill writes a file into dir until the file system is full, and returns it.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	// The last pages too: tmpfs takes what fits of a write.
	for {
		if _, err := f.Write(buf[:512]); err != nil {
			break
		}
	}
	return p
}

// The state directory on a tiny tmpfs, filled up; then the node's session expires (its
// keeper paused past the session timeout, as a long GC pause or a frozen VM would). The
// resumed keeper is in a new session but cannot say so: keeper.json still names the old
// session. Space comes back a moment later (a log rotated), and a master that has not yet
// seen the node re-register writes its assignment, stamped with the old session: an agent
// reading a stale keeper.json would take it for current and restart the worker, whose lease
// its keeper renews meanwhile, while the masters have moved it elsewhere. So the keeper
// renews no lease until it has recorded its status, and records it as soon as it can: no
// worker starts again on the node, judged from the worker's own reports of its starts.
func TestFullDiskNoRestartOnTheOldSession(t *testing.T) {
	h := newHarness(t, "zk")
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	h.drv.Close() // the agent process runs its own driver on the state directory
	mountTmpfs(t, h.stateDir, "4m")
	startAgentProcess(t, h, bin, "--restart-grace", "30s")
	t.Cleanup(func() {
		if pid := keeperPID(h); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	var entry coord.Entry
	testenv.Eventually(t, "node registered", 15*time.Second, func() bool {
		var ok bool
		_, entry, ok = h.record()
		return ok
	})
	// The harness's master writes the node's assignment, stamped with its session; it does
	// not stamp it anew when the node re-registers (it lags).
	wa := h.wa("full", 0, 1, "run")
	wa.Command = []string{stormdockBin, "helper"}
	masterWrites := func() {
		h.assignMu.Lock()
		defer h.assignMu.Unlock()
		h.assigned = []cluster.WorkerAssignment{wa}
		if err := h.writeAssignment(context.Background(), entry.Owner); err != nil {
			t.Fatal(err)
		}
	}
	masterWrites()
	worker := h.waitReports("full.0", 1)[0].PID

	filler := fill(t, h.stateDir)
	kpid := keeperPID(h)
	if kpid == 0 {
		t.Fatal("no keeper process")
	}
	if err := syscall.Kill(kpid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the keeper's session expired (its node entry gone)", 30*time.Second, func() bool {
		_, _, ok := h.record()
		return !ok
	})
	testenv.Eventually(t, "the worker stopped for its lapsed lease", 30*time.Second, func() bool { return !alive(worker) })
	if err := syscall.Kill(kpid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the keeper back in a new session", 30*time.Second, func() bool {
		_, e, ok := h.record()
		return ok && e.Owner != entry.Owner
	})
	onDisk := func() agents.KeeperStatus {
		var st agents.KeeperStatus
		b, _ := os.ReadFile(filepath.Join(h.stateDir, "keeper.json"))
		_ = json.Unmarshal(b, &st)
		return st
	}
	if st := onDisk(); st.Session != entry.Owner {
		t.Fatalf("keeper.json names session %x: it was written on the full disk (the case needs it stale: %x)", st.Session, entry.Owner)
	}
	lease := filepath.Join(h.stateDir, "leases", ".node")
	if r, err := leasefile.Read(lease); err == nil && !r.Lapsed(leasefile.Now(), sessionTimeout, leasefile.BootID()) {
		t.Errorf("lease renewed (%+v) while keeper.json could not be written", r)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	masterWrites()
	testenv.AssertUntil(t, "no restart on the old session", 3*sessionTimeout, func() (bool, string) {
		if rs := h.reports("full.0"); len(rs) != 1 {
			return false, fmt.Sprintf("the worker started %d times: again on the node after its session expired (keeper.json: %+v)", len(rs), onDisk())
		}
		return true, ""
	})
	// The keeper has recorded its new session and renews the lease again, in a new
	// generation.
	testenv.EventuallyWith(t, "keeper.json names the new session", 30*time.Second, func() (bool, string) {
		st := onDisk()
		return st.Session != 0 && st.Session != entry.Owner, fmt.Sprintf("%+v", st)
	})
	testenv.EventuallyWith(t, "the lease renewed", 30*time.Second, func() (bool, string) {
		r, err := leasefile.Read(lease)
		return err == nil && !r.Lapsed(leasefile.Now(), sessionTimeout, leasefile.BootID()), fmt.Sprintf("%+v, %v", r, err)
	})
}
