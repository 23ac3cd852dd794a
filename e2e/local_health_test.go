package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// localCluster is `stormdock up` run as a process of its own.
type localCluster struct {
	url  string
	data string
	cl   *api.Client
}

// startUp runs `stormdock up` with extra flags and waits until the master sees every node.
func startUp(t *testing.T, nodes int, extra ...string) *localCluster {
	t.Helper()
	testenv.Cgroups(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	addr := freeAddr(t)
	args := append([]string{"up", "--nodes", fmt.Sprint(nodes), "--data", data, "--api", addr, "--log-level", "warn"}, extra...)
	cmd := exec.Command(binary, args...)
	lf, err := os.Create(filepath.Join(dir, "up.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT) // up stops every worker, then exits
		select {
		case <-done:
		case <-time.After(testenv.Timeout(time.Minute)):
			_ = cmd.Process.Kill()
			<-done
		}
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(lf.Name())
			t.Logf("stormdock up log:\n%s", tail(b, 4000))
		}
	})
	lc := &localCluster{url: "https://" + addr, data: data} // up serves TLS
	testenv.Eventually(t, "admin token written", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(data, api.AdminTokenFile))
		return err == nil
	})
	tok, err := os.ReadFile(filepath.Join(data, api.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := api.CAPool(filepath.Join(data, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if lc.cl, err = api.NewClient(lc.url, strings.TrimSpace(string(tok)), api.WithRootCAs(pool)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, fmt.Sprintf("%d local nodes", nodes), 30*time.Second, func() bool {
		ns, err := lc.cl.Nodes(context.Background())
		return err == nil && len(ns) == nodes
	})
	return lc
}

// cgroupParent is where a local node's workers' cgroups go (daemon.Local.CgroupParent).
func (lc *localCluster) cgroupParent(node string) string {
	return "/stormdock-local/" + strings.ReplaceAll(filepath.Base(lc.data), ".", "_") + "/" + node
}

// TestLocalClusterHealthScripts runs the health-script checks of TestHealthScripts against
// `stormdock up`: every local node runs the scripts of --health-dir, and throttles or
// turns unhealthy like a node of `stormdock agent`.
func TestLocalClusterHealthScripts(t *testing.T) {
	dir := t.TempDir()
	mode := filepath.Join(dir, "mode")
	scripts := filepath.Join(dir, "health.d")
	if err := os.MkdirAll(scripts, 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\ncase \"$(cat %s)\" in\nwarn) echo \"WARN disk 91%% full\" ;;\nerror) echo \"ERROR disk failed\" ;;\n*) echo ok ;;\nesac\n", mode)
	if err := os.WriteFile(filepath.Join(scripts, "disk"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	set := func(m string) {
		if err := os.WriteFile(mode, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("ok")
	lc := startUp(t, 2, "--dcs", "dc-a", "--health-dir", scripts, "--health-script-interval", "200ms",
		"--mem-high", "0.98", "--mem-low", "0.97", "--mem-critical", "0.99")
	expect := func(what, health string, throttled bool, reason string) {
		t.Helper()
		testenv.Eventually(t, what, 20*time.Second, func() bool {
			ns, err := lc.cl.Nodes(context.Background())
			if err != nil || len(ns) != 2 {
				return false
			}
			for _, n := range ns {
				if n.Health != health || (n.SlotsThrottled > 0) != throttled || !strings.Contains(n.Reason, reason) {
					return false
				}
			}
			return true
		})
	}
	expect("every local node healthy", cluster.HealthHealthy, false, "")
	set("warn")
	expect("WARN throttles every local node", cluster.HealthThrottled, true, "disk 91% full")
	set("error")
	expect("ERROR makes every local node unhealthy", cluster.HealthUnhealthy, true, "disk failed")
	set("ok")
	expect("back to healthy", cluster.HealthHealthy, false, "")
}

// TestLocalClusterMemoryPressure puts one node of `stormdock up` under real memory pressure:
// a 256 MiB limit on the node's cgroup parent and a worker that allocates in steps. The node
// reports throttled slots as memory crosses the high mark, and evicts the worker before the
// kernel kills anything.
func TestLocalClusterMemoryPressure(t *testing.T) {
	lc := startUp(t, 1, "--dcs", "dc-a", "--mem-high", "0.5", "--mem-low", "0.3", "--mem-critical", "0.8",
		"--throttle-hold", "2s", "--health-interval", "100ms")
	ctx := context.Background()
	ns, err := lc.cl.Nodes(ctx)
	if err != nil || len(ns) != 1 {
		t.Fatalf("nodes: %v, %v", ns, err)
	}
	node := ns[0].ID
	const limit = 256 << 20
	mem := filepath.Join("/sys/fs/cgroup/memory", lc.cgroupParent(node))
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if err := os.WriteFile(filepath.Join(mem, f), []byte(fmt.Sprint(limit)), 0o644); err != nil {
			t.Fatalf("limit the local node's cgroup parent: %v", err)
		}
	}
	if err := lc.cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("name: hog\ntenant: e2e\nworkers: 1\nresources: {memory: 512Mi, cpu: 0.2}\ncommand: [%s, '4', 100ms, '240']\ngracePeriod: 1s\n", allocBinary)
	if _, err := lc.cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the local node throttled", 30*time.Second, func() bool {
		n, ok := nodeView(ctx, lc.cl, node)
		return ok && n.SlotsThrottled > 0 && n.Health != cluster.HealthHealthy
	})
	testenv.Eventually(t, "the worker evicted", 30*time.Second, func() bool {
		st, err := lc.cl.Job(ctx, "hog")
		return err == nil && len(st.Workers) == 1 && (st.Workers[0].State == cluster.WorkerEvicted || st.Workers[0].State == api.WorkerUnplaced)
	})
	oom, err := os.ReadFile(filepath.Join(mem, "memory.oom_control"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(oom), "oom_kill 0") {
		t.Errorf("the kernel OOM-killed in the local node's cgroup:\n%s", oom)
	}
}
