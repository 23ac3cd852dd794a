package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// BenchmarkAutoscale is TestAutoscaleWordcount's story with a longer steady stretch, for the
// figures: the 5x step to the job scaled out and running, and to its backlog under target;
// and the decisions made while the rate stays steady (goal 0), over STORMDOCK_BENCH_STEADY
// (default 10m) after the step's changes are over. The metrics interval is
// STORMDOCK_BENCH_INTERVAL (default 2s); the policy's cooldowns and window are 15 times
// it. Run it alone: `CI=true go test -run '^$' -bench Autoscale -benchtime 1x -timeout 60m ./e2e/`.
func BenchmarkAutoscale(b *testing.B) {
	if os.Geteuid() != 0 {
		testenv.Missing(b, "root (the local cluster runs tenants' workers as their uids)")
	}
	steady, interval := 10*time.Minute, 2*time.Second
	for env, d := range map[string]*time.Duration{"STORMDOCK_BENCH_STEADY": &steady, "STORMDOCK_BENCH_INTERVAL": &interval} {
		if v := os.Getenv(env); v != "" {
			p, err := time.ParseDuration(v)
			if err != nil || p <= 0 {
				b.Fatalf("%s=%q: want a duration", env, v)
			}
			*d = p
		}
	}
	for range b.N {
		parent := clustertest.TestCgroup() + "/autoscale-bench"
		l := clustertest.StartLocal(b, binary, daemon.LocalConfig{Nodes: 4, RacksPerDC: 1, Slots: 4, CgroupParent: parent,
			Metrics: jobmetrics.Config{Interval: interval}})
		if err := l.Client.CreateTenant(context.Background(), cluster.Tenant{Name: "demo", MaxWorkers: 12}); err != nil {
			b.Fatal(err)
		}
		w := cluster.Duration(15 * interval)
		res := runAutoscale(b, l, tenantClients(b, l)["demo"], autoscaleScenario{
			policy: cluster.ScalingPolicy{Min: 2, Max: 8, Metric: "input_backlog", Target: 20, CooldownUp: w, CooldownDown: w, Stabilization: w},
			steady: steady,
		})
		b.ReportMetric(res.scaledOut.Seconds(), "s-scaled-out")
		b.ReportMetric(res.caughtUp.Seconds(), "s-backlog-under-target")
		b.ReportMetric(float64(res.steadyDecisions), "decisions-steady")
		b.ReportMetric(res.steady.Minutes(), "min-steady")
		b.ReportMetric(float64(res.decisions), "decisions-total")
		clustertest.KillCgroupTree(parent)
	}
}
