package master_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

// TestDCLossMovesWholeJobs loses a data center when the others cannot take all of its
// workers: a job that cannot move whole waits, with the shortfall, and a job that can
// moves.
func TestDCLossMovesWholeJobs(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	clients := map[string]*coord.Embedded{}
	for _, n := range clustertest.Nodes(3, 1, 2) {
		n.Slots = 3
		clients[n.ID] = tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 6 nodes", 5*time.Second, func() bool { return len(m.MirrorView().Nodes()) == 6 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	big, small := clustertest.Spec("a-big", 9), clustertest.Spec("b-small", 6)
	big.Placement.Spread, small.Placement.Spread = []string{"dc"}, []string{"dc"}
	for _, s := range []*cluster.JobSpec{big, small} {
		if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, s); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "15 workers assigned", 5*time.Second, func() bool { return len(tc.Assignments()) == 15 })
	before := tc.Assignments()
	for id, c := range clients {
		if strings.HasPrefix(id, "n-0-") {
			c.Close()
		}
	}
	// dc-1 and dc-2 have 2 free slots: a-big's 3 workers from dc-0 cannot all move, so
	// none do; b-small's 2 can.
	testenv.Eventually(t, "b-small moved whole, a-big waiting", 5*time.Second, func() bool {
		// Held workers stay assigned to the node they were lost on, so that every plan
		// knows where they come from.
		smallN, bigN, heldN := 0, 0, 0
		for k, n := range tc.Assignments() {
			switch {
			case strings.HasPrefix(n, "n-0-") && k.Job == "a-big":
				heldN++
			case strings.HasPrefix(n, "n-0-"):
			case k.Job == "b-small":
				smallN++
			default:
				bigN++
			}
		}
		if smallN == 6 && bigN == 6 && heldN == 3 {
			return true
		}
		t.Logf("small %d big %d held %d", smallN, bigN, heldN)
		return false
	})
	after := tc.Assignments()
	for k, n := range before {
		if !strings.HasPrefix(n, "n-0-") && after[k] != n {
			t.Errorf("worker %s moved from %s to %s though its data center stayed", k, n, after[k])
		}
	}
	st := m.Snapshot()
	v, reasons := st.View(), st.Unplaced()
	held := 0
	for k, why := range reasons {
		if k.Job != "a-big" || !strings.Contains(why, "data center dc-0 is lost and job a-big moves only whole: 3 of its 3 workers there find no room elsewhere") {
			t.Errorf("unplaced %s: %q", k, why)
		}
		held++
	}
	if held != 3 {
		t.Errorf("%d workers reported waiting, want a-big's 3", held)
	}
	if st := v.DCState("dc-0"); st != cluster.DCLost {
		t.Errorf("dc-0 state %q, want lost", st)
	}
}

// TestDCFailAndRestore fails a data center by hand, then restores it with --rebalance.
func TestDCFailAndRestore(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(2, 1, 2) {
		tc.Node(n)
	}
	tc.Wordcount(m, 4, 6)
	inDC := func(dc string) int {
		n := 0
		for _, node := range tc.Assignments() {
			if strings.HasPrefix(node, "n-"+dc[3:]+"-") {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, "3 workers per data center", 5*time.Second, func() bool { return inDC("dc-0") == 3 && inDC("dc-1") == 3 })
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCFailed, false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "dc-0 emptied", 5*time.Second, func() bool { return inDC("dc-0") == 0 && inDC("dc-1") == 6 })
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "nope", cluster.DCFailed, false); err == nil {
		t.Error("failing an unknown data center worked")
	}
	// Restore without rebalance: nothing moves back.
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCActive, false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "dc-0 active in the master's view", 5*time.Second, func() bool { return m.MirrorView().DCState("dc-0") == cluster.DCActive })
	tc.Reconciled(m)
	if inDC("dc-0") != 0 {
		t.Fatal("workers moved back without --rebalance")
	}
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCActive, true); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "rebalanced 3/3", 5*time.Second, func() bool { return inDC("dc-0") == 3 && inDC("dc-1") == 3 })
	testenv.Eventually(t, "rebalance request cleared", 5*time.Second, func() bool { return !m.MirrorView().DCs()["dc-0"].Rebalance })
}
