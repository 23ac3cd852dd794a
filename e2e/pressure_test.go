package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// nodeView finds one node in the master's node list.
func nodeView(ctx context.Context, cl *api.Client, id string) (api.NodeView, bool) {
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return api.NodeView{}, false
	}
	for _, n := range nodes {
		if n.ID == id {
			return n, true
		}
	}
	return api.NodeView{}, false
}

// TestMemoryPressure is issue 7's real-pressure run: an agent whose workers' cgroup parent
// has a 256 MiB limit, and a worker that allocates in steps. Slots are withheld in the
// master's view as memory crosses the high mark, the worker is evicted (and placed on
// another node) before anything is OOM-killed, and slots come back only after the hold
// time once memory is freed.
func TestMemoryPressure(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	cl := h.AdminClient(h.StartMaster("m1"))
	ctx := context.Background()
	const limit = 256 << 20
	// p1's --cgroup-parent, made beforehand with the limit: v1 or v2, as the host has it.
	mem := h.Cgroup + "/p1"
	limitMemory(t, mem, limit)
	const hold = 2 * time.Second
	h.StartAgent("p1", "dc-a", "r1", 4, "--mem-high", "0.5", "--mem-low", "0.3", "--mem-critical", "0.8",
		"--throttle-hold", hold.String(), "--health-interval", "100ms")
	testenv.Eventually(t, "node p1", 15*time.Second, func() bool { _, ok := nodeView(ctx, cl, "p1"); return ok })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("name: hog\ntenant: e2e\nworkers: 1\nresources: {memory: 512Mi, cpu: 0.2}\ncommand: [%s, '4', 100ms, '240']\ngracePeriod: 1s\n", allocBinary)
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}

	// Watch the parent's memory closely, and the master's view of p1.
	watch := watchMemory(t, mem, limit/2, limit*3/10)
	var withheldAt time.Time
	testenv.Eventually(t, "slots withheld in the master's view", 30*time.Second, func() bool {
		n, _ := nodeView(ctx, cl, "p1")
		if n.SlotsThrottled > 0 {
			withheldAt = time.Now()
			return true
		}
		return false
	})
	if lag := watch.since(t, withheldAt, "slots withheld"); lag >= 0 {
		t.Logf("figure: memory crossed the high mark -> slots withheld in the master's view: %s", lag.Round(time.Millisecond))
	}

	// A second node to take the evicted worker.
	h.StartAgent("p2", "dc-a", "r2", 4)
	testenv.Eventually(t, "worker evicted from p1 and running on p2", 30*time.Second, func() bool {
		st, err := cl.Job(ctx, "hog")
		return err == nil && len(st.Workers) == 1 && st.Workers[0].Node == "p2" && st.Workers[0].State == cluster.WorkerRunning
	})
	if k := oomKills(t, mem); k != 0 {
		t.Errorf("the kernel OOM-killed %d processes in the node's cgroup", k)
	}
	if hits := limitHits(t, mem); hits != 0 {
		t.Logf("memory limit hit %d times (allocations reclaimed at the limit, no kill)", hits)
	}

	// Memory is freed: slots come back, but only after the hold time.
	var restoredAt time.Time
	testenv.Eventually(t, "p1's slots restored", 30*time.Second, func() bool {
		n, _ := nodeView(ctx, cl, "p1")
		if n.SlotsThrottled == 0 && n.Health == cluster.HealthHealthy {
			restoredAt = time.Now()
			return true
		}
		return false
	})
	if watch.below.Load() == 0 {
		t.Fatal("slots restored but memory never went below the low mark")
	}
	if held := restoredAt.Sub(time.Unix(0, watch.below.Load())); held < hold-200*time.Millisecond {
		t.Errorf("slots restored %s after memory went below the low mark; the hold is %s", held, hold)
	} else {
		t.Logf("figure: memory below the low mark -> slots restored: %s (hold %s)", held.Round(time.Millisecond), hold)
	}
}

// TestHealthScripts checks each kind of health script through the master's node list: WARN
// throttles, ERROR and a non-zero exit make the node unhealthy, a hung script is killed and
// fails, and a passing script brings the node back.
func TestHealthScripts(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	cl := h.AdminClient(h.StartMaster("m1"))
	ctx := context.Background()
	dir := t.TempDir()
	mode := filepath.Join(dir, "mode")
	scripts := filepath.Join(dir, "health.d")
	if err := os.MkdirAll(scripts, 0o755); err != nil {
		t.Fatal(err)
	}
	// One script whose behaviour the test switches through a file.
	script := fmt.Sprintf(`#!/bin/sh
case "$(cat %s)" in
warn) echo "WARN disk 91%% full" ;;
error) echo "ERROR disk failed" ;;
exit) echo "checking"; exit 3 ;;
hang) sleep 60 ;;
*) echo ok ;;
esac
`, mode)
	if err := os.WriteFile(filepath.Join(scripts, "disk"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	set := func(m string) {
		if err := os.WriteFile(mode, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("ok")
	h.StartAgent("s1", "dc-a", "r1", 4, "--health-dir", scripts, "--health-script-interval", "200ms",
		"--health-script-timeout", "500ms", "--mem-high", "0.98", "--mem-low", "0.97", "--mem-critical", "0.99")
	expect := func(what, health string, throttled bool, reason string) {
		t.Helper()
		testenv.Eventually(t, what, 20*time.Second, func() bool {
			n, ok := nodeView(ctx, cl, "s1")
			return ok && n.Health == health && (n.SlotsThrottled > 0) == throttled && strings.Contains(n.Reason, reason)
		})
	}
	expect("healthy", cluster.HealthHealthy, false, "")
	set("warn")
	expect("WARN throttles", cluster.HealthThrottled, true, "disk 91% full")
	set("error")
	expect("ERROR makes the node unhealthy", cluster.HealthUnhealthy, true, "disk failed")
	set("ok")
	expect("back to healthy", cluster.HealthHealthy, false, "")
	set("exit")
	expect("a non-zero exit makes the node unhealthy", cluster.HealthUnhealthy, true, "")
	set("hang")
	expect("a hung script fails", cluster.HealthUnhealthy, true, "")
	set("ok")
	expect("healthy again", cluster.HealthHealthy, false, "")
}
