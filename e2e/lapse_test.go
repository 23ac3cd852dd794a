package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestLapsedLeasesDoNotAvoidNode: five times in a row the node and the master are cut off
// from the store (SIGSTOPped) for longer than the session: every lease on the node lapses
// and the launchers stop its workers, the node comes back within the master's
// re-registration window and runs them again. Those stops are the store's fault, not the
// workers': none counts as a crash, and the node is not avoided for the job afterwards
// (five crashes in five minutes would make it so).
func TestLapsedLeasesDoNotAvoidNode(t *testing.T) {
	h := newHarness(t, time.Second)
	url := h.StartMaster("m1", "--reregister-grace", "30s")
	h.StartAgent("n1", "dc-a", "r1", 4)
	cl := h.AdminClient(url)
	ctx := context.Background()
	testenv.Eventually(t, "1 node", 30*time.Second, func() bool { ns, err := cl.Nodes(ctx); return err == nil && len(ns) == 1 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	oc := &outageCluster{h: h, job: "wc", workers: 2}
	master := h.Master("m1")
	const rounds = 5
	lapses := 0
	for round := 1; round <= rounds; round++ {
		before := oc.waitWorkers(t, 2)
		_ = master.Cmd.Process.Signal(syscall.SIGSTOP)
		h.SignalNode("n1", syscall.SIGSTOP)
		testenv.EventuallyWith(t, fmt.Sprintf("round %d: the launchers stopped the workers", round), 30*time.Second, func() (bool, string) {
			alive := 0
			for _, p := range before {
				if clustertest.Alive(p.pid) {
					alive++
				}
			}
			return alive == 0, fmt.Sprintf("%d of %d alive", alive, len(before))
		})
		// Past the session: the store expires the node's session (and the master's).
		testenv.Eventually(t, fmt.Sprintf("round %d: the node's entry expired", round), 30*time.Second, func() bool {
			_, ok := h.NodeRecords()["n1"]
			return !ok
		})
		h.SignalNode("n1", syscall.SIGCONT)
		_ = master.Cmd.Process.Signal(syscall.SIGCONT)
		testenv.EventuallyWith(t, fmt.Sprintf("round %d: the workers back, their stops reported as lapses", round), 60*time.Second, func() (bool, string) {
			st, err := cl.Job(ctx, "wc")
			if err != nil {
				return false, err.Error()
			}
			n, got := 0, 0
			for _, w := range st.Workers {
				if w.State == cluster.WorkerRunning && w.Node == "n1" {
					n++
				}
				got += w.Lapses
			}
			return n == 2 && got >= lapses+1, fmt.Sprintf("%d running, %d lapses reported (had %d): %+v", n, got, lapses, st.Workers)
		})
		st, _ := cl.Job(ctx, "wc")
		lapses = 0
		for _, w := range st.Workers {
			lapses += w.Lapses
			if w.Restarts != 0 || (w.ExitReason != "" && w.ExitReason != cluster.ExitLeaseLapsed) {
				t.Errorf("round %d: worker %d: %d restarts, exit reason %q, last exit %q: want lapses, not crashes",
					round, w.Worker, w.Restarts, w.ExitReason, w.LastExit)
			}
		}
	}
	n, _ := nodeView(ctx, cl, "n1")
	if len(n.Avoid) != 0 || len(n.Avoided) != 0 {
		t.Errorf("node n1 avoided after %d lapses: %v %+v", rounds, n.Avoid, n.Avoided)
	}
	t.Logf("figure: %d rounds of lapsed leases: %d lapses reported, 0 crashes, node not avoided", rounds, lapses)
}
