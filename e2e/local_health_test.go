package e2e

import (
	"context"
	"errors"
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
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// localCluster is `stormdock up` run as a process of its own.
type localCluster struct {
	url    string
	data   string
	parent string // --cgroup-parent, if given
	cl     *api.Client
}

// startUp runs `stormdock up` with extra flags and waits until the master sees every node.
func startUp(t *testing.T, nodes int, extra ...string) *localCluster {
	t.Helper()
	return startUpWith(t, upOptions{}, nodes, extra...)
}

// upOptions change how startUpWith runs `stormdock up`.
type upOptions struct {
	bin, data string          // default: the test build, a fresh directory
	setup     func(*exec.Cmd) // credentials, cgroup
}

func startUpWith(t *testing.T, o upOptions, nodes int, extra ...string) *localCluster {
	t.Helper()
	testenv.Cgroups(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if o.data != "" {
		data = o.data
	}
	if o.bin == "" {
		o.bin = binary
	}
	addr := clustertest.FreeAddr(t)
	args := append([]string{"up", "--nodes", fmt.Sprint(nodes), "--data", data, "--api", addr, "--log-level", "warn"}, extra...)
	cmd := exec.Command(o.bin, args...)
	if o.setup != nil {
		o.setup(cmd)
	}
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
			t.Logf("stormdock up log:\n%s", clustertest.Tail(b, 4000))
		}
	})
	lc := &localCluster{url: "https://" + addr, data: data} // up serves TLS
	for i, a := range extra {
		if a == "--cgroup-parent" && i+1 < len(extra) {
			lc.parent = extra[i+1]
		}
	}
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

