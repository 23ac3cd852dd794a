package master_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// nodeSession reads the session stamped on a node's assignment.
func nodeSession(tc *clustertest.Sim, node string) int64 {
	e, err := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+node)
	if err != nil {
		return 0
	}
	var a cluster.NodeAssignment
	_ = json.Unmarshal(e.Value, &a)
	return a.Session
}

// After the store expired every session at once (ZooKeeper paused, then resumed), the master
// gives nodes the re-registration window before it moves their workers: a node that comes
// back keeps its workers and gets its assignment stamped with its new session; a node that
// does not come back loses its workers once the window is over, and not before.
func TestMasterWaitsForNodesAfterStoreOutage(t *testing.T) {
	tc := clustertest.NewSim(t)
	tc.Grace = 2 * time.Second
	m, mc, _ := tc.Master("m1")
	clients := map[string]*coord.Embedded{}
	for _, n := range clustertest.Nodes(1, 1, 3) {
		clients[n.ID] = tc.Node(n)
	}
	tc.Wordcount(m, 3, 6)
	// Wait out the window of the master's start, so that only the outage opens one.
	testenv.Eventually(t, "the start's window over", 10*time.Second, func() bool { in, _ := m.InGrace(); return !in })
	before := tc.Assignments()
	back, gone, other := "n-0-0-0", "n-0-0-1", "n-0-0-2"
	for n, c := range clients {
		if c.SessionID() != nodeSession(tc, n) {
			t.Fatalf("node %s: assignment stamped with session %x, its entry's is %x", n, nodeSession(tc, n), c.SessionID())
		}
	}
	oldBack := clients[back].SessionID()

	// The outage: the master's session and every node's expire together; one node never
	// comes back.
	outage := time.Now()
	clients[gone].Crash()
	for _, c := range []*coord.Embedded{mc, clients[back], clients[other]} {
		if err := tc.Store.ExpireSession(c.SessionID()); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "the returning node's assignment stamped with its new session", 5*time.Second, func() bool {
		s := nodeSession(tc, back)
		return s != 0 && s != oldBack && s == clients[back].SessionID()
	})
	// The master acted after the outage; the missing node's workers are still where they were.
	now := tc.Assignments()
	for k, n := range before {
		if now[k] != n && time.Since(outage) < tc.Grace {
			t.Errorf("worker %s moved from %s to %s %s after the outage, inside the re-registration window", k, n, now[k], time.Since(outage))
		}
	}
	testenv.Eventually(t, "the missing node's workers moved after the window", 10*time.Second, func() bool {
		for _, n := range tc.Assignments() {
			if n == gone {
				return false
			}
		}
		return true
	})
	if took := time.Since(outage); took < tc.Grace {
		t.Errorf("workers of the missing node moved %s after the outage; the window is %s", took, tc.Grace)
	}
	after := tc.Assignments()
	for k, n := range before {
		if n != gone && after[k] != n {
			t.Errorf("worker %s moved from %s to %s though its node came back", k, n, after[k])
		}
	}
}
