package httpapi_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// TestPriorityCaps: tenant b, capped at 10, is refused a priority-1000 job and preempts
// nothing; with the cap raised to 100 by the admin, its priority-100 job preempts a's
// priority-10 workers and none of a's priority-100 ones, and each preemption is an event
// naming the preempting job, its tenant and both priorities. b's own token cannot raise
// b's cap.
func TestPriorityCaps(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(1, 1, 2) { // 8 slots
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return m.Leader() && len(m.NodeEntries()) == 2 })
	srv := httptest.NewServer(httpapi.New(m, httpapi.Config{}))
	defer srv.Close()
	ctx := tc.Ctx
	token := api.NewToken()
	if _, err := tc.Admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	admin, _ := api.NewClient(srv.URL, token)
	if err := admin.CreateTenant(ctx, cluster.Tenant{Name: "a", MaxPriority: 100}); err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTenant(ctx, cluster.Tenant{Name: "b", MaxPriority: 10}); err != nil {
		t.Fatal(err)
	}
	bToken, err := admin.TenantToken(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := api.NewClient(srv.URL, bToken)
	spec := func(name, tenant string, workers, prio int) []byte {
		return fmt.Appendf(nil, "name: %s\ntenant: %s\nworkers: %d\npriority: %d\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n",
			name, tenant, workers, prio)
	}
	for _, j := range []struct {
		name string
		prio int
	}{{"a-eq", 100}, {"a-low", 10}} {
		if _, err := admin.SubmitJob(ctx, spec(j.name, "a", 4, j.prio)); err != nil {
			t.Fatal(err)
		}
	}
	running := func(job string) int {
		st, err := admin.Job(ctx, job)
		if err != nil {
			return -1
		}
		return st.Summary.Running
	}
	testenv.Eventually(t, "a's 8 workers running", 5*time.Second, func() bool { return running("a-eq") == 4 && running("a-low") == 4 })

	// Above the cap: refused with the cap and the way out, nothing stored, nothing preempted.
	_, err = b.SubmitJob(ctx, spec("b", "b", 4, 1000))
	if !errors.Is(err, api.ErrQuota) || !strings.Contains(err.Error(), "tenant b may use priority up to 10") ||
		!strings.Contains(err.Error(), "stormdock tenant update b --max-priority 1000") {
		t.Fatalf("submit above the cap: %v", err)
	}
	if _, err := admin.Job(ctx, "b"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("refused job stored: %v", err)
	}
	testenv.AssertUntil(t, "a's workers stay", testenv.Timeout(time.Second), func() (bool, string) {
		return running("a-eq") == 4 && running("a-low") == 4, fmt.Sprintf("a-eq %d a-low %d running", running("a-eq"), running("a-low"))
	})

	// b's token cannot raise its own cap; the record stays as it was.
	tenantKey, _ := cluster.TenantKey("b")
	before, err := tc.Admin.Get(ctx, tenantKey)
	if err != nil {
		t.Fatal(err)
	}
	top := cluster.MaxPriority
	if _, err := b.UpdateTenant(ctx, "b", api.TenantChange{MaxPriority: &top}); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("tenant raising its own cap: %v", err)
	}
	if after, err := tc.Admin.Get(ctx, tenantKey); err != nil || after.Version != before.Version || string(after.Value) != string(before.Value) {
		t.Fatalf("refused update changed the record: %s -> %s (%v)", before.Value, after.Value, err)
	}

	// The admin raises it to 100: b's priority-100 job takes a-low's slots and none of a-eq's.
	hundred := 100
	if got, err := admin.UpdateTenant(ctx, "b", api.TenantChange{MaxPriority: &hundred}); err != nil || got.MaxPriority != 100 {
		t.Fatalf("admin raising the cap: %+v, %v", got, err)
	}
	ts, err := admin.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tv := range ts {
		if tv.Name == "b" && tv.MaxPriority != 100 {
			t.Fatalf("tenant list shows b's cap %d, want 100", tv.MaxPriority)
		}
	}
	if _, err := b.SubmitJob(ctx, spec("b", "b", 6, 100)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "b takes a-low's 4 slots", 5*time.Second, func() bool {
		return running("b") == 4 && running("a-low") == 0
	})
	testenv.AssertUntil(t, "a-eq keeps its workers", testenv.Timeout(time.Second), func() (bool, string) {
		return running("a-eq") == 4 && running("b") == 4, fmt.Sprintf("a-eq %d b %d running", running("a-eq"), running("b"))
	})
	want := "preempted by job b of tenant b (priority 100 over 10)"
	testenv.EventuallyWith(t, "preemption events", 5*time.Second, func() (bool, string) {
		evs, err := admin.Events(ctx, api.EventFilter{}, 0)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, e := range evs {
			if strings.Contains(e.Reason, "preempted") {
				if e.Job != "a-low" || !strings.HasPrefix(e.Reason, want) {
					return false, fmt.Sprintf("event %+v", e)
				}
				n++
			}
		}
		return n == 4, fmt.Sprintf("%d preemption events", n)
	})

	// Lowering b's cap leaves b's stored spec at 100, but placement sees min(100, 0): b can
	// no longer hold what it preempted, and a-low (10) takes its slots back.
	zero := 0
	if _, err := admin.UpdateTenant(ctx, "b", api.TenantChange{MaxPriority: &zero}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a-low back on b's slots", 5*time.Second, func() bool {
		return running("a-low") == 4 && running("b") == 0 && running("a-eq") == 4
	})
	if rec, _, err := desired.ReadJob(ctx, tc.Admin, "b"); err != nil || rec.Spec.Priority != 100 {
		t.Fatalf("b's stored spec: priority %d, %v; want 100 kept", rec.Spec.Priority, err)
	}
}
