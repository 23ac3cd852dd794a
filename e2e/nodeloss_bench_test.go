package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkNodeLoss measures the node-loss time users see with a 1s session: a machine dies
// (its agent, keeper and workers SIGKILLed at once) and the master's view shows every worker
// of the job running again, elsewhere: the session's expiry, the master's new placement,
// the workers' start on other nodes and their report. Four nodes of 4 slots, a job of 8
// workers; each iteration kills the node of worker 0 and starts a new node in its place.
// Run it alone:
//
//	CI=true go test -run '^$' -bench NodeLoss -benchtime 5x ./e2e/
func BenchmarkNodeLoss(b *testing.B) {
	const workers = 8
	h := newHarness(b, time.Second)
	url := h.StartMaster("m1", "--reregister-grace", "1s")
	cl := h.AdminClient(url)
	ctx := context.Background()
	testenv.Eventually(b, "m1 leads", 30*time.Second, func() bool { hl, err := cl.Health(ctx); return err == nil && hl.Leader })
	for i := range 4 {
		h.StartAgent(fmt.Sprintf("n%d", i), "dc-a", fmt.Sprintf("r%d", i), 4)
	}
	testenv.Eventually(b, "4 nodes", 30*time.Second, func() bool { ns, err := cl.Nodes(ctx); return err == nil && len(ns) == 4 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", workers)); err != nil {
		b.Fatal(err)
	}
	allRunningBut := func(dead string) bool {
		st, err := cl.Job(ctx, "wc")
		if err != nil || st.Summary.Running != workers {
			return false
		}
		for _, w := range st.Workers {
			if w.Node == dead || w.State != "running" {
				return false
			}
		}
		return true
	}
	testenv.Eventually(b, "8 workers running", time.Minute, func() bool { return allRunningBut("") })
	var took []time.Duration
	next := 4
	for b.Loop() {
		st, err := cl.Job(ctx, "wc")
		if err != nil {
			b.Fatal(err)
		}
		victim := st.Workers[0].Node
		t0 := time.Now()
		h.KillMachine(victim)
		// Polled every 10ms (testenv.Eventually's polls grow to 100ms): the figure is that
		// precise.
		for !allRunningBut(victim) {
			if time.Since(t0) > testenv.Timeout(time.Minute) {
				b.Fatalf("workers of %s not running elsewhere after %s", victim, time.Since(t0))
			}
			time.Sleep(10 * time.Millisecond)
		}
		took = append(took, time.Since(t0))
		b.StopTimer()
		// A new node takes the dead one's place, so that every iteration has four.
		h.StartAgent(fmt.Sprintf("n%d", next), "dc-a", fmt.Sprintf("r%d", next), 4)
		next++
		testenv.Eventually(b, "4 nodes", 30*time.Second, func() bool { ns, err := cl.Nodes(ctx); return err == nil && len(ns) == 4 })
		b.StartTimer()
	}
	b.ReportMetric(median(took).Seconds(), "node-loss-to-running-s")
	b.Logf("figure: a node's machine killed (1s session) -> every worker running elsewhere in the master's view: %v (median %v)",
		rounded(took), median(took).Round(time.Millisecond))
}
