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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
)

// An agent killed for good leaves its workers running; once their leases lapse (the ttl is
// the session timeout: about when the master re-places them) the launchers stop them.
func TestKilledAgentsWorkersStopAfterLease(t *testing.T) {
	h := newHarness(t, "zk")
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	h.drv.Close() // the child agent runs its own driver on the state directory
	var stderr bytes.Buffer
	agent := exec.Command(bin, "agent",
		"--store", h.zkURL, "--node-id", nodeID, "--host", "host-1", "--dc", "dc-a", "--rack", "r1",
		"--slots", "2", "--memory", "1Gi", "--cpu", "2", "--labels", "disk=ssd",
		"--session-timeout", sessionTimeout.String(), "--heartbeat", "100ms",
		"--state-dir", h.stateDir, "--cgroup-parent", h.cgParent, "--metrics", "off")
	agent.Stderr = &stderr
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		_ = agent.Wait()
		if t.Failed() {
			t.Logf("agent stderr:\n%s", stderr.String())
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
	testenv.Eventually(t, "orphaned worker stopped", sessionTimeout+5*time.Second, func() bool { return !alive(worker) })
	took := time.Since(killed)
	t.Logf("orphaned worker stopped %s after its agent was killed (lease ttl %s)", took.Round(time.Millisecond), sessionTimeout)
	if took < sessionTimeout/2 {
		t.Errorf("worker stopped %s after the kill: before its lease could lapse", took)
	}
	if !h.terminated("orphan.0", worker) {
		t.Error("the orphaned worker was not given SIGTERM to drain")
	}
	testenv.Eventually(t, "launcher gone", 5*time.Second, func() bool { return !alive(launcher) })
	testenv.Eventually(t, "node entry gone", 10*time.Second, func() bool { _, _, ok := h.record(); return !ok })
}

// The launcher's memory counts against the worker's limit: measure it with the real binary,
// as the cgroup sees it (the same worker with and without the launcher).
func TestLauncherMemoryOverhead(t *testing.T) {
	h := newHarness(t, "mem")
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
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
	specs := []isolation.Spec{
		spec("plain", worker...),
		spec("launched", append([]string{bin, agents.LaunchCommand},
			agents.LaunchConfig{Lease: lease, TTL: time.Minute, Grace: cluster.DefaultGracePeriod, Command: worker}.Args()...)...),
	}
	for _, s := range specs {
		s.Env = map[string]string{"HELPER_DIR": h.helperDir}
		if _, err := h.drv.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "helpers up", 10*time.Second, func() bool { return len(h.reports("mem.0")) == 2 })
	// Both programs run; their memory grows for a moment as the runtimes start: the overhead
	// must settle between 0 and 32 MiB.
	usage := map[string]uint64{}
	var overhead int64
	testenv.EventuallyWith(t, "launcher overhead between 0 and 32 MiB", 5*time.Second, func() (bool, string) {
		for _, s := range specs {
			u, err := h.drv.Usage(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			usage[s.ID] = u.MemoryBytes
		}
		overhead = int64(usage["launched"]) - int64(usage["plain"])
		return overhead > 0 && overhead <= 32<<20, fmt.Sprintf("overhead %d bytes", overhead)
	})
	t.Logf("cgroup memory: worker alone %.1f MiB, under the launcher %.1f MiB: launcher overhead %.1f MiB",
		mib(usage["plain"]), mib(usage["launched"]), float64(overhead)/(1<<20))
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
