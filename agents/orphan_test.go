package agents_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
)

// startAgentProcess runs the real agent binary for the harness's node with extra flags.
func startAgentProcess(t *testing.T, h *harness, bin string, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	var stderr bytes.Buffer
	args := append([]string{"agent",
		"--store", h.zkURL, "--node-id", nodeID, "--host", "host-1", "--dc", "dc-a", "--rack", "r1",
		"--slots", "2", "--memory", "1Gi", "--cpu", "2", "--labels", "disk=ssd",
		"--session-timeout", sessionTimeout.String(), "--heartbeat", "100ms",
		"--state-dir", h.stateDir, "--cgroup-parent", h.cgParent, "--metrics", "off"}, extra...)
	agent := exec.Command(bin, args...)
	agent.Stderr = &stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		_ = agent.Wait()
		if t.Failed() {
			t.Logf("agent stderr:\n%s", stderr.String())
			if b, err := os.ReadFile(filepath.Join(h.stateDir, "keeper.log")); err == nil {
				t.Logf("keeper log:\n%s", b)
			}
		}
	})
	return agent, &stderr
}

// keeperPID is the pid of the node's keeper process, 0 when none runs.
func keeperPID(h *harness) int {
	b, err := os.ReadFile(filepath.Join(h.stateDir, "keeper.json"))
	if err != nil {
		return 0
	}
	var st agents.KeeperStatus
	if json.Unmarshal(b, &st) != nil || !alive(st.PID) {
		return 0
	}
	return st.PID
}

