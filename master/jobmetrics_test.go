package master_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// TestStandbyKeepsHistory: every master pulls the agents' job metrics, the standby too, so
// that a master that comes to lead has the history from before its term at once.
func TestStandbyKeepsHistory(t *testing.T) {
	tc := clustertest.NewSim(t)
	mm, err := sim.NewMetrics(tc.Admin, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mm.Close() })
	fast := func(c *master.Config) { c.Metrics = jobmetrics.Config{Interval: 100 * time.Millisecond} }
	m1, _, stop1 := tc.Master("m1", fast)
	testenv.Eventually(t, "m1 leading", 5*time.Second, m1.Leader)
	m2, _, _ := tc.Master("m2", fast)
	for _, n := range clustertest.Nodes(1, 2, 2) {
		tc.Agent(n, sim.Config{Metrics: mm})
	}
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("wc", 6)); err != nil {
		t.Fatal(err)
	}
	workers := func(m *master.Master) (float64, int, bool) {
		jm, ok := m.JobMetrics().History().Job("wc", jobmetrics.Query{Series: []string{api.SeriesWorkers}})
		if !ok || len(jm.Series) == 0 {
			return 0, 0, false
		}
		v, _, ok := jm.Series[0].Last()
		n := 0
		for _, p := range jm.Series[0].Values {
			if p != nil {
				n++
			}
		}
		return v, n, ok
	}
	for _, m := range []*master.Master{m1, m2} {
		testenv.EventuallyWith(t, m.ID()+"'s history of wc's 6 workers", 10*time.Second, func() (bool, string) {
			v, n, ok := workers(m)
			return ok && v == 6 && n >= 3, fmt.Sprintf("%v workers, %d points", v, n)
		})
	}
	if m2.Leader() {
		t.Fatal("m2 leads: the standby's history was not a standby's")
	}
	_, before, _ := workers(m2)
	stop1()
	testenv.Eventually(t, "m2 leading", 10*time.Second, m2.Leader)
	if _, n, _ := workers(m2); n < before {
		t.Errorf("the new leader's history has %d points, %d before it led: it must keep its standby's", n, before)
	}
}
