package healthcheck

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/internal/testenv"
)

func TestWorkerOOMScoreAdj(t *testing.T) {
	for prio, want := range map[int]int{-5: 1000, 0: 1000, 100: 900, 499: 501, 500: 500, 10000: 500} {
		if got := WorkerOOMScoreAdj(prio); got != want {
			t.Errorf("WorkerOOMScoreAdj(%d) = %d, want %d", prio, got, want)
		}
	}
	if WorkerOOMScoreAdj(0) <= AgentOOMScoreAdj {
		t.Error("a worker must be a likelier OOM victim than the agent")
	}
}

func TestOOMScoreAdjFixture(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ProtectAgent(proc); err != nil {
		t.Fatal(err)
	}
	if v, err := OOMScoreAdj(proc, 0); err != nil || v != -1000 {
		t.Fatalf("read back %d, %v", v, err)
	}
	if err := SetOOMScoreAdj(proc, 0, 1001); err == nil {
		t.Error("out of range: no error")
	}
	if _, err := OOMScoreAdj(proc, 12345); err == nil {
		t.Error("missing pid: no error")
	}
}

// hasCapSysResource reads CapEff of this process: lowering oom_score_adj needs bit 24.
func hasCapSysResource(t *testing.T) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

func readOOM(t *testing.T, pid int) int {
	t.Helper()
	v, err := OOMScoreAdj("", pid)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestOOMScoreAdjReal writes this very test process's oom_score_adj as the agent would its
// own, and restores it. With CAP_SYS_RESOURCE the agent reaches -1000 and its children
// inherit that (why the driver must raise workers); without it (root in many containers,
// this machine's sandbox included) ProtectAgent must fail with a permission error and leave
// the value as it was. Either way a worker raised to WorkerOOMScoreAdj scores far above.
func TestOOMScoreAdjReal(t *testing.T) {
	testenv.Root(t)
	orig := readOOM(t, 0)
	t.Cleanup(func() {
		if err := SetOOMScoreAdj("", 0, orig); err != nil {
			t.Errorf("restore oom_score_adj %d: %v", orig, err)
		}
		if v := readOOM(t, 0); v != orig {
			t.Errorf("oom_score_adj left at %d, was %d", v, orig)
		}
	})
	// A raise is always allowed, and so is coming back down to the floor: the real write path.
	up := min(orig+100, 1000)
	if err := SetOOMScoreAdj("", 0, up); err != nil {
		t.Fatal(err)
	}
	if v := readOOM(t, 0); v != up {
		t.Fatalf("wrote %d, read %d", up, v)
	}
	if err := SetOOMScoreAdj("", 0, orig); err != nil {
		t.Fatal(err)
	}

	err := ProtectAgent("")
	agent := orig
	if hasCapSysResource(t) {
		if err != nil {
			t.Fatalf("ProtectAgent with CAP_SYS_RESOURCE: %v", err)
		}
		agent = AgentOOMScoreAdj
	} else {
		t.Logf("no CAP_SYS_RESOURCE: ProtectAgent says %v", err)
		if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Fatalf("ProtectAgent without CAP_SYS_RESOURCE: %v, want a permission error naming the capability", err)
		}
	}
	if v := readOOM(t, 0); v != agent {
		t.Fatalf("agent oom_score_adj %d, want %d", v, agent)
	}

	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if v := readOOM(t, pid); v != agent {
		t.Fatalf("child inherits %d, want the agent's %d", v, agent)
	}
	want := WorkerOOMScoreAdj(100)
	if err := SetOOMScoreAdj("", pid, want); err != nil {
		t.Fatal(err)
	}
	if v := readOOM(t, pid); v != want {
		t.Fatalf("worker value read back %d, want %d", v, want)
	}
	// The kernel's badness score follows: the worker far above the agent.
	score := func(who string) int {
		b, err := os.ReadFile(filepath.Join("/proc", who, "oom_score"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if a, w := score("self"), score(strconv.Itoa(pid)); w < 900 || w <= a {
		t.Errorf("oom_score: worker %d, agent %d; want the worker at least 900 and above the agent", w, a)
	}
}