// An agent killed for good leaves its workers running while its node's keeper holds their
// leases: not at all without a restart grace (the keeper lives in the agent's process), for
// the grace with one. Then the leases lapse, the launchers stop the workers (with SIGTERM
// first), and the node's entry goes.
func TestKilledAgentsWorkersStopAfterLease(t *testing.T) {
	for _, grace := range []time.Duration{0, 3 * time.Second} {
		t.Run(fmt.Sprintf("restart-grace=%s", grace), func(t *testing.T) {
			h := newHarness(t, "zk")
			bin := testenv.BuildBinary(t, "./cmd/stormdock")
			h.drv.Close() // the child agent runs its own driver on the state directory
			agent, _ := startAgentProcess(t, h, bin, "--restart-grace", grace.String())
			t.Cleanup(func() {
				if pid := keeperPID(h); pid != 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			wa := h.wa("orphan", 0, 1, "run")
			wa.Command = []string{stormdockBin, "helper"} // the real binary has no test worker
			h.assign(wa)
			rec := h.waitRecord("worker running", 15*time.Second, allRunning("orphan/0"))
			if rec.Node.Labels["disk"] != "ssd" || rec.Node.Labels["isolation/process"] != "true" {
				t.Errorf("labels = %v", rec.Node.Labels)
			}
			launcher := states(rec)["orphan/0"].PID
			worker := h.waitReports("orphan.0", 1)[0].PID

			if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			_ = agent.Wait()
			if grace > 0 {
				// The keeper says so in the node record: no new worker goes to a node whose
				// agent is away.
				h.waitRecord("node marked: agent not running", 10*time.Second, func(rec cluster.NodeRecord) bool {
					return rec.Health.State == cluster.HealthUnhealthy && strings.Contains(rec.Health.Reason, "agent not running")
				})
				if !alive(worker) {
					t.Fatalf("worker stopped %s after its agent was killed, inside the restart grace %s", time.Since(killed), grace)
				}
			}
			testenv.Eventually(t, "orphaned worker stopped", grace+sessionTimeout+5*time.Second, func() bool { return !alive(worker) })
			took := time.Since(killed)
			t.Logf("figure: orphaned worker stopped %s after its agent was killed (restart grace %s, lease ttl %s)",
				took.Round(time.Millisecond), grace, sessionTimeout)
			if took < grace+sessionTimeout/2 {
				t.Errorf("worker stopped %s after the kill: before the grace and its lease could lapse", took)
			}
			if !h.terminated("orphan.0", worker) {
				t.Error("the orphaned worker was not given SIGTERM to drain")
			}
			testenv.Eventually(t, "launcher gone", 5*time.Second, func() bool { return !alive(launcher) })
			testenv.Eventually(t, "node entry gone", 10*time.Second, func() bool { _, _, ok := h.record(); return !ok })
			testenv.Eventually(t, "keeper gone", 10*time.Second, func() bool { return keeperPID(h) == 0 })
		})
	}
}

// An agent restarted within the restart grace finds its node registered and its workers
// running: the same pids, the node's entry never gone (its keeper held the session).
func TestRestartedAgentKeepsWorkersWithinGrace(t *testing.T) {
	h := newHarness(t, "zk")
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	h.drv.Close()
	agent, _ := startAgentProcess(t, h, bin, "--restart-grace", "30s")
	t.Cleanup(func() {
		if pid := keeperPID(h); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	wa := h.wa("kept", 0, 1, "run")
	wa.Command = []string{stormdockBin, "helper"}
	h.assign(wa)
	rec := h.waitRecord("worker running", 15*time.Second, allRunning("kept/0"))
	_, entry, _ := h.record()
	launcher := states(rec)["kept/0"].PID
	worker := h.waitReports("kept.0", 1)[0].PID
	if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = agent.Wait()
	h.waitRecord("node marked: agent not running", 10*time.Second, func(rec cluster.NodeRecord) bool {
		return strings.Contains(rec.Health.Reason, "agent not running")
	})
	// Away for longer than a lease lasts without renewal: the keeper renewed it meanwhile.
	testenv.Eventually(t, "the keeper renewed the lease past the agent's death", 10*time.Second, func() bool {
		fi, err := os.Stat(filepath.Join(h.stateDir, "leases", ".node"))
		return err == nil && fi.ModTime().After(killed.Add(sessionTimeout))
	})
	if !alive(worker) {
		t.Fatal("worker stopped while its agent was away, inside the restart grace")
	}
	startAgentProcess(t, h, bin, "--restart-grace", "30s")
	rec = h.waitRecord("agent back, worker adopted", 15*time.Second, func(rec cluster.NodeRecord) bool {
		return rec.Health.State == cluster.HealthHealthy && allRunning("kept/0")(rec)
	})
	if got := states(rec)["kept/0"].PID; got != launcher || !alive(worker) {
		t.Errorf("worker runs as launcher pid %d (was %d), worker alive %v: the restart replaced it", got, launcher, alive(worker))
	}
	if _, e, _ := h.record(); e.Owner != entry.Owner || e.CreateRev != entry.CreateRev {
		t.Errorf("node entry re-created across the agent's restart (session %x -> %x): the master saw the node go", entry.Owner, e.Owner)
	}
}

// The launcher's memory counts against the worker's limit: measure it with the real binaries,
// stormdock-shim's and stormdock's, as the cgroup sees it (the same worker with and without
// the launcher).
func TestLauncherMemoryOverhead(t *testing.T) {
	h := newHarness(t, "mem")
	bins := map[string]string{
		"stormdock":      testenv.BuildBinary(t, "./cmd/stormdock"),
		"stormdock-shim": testenv.BuildBinary(t, "./cmd/stormdock-shim"),
	}
	ctx := context.Background()
	lease := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	spec := func(id string, cmd ...string) isolation.Spec {
		return isolation.Spec{ID: id, Job: "mem", Node: nodeID, Command: cmd, MemoryBytes: 256 << 20, MilliCPU: 500}
	}
	worker := []string{stormdockBin, "helper"}
	t.Setenv("HELPER_DIR", h.helperDir)
	specs := []isolation.Spec{spec("plain", worker...)}
	for name, bin := range bins {
		specs = append(specs, spec(name, append([]string{bin, launcher.Command},
			launcher.Config{Lease: lease, TTL: time.Minute, Grace: cluster.DefaultGracePeriod, Command: worker}.Args()...)...))
	}
	for _, s := range specs {
		s.Env = map[string]string{"HELPER_DIR": h.helperDir}
		if _, err := h.drv.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "helpers up", 10*time.Second, func() bool { return len(h.reports("mem.0")) == len(specs) })
	// Every program runs; their memory grows for a moment as the runtimes start: the overhead
	// must settle between 0 and 32 MiB.
	usage := map[string]uint64{}
	overhead := map[string]int64{}
	testenv.EventuallyWith(t, "launcher overheads between 0 and 32 MiB", 5*time.Second, func() (bool, string) {
		for _, s := range specs {
			u, err := h.drv.Usage(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			usage[s.ID] = u.MemoryBytes
		}
		for name := range bins {
			overhead[name] = int64(usage[name]) - int64(usage["plain"])
			if o := overhead[name]; o <= 0 || o > 32<<20 {
				return false, fmt.Sprintf("overhead of %s's launcher %d bytes", name, o)
			}
		}
		return true, ""
	})
	for name := range bins {
		t.Logf("figure: cgroup memory: worker alone %.1f MiB, under %s's launcher %.1f MiB: launcher overhead %.1f MiB",
			mib(usage["plain"]), name, mib(usage[name]), float64(overhead[name])/(1<<20))
	}
	for _, s := range specs {
		if _, err := h.drv.Stop(ctx, s.ID, 2*time.Second); err != nil {
			t.Error(err)
		}
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// The example job end to end: the agent runs [stormdock, worker, wordcount] with its own
// binary, and the workers split the sample by STORMDOCK_WORKER and post to STORMDOCK_OUTPUT.
func TestWordcountExampleRuns(t *testing.T) {
	h := newHarness(t, "mem")
	cfg := h.cfg
	cfg.Self = testenv.BuildBinary(t, "./cmd/stormdock")
	var mu sync.Mutex
	byWorker := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := bufio.NewScanner(r.Body)
		mu.Lock()
		defer mu.Unlock()
		for sc.Scan() {
			var rec struct {
				Offset int64 `json:"offset"`
				Worker int   `json:"worker"`
			}
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil || rec.Offset%2 != int64(rec.Worker) {
				t.Errorf("bad record %s (%v)", sc.Text(), err)
			}
			byWorker[rec.Worker]++
		}
	}))
	defer srv.Close()
	h.start(cfg, h.agentStore())
	var ws []cluster.WorkerAssignment
	for i := 0; i < 2; i++ {
		wa := h.wa("wordcount", i, 1, "run")
		wa.Workers = 2
		wa.Command = []string{"stormdock", "worker", "wordcount"}
		wa.Output = srv.URL
		ws = append(ws, wa)
	}
	h.assign(ws...)
	h.waitRecord("running", 15*time.Second, allRunning("wordcount/0", "wordcount/1"))
	testenv.Eventually(t, "records of both workers", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return byWorker[0] > 0 && byWorker[1] > 0
	})
}