// cgroupParent is where a local node's workers' cgroups go (daemon.Local.CgroupParent):
// below --cgroup-parent when given.
func (lc *localCluster) cgroupParent(node string) string {
	if lc.parent != "" {
		return lc.parent + "/" + node
	}
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

// TestLocalClusterMemoryPressure puts `stormdock up` under real memory pressure: its
// --cgroup-parent has a 256 MiB limit (v1 or v2, as the host has it) and its one node runs a
// worker that allocates in steps. The node reports throttled slots as memory crosses the high
// mark, and evicts the worker before the kernel kills anything.
func TestLocalClusterMemoryPressure(t *testing.T) {
	testenv.Cgroups(t)
	const limit = 256 << 20
	parent := fmt.Sprintf("/stormdock-e2e-up-%d", os.Getpid())
	limitMemory(t, parent, limit)
	t.Cleanup(func() { clustertest.KillCgroupTree(parent) }) // after up's own cleanup: cleanups run last first
	lc := startUp(t, 1, "--dcs", "dc-a", "--cgroup-parent", parent, "--mem-high", "0.5", "--mem-low", "0.3", "--mem-critical", "0.8",
		"--throttle-hold", "2s", "--health-interval", "100ms")
	ctx := context.Background()
	ns, err := lc.cl.Nodes(ctx)
	if err != nil || len(ns) != 1 {
		t.Fatalf("nodes: %v, %v", ns, err)
	}
	node := ns[0].ID
	if err := lc.cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	watch := watchMemory(t, parent, limit/2, limit*3/10)
	spec := fmt.Sprintf("name: hog\ntenant: e2e\nworkers: 1\nresources: {memory: 512Mi, cpu: 0.2}\ncommand: [%s, '4', 100ms, '240']\ngracePeriod: 1s\n", allocBinary)
	if _, err := lc.cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	var throttledAt time.Time
	testenv.Eventually(t, "the local node throttled", 30*time.Second, func() bool {
		n, ok := nodeView(ctx, lc.cl, node)
		if ok && n.SlotsThrottled > 0 && n.Health != cluster.HealthHealthy {
			throttledAt = time.Now()
			return true
		}
		return false
	})
	if lag := watch.since(t, throttledAt, "the node throttled"); lag >= 0 {
		t.Logf("figure: stormdock up, cgroup %s: memory crossed the high mark -> node throttled in the master's view: %s", cgroupVersion(), lag.Round(time.Millisecond))
	}
	testenv.Eventually(t, "the worker evicted", 30*time.Second, func() bool {
		st, err := lc.cl.Job(ctx, "hog")
		return err == nil && len(st.Workers) == 1 && (st.Workers[0].State == cluster.WorkerEvicted || st.Workers[0].State == api.WorkerUnplaced)
	})
	if k := oomKills(t, parent); k != 0 {
		t.Errorf("the kernel OOM-killed %d processes in the local cluster's cgroup", k)
	}
	// The node's workers went below the cluster's parent, not elsewhere.
	if _, err := os.Stat(memoryDir(lc.cgroupParent(node))); err != nil {
		t.Errorf("the node's cgroup parent: %v", err)
	}
}

// TestLocalClusterDelegated runs `stormdock up` as an unprivileged user inside a cgroup
// delegated to it, as a systemd unit with Delegate=yes (and DelegateSubgroup=) gets one: with
// --cgroup-parent inside that cgroup its workers run in cgroups of their own, made by that
// user, and nothing outside the subtree is written (the user could not). Given a parent
// outside it, up says in one line what it needs.
func TestLocalClusterDelegated(t *testing.T) {
	const nobody = 65534
	top := fmt.Sprintf("/stormdock-e2e-deleg-%d", os.Getpid())
	unit := top + "/unit"
	testenv.Delegate(t, unit, nobody)
	leaf := unit + "/up"
	if testenv.CgroupV2() {
		dir := filepath.Join(testenv.CgroupRoot, leaf)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		testenv.ChownCgroup(t, dir, nobody)
	}
	bins, state := testenv.Shared(t, nobody, binary, allocBinary)
	asNobody := func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		done := testenv.StartIn(t, cmd, leaf)
		t.Cleanup(done)
	}

	bad := exec.Command(bins[0], "up", "--nodes", "1", "--data", filepath.Join(state, "bad"), "--api", clustertest.FreeAddr(t),
		"--cgroup-parent", top+"/elsewhere", "--log-level", "error")
	asNobody(bad)
	out, err := bad.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("up with a cgroup parent outside the delegated subtree: %v\n%s", err, out)
	}
	msg := strings.TrimSpace(string(out))
	t.Logf("as uid %d, outside its subtree: %s", nobody, msg)
	if !strings.Contains(msg, "isolation unavailable") || !strings.Contains(msg, "delegated to uid 65534") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want one line saying the cgroup parent must be delegated", msg)
	}

	parent := unit + "/workers"
	// Without root, workers run as the user that runs up: the single-tenant opt-out.
	lc := startUpWith(t, upOptions{bin: bins[0], data: filepath.Join(state, "data"), setup: asNobody}, 1,
		"--dcs", "dc-a", "--cgroup-parent", parent, "--run-as", "65534:65534")
	ctx := context.Background()
	if err := lc.cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("name: held\ntenant: e2e\nworkers: 1\nresources: {memory: 128Mi, cpu: 0.2}\ncommand: [%s, '4', 10ms, '16']\n", bins[1])
	if _, err := lc.cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	var w api.WorkerView
	testenv.Eventually(t, "the worker running", 30*time.Second, func() bool {
		st, err := lc.cl.Job(ctx, "held")
		if err != nil || len(st.Workers) != 1 || st.Workers[0].State != cluster.WorkerRunning || st.Workers[0].PID == 0 {
			return false
		}
		w = st.Workers[0]
		return true
	})
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", w.PID))
	if err != nil {
		t.Fatal(err)
	}
	want := lc.cgroupParent(w.Node) + "/"
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if (strings.HasPrefix(line, "0::") && testenv.CgroupV2()) || strings.Contains(line, ":memory:") {
			if !strings.Contains(line, want) {
				t.Errorf("worker (pid %d) runs in %q, want a cgroup below %s", w.PID, line, want)
			}
		}
	}
	// Made by the unprivileged user: the node's parent and the worker's cgroup are its own.
	fi, err := os.Stat(memoryDir(lc.cgroupParent(w.Node)))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != nobody {
		t.Errorf("the node's cgroup parent belongs to uid %d, want %d", uid, nobody)
	}
}
