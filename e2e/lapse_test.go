package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestLapsedLeasesDoNotAvoidNode: five times in a row every lease on a node lapses for a
// fault outside its workers, the launchers stop them, and the node runs them again once the
// fault heals. Those stops are not the workers' doing: none counts as a crash, and the node
// is not avoided for the job afterwards (five crashes in five minutes would make it so).
//
//   - node-cut-off: the node and the master are stopped (SIGSTOP) for longer than the
//     session: the store expires the node's session;
//   - store-outage: the store's host is cut off from every other (a network lab): to the
//     node's keeper no server answers at all, which it cannot tell from a partition of its
//     own, so after StoreSilence it lets the leases lapse (a store that refuses or hangs
//     is down for everyone: leases are kept then, and nothing lapses).
func TestLapsedLeasesDoNotAvoidNode(t *testing.T) {
	t.Run("node-cut-off", func(t *testing.T) {
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
		master := h.Master("m1")
		lapseRounds(t, cl, "n1", func(round int) func() {
			_ = master.Cmd.Process.Signal(syscall.SIGSTOP)
			h.SignalNode("n1", syscall.SIGSTOP)
			return func() {
				// Past the session: the store expires the node's session (and the master's).
				testenv.Eventually(t, fmt.Sprintf("round %d: the node's entry expired", round), 30*time.Second, func() bool {
					_, ok := h.NodeRecords()["n1"]
					return !ok
				})
				h.SignalNode("n1", syscall.SIGCONT)
				_ = master.Cmd.Process.Signal(syscall.SIGCONT)
			}
		})
	})
	t.Run("store-outage", func(t *testing.T) {
		lc := newLabCluster(t, labSpec{zkServers: 1, masters: []string{"m1"}, dcs: []string{"dc-a"}, perDC: 1,
			slots: 4, session: 2 * time.Second, reregisterGrace: 30 * time.Second})
		lc.submit(t, jobSpec("wc", 2))
		zk := lc.zkHosts[0]
		lapseRounds(t, lc.client("m1"), lc.nodes[0].id, func(int) func() {
			if err := zk.Cut(context.Background()); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := zk.Heal(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	})
}

// lapseRounds runs five rounds of a fault that lapses every lease on node (fault injects it
// and returns its heal), checking after each that the job's two workers run there again and
// that their stops were reported as lapses, not crashes; and at the end that the node is not
// avoided.
func lapseRounds(t *testing.T, cl *api.Client, node string, fault func(round int) (heal func())) {
	oc := &outageCluster{job: "wc", workers: 2}
	ctx := context.Background()
	const rounds = 5
	start := time.Now()
	lapses := 0
	for round := 1; round <= rounds; round++ {
		before := oc.waitWorkers(t, 2)
		heal := fault(round)
		testenv.EventuallyWith(t, fmt.Sprintf("round %d: the launchers stopped the workers", round), 30*time.Second, func() (bool, string) {
			alive := 0
			for _, p := range before {
				if clustertest.Alive(p.pid) {
					alive++
				}
			}
			return alive == 0, fmt.Sprintf("%d of %d alive", alive, len(before))
		})
		heal()
		testenv.EventuallyWith(t, fmt.Sprintf("round %d: the workers back, their stops reported as lapses", round), 60*time.Second, func() (bool, string) {
			st, err := cl.Job(ctx, "wc")
			if err != nil {
				return false, err.Error()
			}
			n, got := 0, 0
			for _, w := range st.Workers {
				if w.State == cluster.WorkerRunning && w.Node == node {
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
	n, _ := nodeView(ctx, cl, node)
	if len(n.Avoid) != 0 || len(n.Avoided) != 0 {
		t.Errorf("node %s avoided after %d lapses: %v %+v", node, rounds, n.Avoid, n.Avoided)
	}
	t.Logf("figure: %d rounds of lapsed leases in %s: %d lapses reported, 0 crashes, node not avoided", rounds, time.Since(start).Round(time.Second), lapses)
}
