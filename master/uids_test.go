package master_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
)

// TestTenantUIDsBackfilledAndAssigned: a tenant stored before uids existed gets its uid from
// the leading master at the start of its term, from the master's range, and every worker
// assignment of its jobs carries that uid; a tenant created later gets the next pair.
func TestTenantUIDsBackfilledAndAssigned(t *testing.T) {
	tc := clustertest.NewSim(t)
	for _, n := range clustertest.Nodes(1, 1, 2) {
		tc.Node(n)
	}
	key, _ := cluster.TenantKey("search")
	if _, err := tc.Admin.Create(tc.Ctx, key, []byte(`{"name":"search","maxPriority":0,"created":"2026-01-01T00:00:00Z"}`), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	r := cluster.UIDRange{First: 400000, Last: 400099}
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.TenantUIDs = r })
	testenv.Eventually(t, "m1 leads", 5*time.Second, m.Leader)
	var old cluster.TenantRecord
	testenv.Eventually(t, "the old tenant has a uid", 5*time.Second, func() bool {
		old, _, _ = desired.ReadTenant(tc.Ctx, tc.Admin, "search")
		return old.UID > 0
	})
	if old.UID != r.First {
		t.Errorf("backfilled uid %d, want the range's first, %d", old.UID, r.First)
	}
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("wc", 3)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "3 workers assigned", 5*time.Second, func() bool { return len(tc.Assignments()) == 3 })
	for _, n := range clustertest.Nodes(1, 1, 2) {
		k, _ := cluster.AssignmentKey(n.ID)
		e, err := tc.Admin.Get(tc.Ctx, k)
		if err != nil {
			continue
		}
		var na cluster.NodeAssignment
		if err := json.Unmarshal(e.Value, &na); err != nil {
			t.Fatal(err)
		}
		for _, w := range na.Workers {
			if w.UID != old.UID {
				t.Errorf("worker %s assigned with uid %d, want its tenant's %d", w.Key, w.UID, old.UID)
			}
		}
	}
	got, err := desired.CreateTenantIn(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "ads"}}, m.TenantUIDs())
	if err != nil || got.UID != r.First+2 {
		t.Errorf("a new tenant: uid %d, %v; want %d", got.UID, err, r.First+2)
	}
}
