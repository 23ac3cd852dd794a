package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkRollout measures issue 17's figures on one machine: a 40-worker job on 12 nodes
// (2 data centers x 3 racks x 2) beside two 4-worker jobs, updated by rack with maxParallel 4
// (minHealthy 2s); a crash-looping canary until every worker is back on the old generation;
// a rolling restart of the same job by rack. Run it alone:
//
//	CI=true go test -run '^$' -bench Rollout -benchtime 1x -timeout 20m ./e2e/
func BenchmarkRollout(b *testing.B) {
	for range b.N {
		rolloutFigures(b)
	}
}

func rolloutFigures(b *testing.B) {
	const workers = 40
	_, cl, _, rackOf := rolloutCluster(b, 2, 3, 2, 6)
	ctx := context.Background()
	submitRunning(b, cl, rolloutJob("big", workers, "1", ""), "big", workers)
	submitRunning(b, cl, rolloutJob("other-a", 4, "1", ""), "other-a", 4)
	submitRunning(b, cl, rolloutJob("other-b", 4, "1", ""), "other-b", 4)
	others := func() map[string]int {
		out := map[string]int{}
		for _, job := range []string{"other-a", "other-b"} {
			for k, p := range procsOf(job) {
				out[job+"/"+k] = p.pid
			}
		}
		return out
	}
	before := others()
	restartedOthers := func() int {
		n := 0
		now := others()
		for k, pid := range before {
			if now[k] != pid {
				n++
			}
		}
		return n
	}
	policy := "update: {by: rack, maxParallel: 4, minHealthy: 2s}\n"

	// 1. The update by rack.
	watch := watchRollout(b, "big", workers)
	t0 := time.Now()
	if _, err := cl.UpdateJob(ctx, "big", rolloutJob("big", workers, "2", policy), api.PolicyOverrides{}); err != nil {
		b.Fatal(err)
	}
	ro := waitRolloutState(b, 10*time.Minute, "big", []string{cluster.RolloutDone, cluster.RolloutFailed}, cl)
	took := time.Since(t0)
	if ro.State != cluster.RolloutDone {
		b.Fatalf("update: %s", ro.Summary())
	}
	watch.check(b, 4)
	racks := watch.rackOrder(b, rackOf)
	b.ReportMetric(took.Seconds(), "update-s")
	b.ReportMetric(float64(watch.maxDown), "update-max-down")
	b.ReportMetric(float64(restartedOthers()), "update-others-restarted")
	b.Logf("figure: update of 40 workers on 12 nodes by rack (6 racks, maxParallel 4, minHealthy 2s): done in %s, at most %d down at once, %d workers of other jobs restarted, racks %v",
		took.Round(100*time.Millisecond), watch.maxDown, restartedOthers(), racks)

	// 2. A crash-looping canary, reverted.
	watch = watchRollout(b, "big", workers)
	bad := strings.Replace(string(rolloutJob("big", workers, "2", "update: {by: rack, maxParallel: 4, minHealthy: 2s, canary: 1, autoRevert: true}\n")),
		"--rate, '2']", "--rate, '2', --input, /nonexistent/input]", 1)
	t0 = time.Now()
	if _, err := cl.UpdateJob(ctx, "big", []byte(bad), api.PolicyOverrides{}); err != nil {
		b.Fatal(err)
	}
	waitRolloutState(b, 5*time.Minute, "big", []string{cluster.RolloutReverted}, cl)
	testenv.Eventually(b, "every worker back on generation 2", 5*time.Minute, func() bool {
		st, err := cl.Job(ctx, "big")
		if err != nil || st.Summary.Running != workers {
			return false
		}
		for _, w := range st.Workers {
			if w.Generation != 2 {
				return false
			}
		}
		return len(procsOf("big")) == workers
	})
	took = time.Since(t0)
	watch.check(b, 4)
	b.ReportMetric(took.Seconds(), "canary-revert-s")
	b.Logf("figure: crash-looping canary to all 40 workers back on the old generation: %s (at most %d down at once, %d workers of other jobs restarted)",
		took.Round(100*time.Millisecond), watch.maxDown, restartedOthers())

	// 3. A rolling restart of the same job, by rack.
	watch = watchRollout(b, "big", workers)
	t0 = time.Now()
	rec, err := cl.RestartJob(ctx, "big", api.RestartRequest{By: cluster.RolloutByRack, MaxParallel: 4})
	if err != nil {
		b.Fatal(err)
	}
	ro = waitRolloutState(b, 10*time.Minute, "big", []string{cluster.RolloutDone, cluster.RolloutFailed}, cl)
	took = time.Since(t0)
	if ro.State != cluster.RolloutDone || ro.ID != rec.Rollout.ID {
		b.Fatalf("restart: %s", ro.Summary())
	}
	watch.check(b, 4)
	watch.rackOrder(b, rackOf)
	if len(watch.replaced) != workers {
		b.Errorf("restart replaced %d processes, want %d", len(watch.replaced), workers)
	}
	b.ReportMetric(took.Seconds(), "restart-s")
	b.ReportMetric(float64(watch.maxDown), "restart-max-down")
	b.Logf("figure: rolling restart of the 40 workers by rack, maxParallel 4: %s, at most %d down at once, %d workers of other jobs restarted",
		took.Round(100*time.Millisecond), watch.maxDown, restartedOthers())
	if n := restartedOthers(); n != 0 {
		b.Errorf("%d workers of other jobs restarted", n)
	}
}
