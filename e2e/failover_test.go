package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestClusterLifecycle is issue 5's end-to-end run on one ZooKeeper: submit, lose an agent
// for good, lose the active master, restart an agent, and expire an agent's session.
func TestClusterLifecycle(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	m1 := h.StartMaster("m1")
	cl := h.AdminClient(m1)
	ctx := context.Background()
	testenv.Eventually(t, "m1 leads", 15*time.Second, func() bool {
		hl, err := cl.Health(ctx)
		return err == nil && hl.Leader
	})
	m2 := h.StartMaster("m2")
	nodes := [][3]string{{"a1", "dc-a", "r1"}, {"a2", "dc-a", "r2"}, {"b1", "dc-b", "r1"}, {"b2", "dc-b", "r2"}, {"c1", "dc-c", "r1"}, {"c2", "dc-c", "r2"}}
	for _, n := range nodes {
		h.StartAgent(n[0], n[1], n[2], 4)
	}
	testenv.Eventually(t, "6 nodes registered", 15*time.Second, func() bool { return len(h.NodeRecords()) == 6 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", 12)); err != nil {
		t.Fatal(err)
	}

	// Every worker runs where the plan says.
	testenv.Eventually(t, "12 workers running", 30*time.Second, func() bool { return len(h.Running("wc")) == 12 })
	st, err := cl.Job(ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	run := h.Running("wc")
	perNode := map[string]int{}
	for _, w := range st.Workers {
		got := run[cluster.WorkerKey{Job: "wc", Worker: w.Worker}]
		if got.Node != w.Node || !clustertest.Alive(got.PID) {
			t.Errorf("worker %d: planned on %s, runs on %s (pid %d alive %v)", w.Worker, w.Node, got.Node, got.PID, clustertest.Alive(got.PID))
		}
		perNode[w.Node]++
	}
	for n, c := range perNode {
		if c != 2 {
			t.Errorf("node %s runs %d workers; an even spread of 12 over 6 nodes is 2 each", n, c)
		}
	}

	// SIGKILL an agent for good: its workers come back elsewhere; its orphans stop.
	victim := run[cluster.WorkerKey{Job: "wc", Worker: 0}].Node
	var orphans []int
	for _, w := range run {
		if w.Node == victim {
			orphans = append(orphans, w.PID)
		}
	}
	h.KillNode(victim)
	testenv.Eventually(t, "workers of the killed agent running elsewhere", 30*time.Second, func() bool {
		now := h.Running("wc")
		if len(now) != 12 {
			return false
		}
		for _, w := range now {
			if w.Node == victim {
				return false
			}
		}
		return true
	})
	for k, w := range h.Running("wc") {
		if before := run[k]; before.Node != victim && before.PID != w.PID {
			t.Errorf("worker %s restarted (pid %d -> %d) though its node stayed", k, before.PID, w.PID)
		}
	}
	testenv.Eventually(t, "orphaned copies of the dead agent stopped", 15*time.Second, func() bool {
		for _, pid := range orphans {
			if clustertest.Alive(pid) {
				return false
			}
		}
		return true
	})

	// SIGKILL the active master: the standby leads and nothing restarts.
	before := h.Running("wc")
	versions := h.AssignmentVersions()
	h.Master("m1").Kill()
	cl2 := h.AdminClient(m2)
	testenv.Eventually(t, "m2 leads", 15*time.Second, func() bool {
		hl, err := cl2.Health(ctx)
		return err == nil && hl.Leader
	})
	// Once the new leader has reconciled (a standby never does), it must have rewritten no
	// assignment, and no worker may have changed.
	testenv.Eventually(t, "a reconcile of m2", 15*time.Second, func() bool { return reconciles(t, h, m2) > 0 })
	if now := h.AssignmentVersions(); !maps.Equal(versions, now) {
		t.Errorf("assignments rewritten across master failover: versions %v -> %v", versions, now)
	}
	if after := h.Running("wc"); !maps.Equal(before, after) {
		t.Errorf("workers changed across master failover:\nbefore %v\nafter  %v", before, after)
	}

	// Restart an agent: its workers are adopted, same pids.
	var restarted string
	for _, w := range before {
		restarted = w.Node
		break
	}
	p := h.Agent(restarted)
	old, err := h.Store.Get(ctx, cluster.NodesKey+"/"+restarted)
	if err != nil {
		t.Fatal(err)
	}
	var oldRec cluster.NodeRecord
	if err := json.Unmarshal(old.Value, &oldRec); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	h.StartAgent(restarted, p.Args[6], p.Args[8], 4)
	kept := func() (bool, string) {
		now := h.Running("wc")
		for k, w := range before {
			if w.Node == restarted && now[k] != w {
				return false, fmt.Sprintf("worker %s on restarted agent %s: was %+v, now %+v", k, restarted, w, now[k])
			}
		}
		return true, ""
	}
	// The new agent reports the workers it adopted.
	testenv.EventuallyWith(t, "the restarted agent reporting its workers", 15*time.Second, func() (bool, string) {
		if rec := h.NodeRecords()[restarted]; rec.Agent == oldRec.Agent {
			return false, "the record is the killed agent's"
		}
		return kept()
	})
	// The node's keeper held its session through the restart: the master never saw the
	// node go, and the workers stay put through two heartbeats.
	if e, err := h.Store.Get(ctx, cluster.NodesKey+"/"+restarted); err != nil || e.Owner != old.Owner {
		t.Errorf("node entry of the restarted agent: owner %x -> %x (%v): the node was re-registered", old.Owner, e.Owner, err)
	}
	testenv.AssertUntil(t, "the restarted agent's workers kept", 2*500*time.Millisecond, kept)
	after := h.Running("wc")

	// Pause an agent past its session timeout: its workers are re-placed, and once it
	// resumes it stops its stale copies.
	var paused string
	var stale []int
	for _, w := range after {
		if paused == "" {
			paused = w.Node
		}
	}
	for _, w := range after {
		if w.Node == paused {
			stale = append(stale, w.PID)
		}
	}
	h.SignalNode(paused, syscall.SIGSTOP)
	testenv.Eventually(t, "workers of the paused agent re-placed", 30*time.Second, func() bool {
		now := h.Running("wc")
		n := 0
		for _, w := range now {
			if w.Node != paused {
				n++
			}
		}
		return n == 12
	})
	h.SignalNode(paused, syscall.SIGCONT)
	testenv.Eventually(t, "stale copies on the resumed agent stopped", 15*time.Second, func() bool {
		for _, pid := range stale {
			if clustertest.Alive(pid) {
				return false
			}
		}
		return true
	})
	testenv.Eventually(t, "resumed agent back with no worker of the job", 15*time.Second, func() bool {
		rec, ok := h.NodeRecords()[paused]
		if !ok {
			return false
		}
		for _, w := range rec.Workers {
			if w.Key.Job == "wc" {
				return false
			}
		}
		return true
	})
}
