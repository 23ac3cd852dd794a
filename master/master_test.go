package master_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestMasterPlacesAndReplacesLostNode(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	clients := map[string]*coord.Embedded{}
	for _, n := range clustertest.Nodes(2, 2, 2) {
		clients[n.ID] = tc.Node(n)
	}
	tc.Wordcount(m, 8, 12)
	before := tc.Assignments()
	perNode := map[string]int{}
	for _, n := range before {
		perNode[n]++
	}
	for n, c := range perNode {
		if c > 2 {
			t.Errorf("node %s has %d workers; an even spread over 8 nodes puts at most 2", n, c)
		}
	}
	// Lose a node that has workers: only its workers move.
	lost := before[cluster.WorkerKey{Job: "wc", Worker: 0}]
	clients[lost].Close()
	testenv.Eventually(t, "workers of the lost node re-placed", 5*time.Second, func() bool {
		a := tc.Assignments()
		if len(a) != 12 {
			return false
		}
		for _, n := range a {
			if n == lost {
				return false
			}
		}
		return true
	})
	after := tc.Assignments()
	for k, n := range before {
		if n != lost && after[k] != n {
			t.Errorf("worker %s moved from %s to %s though its node stayed", k, n, after[k])
		}
	}
}

func TestMasterFailoverKeepsAssignments(t *testing.T) {
	tc := clustertest.NewSim(t)
	m1, c1, _ := tc.Master("m1")
	testenv.Eventually(t, "m1 leads", 5*time.Second, m1.Leader)
	m2, _, _ := tc.Master("m2")
	for _, n := range clustertest.Nodes(1, 2, 2) {
		tc.Node(n)
	}
	tc.Wordcount(m1, 4, 6)
	before := tc.Assignments()
	versions := map[string]int64{}
	for _, n := range slices.Collect(maps.Values(before)) {
		e, _ := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+n)
		versions[n] = e.Version
	}
	if m2.Leader() {
		t.Fatal("two leaders")
	}
	c1.Crash() // the leader's process dies: its session ends, m2 takes over
	testenv.Eventually(t, "m2 leads", 5*time.Second, m2.Leader)
	// Once the new leader has reconciled, nothing may have been rewritten.
	tc.Reconciled(m2)
	after := tc.Assignments()
	if !maps.Equal(before, after) {
		t.Errorf("assignments changed across failover:\nbefore %v\nafter  %v", before, after)
	}
	for n, v := range versions {
		e, _ := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+n)
		if e.Version != v {
			t.Errorf("new leader rewrote the assignment of %s (version %d -> %d)", n, v, e.Version)
		}
	}
}

func TestDrainMovesWorkersOff(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(1, 2, 2) {
		tc.Node(n)
	}
	tc.Wordcount(m, 4, 8)
	if err := desired.UpdateNodeConf(tc.Ctx, tc.Admin, "n-0-0-0", func(c *cluster.NodeConf) { c.Draining = true }); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "drained node empty", 5*time.Second, func() bool {
		a := tc.Assignments()
		for _, n := range a {
			if n == "n-0-0-0" {
				return false
			}
		}
		return len(a) == 8
	})
}

func TestCrashLoopMovesJobOffNode(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	tc.Node(cluster.Node{ID: "good", DC: "dc", Rack: "r1", Slots: 4, Memory: 4 << 30, CPU: 4000})
	// A node whose agent reports worker 0 crash-looping, written by hand.
	bad := tc.Connect(-1)
	rec := cluster.NodeRecord{Node: cluster.Node{ID: "bad", DC: "dc", Rack: "r2", Slots: 4, Memory: 4 << 30, CPU: 4000,
		Labels: map[string]string{"isolation/process": "true"}}, Isolation: []string{"process"}}
	val, _ := json.Marshal(rec)
	if _, err := bad.Create(tc.Ctx, cluster.NodesKey+"/bad", val, coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	tc.Wordcount(m, 2, 2)
	onBad := cluster.WorkerKey{}
	for k, n := range tc.Assignments() {
		if n == "bad" {
			onBad = k
		}
	}
	if onBad.Job == "" {
		t.Fatalf("spread put nothing on node bad: %v", tc.Assignments())
	}
	rec.Workers = []cluster.WorkerStatus{{Key: onBad, State: cluster.WorkerBackoff, Restarts: 9, RecentRestarts: 6, LastExit: "exited with code 1"}}
	val, _ = json.Marshal(rec)
	if _, err := bad.Put(tc.Ctx, cluster.NodesKey+"/bad", val, coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	// The move waits for the old copy: bad's assignment loses the worker first, and only
	// once bad no longer reports it (its agent stopped it) does good get it.
	testenv.Eventually(t, "the worker taken off node bad", 5*time.Second, func() bool {
		a := tc.Assignments()
		return len(a) == 1 && a[onBad] == ""
	})
	if a := tc.Assignments(); a[onBad] != "" {
		t.Fatalf("worker %s assigned to %s while node bad still reports it", onBad, a[onBad])
	}
	rec.Workers = nil
	val, _ = json.Marshal(rec)
	if _, err := bad.Put(tc.Ctx, cluster.NodesKey+"/bad", val, coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the job moved off node bad", 5*time.Second, func() bool {
		a := tc.Assignments()
		return len(a) == 2 && a[onBad] == "good"
	})
	e, err := tc.Admin.Get(tc.Ctx, cluster.NodeConfsKey+"/bad")
	if err != nil || !strings.Contains(string(e.Value), `"avoid":["wc"]`) {
		t.Fatalf("node bad not noted: %s, %v", e.Value, err)
	}
}

// The agents these tests run against act, as the real agent does, only on an assignment
// stamped with the session that holds their node's entry: one stamped with another (as a
// master writes before it saw the node's new session) starts nothing.
func TestNodeIgnoresAssignmentOfAnotherSession(t *testing.T) {
	tc := clustertest.NewSim(t)
	n := clustertest.Nodes(1, 1, 1)[0]
	c := tc.Node(n)
	key, _ := cluster.NodeKey(n.ID)
	reported := func() (cluster.NodeRecord, bool) {
		e, err := tc.Admin.Get(tc.Ctx, key)
		var rec cluster.NodeRecord
		return rec, err == nil && json.Unmarshal(e.Value, &rec) == nil
	}
	testenv.Eventually(t, "the node registered", 5*time.Second, func() bool { _, ok := reported(); return ok })
	assign := func(session int64) {
		t.Helper()
		w := cluster.WorkerAssignment{Key: cluster.WorkerKey{Job: "wc", Worker: 0}, Generation: 1, Tenant: "search",
			Isolation: cluster.IsolationProcess, Command: []string{"sleep", "1000"}}
		b, _ := json.Marshal(cluster.NodeAssignment{Node: n.ID, DC: n.DC, Rack: n.Rack, Session: session, Workers: []cluster.WorkerAssignment{w}})
		if _, err := tc.Admin.Put(tc.Ctx, cluster.AssignmentsKey+"/"+n.ID, b, coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	assign(c.SessionID() + 1)
	testenv.AssertUntil(t, "no worker reported", 20*tc.Beat, func() (bool, string) {
		rec, _ := reported()
		return len(rec.Workers) == 0, fmt.Sprint(rec.Workers)
	})
	assign(c.SessionID())
	testenv.EventuallyWith(t, "wc/0 running", 5*time.Second, func() (bool, string) {
		rec, _ := reported()
		return len(rec.Workers) == 1 && rec.Workers[0].State == cluster.WorkerRunning, fmt.Sprint(rec.Workers)
	})
}

// A change every worker of a job takes without moving (its size, which each assignment
// carries) reaches every node's assignment, also after reconciles that kept the nodes'
// assignments as they were without building them again (the leader keeps a node's
// assignment when its workers and their job are what the last reconcile made).
func TestJobChangeReachesKeptAssignments(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(2, 2, 2) {
		tc.Node(n)
	}
	tc.Wordcount(m, 8, 12)
	tc.Reconciled(m) // reconciles that keep every node's assignment as it is
	if _, err := desired.ScaleJob(tc.Ctx, tc.Admin, "wc", 10); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "10 workers, each assigned as one of 10", 5*time.Second, func() (bool, string) {
		names, err := tc.Admin.Children(tc.Ctx, cluster.AssignmentsKey)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, node := range names {
			e, err := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+node)
			if err != nil {
				continue
			}
			var a cluster.NodeAssignment
			if err := json.Unmarshal(e.Value, &a); err != nil {
				return false, err.Error()
			}
			for _, w := range a.Workers {
				if w.Workers != 10 {
					return false, fmt.Sprintf("%s on %s is assigned as one of %d", w.Key, node, w.Workers)
				}
				n++
			}
		}
		return n == 10, fmt.Sprintf("%d workers assigned", n)
	})
}
