package master

import (
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// TestAssignmentPriorityCapped: the priority an agent gets (it orders evictions and OOM
// scores by it) is the job's, at most its tenant's cap, as placement sees it.
func TestAssignmentPriorityCapped(t *testing.T) {
	v := newView(0, 0, 0, 0)
	tenants := map[string]coord.Entry{}
	for name, cap := range map[string]int{"capped": 10, "free": 1000} {
		b, err := json.Marshal(cluster.TenantRecord{Tenant: cluster.Tenant{Name: name, MaxPriority: cap}})
		if err != nil {
			t.Fatal(err)
		}
		tenants[name] = coord.Entry{Value: b}
	}
	v.setCaps(slog.New(slog.DiscardHandler), tenants)
	for _, tc := range []struct {
		tenant string
		prio   int
		want   int
	}{
		{"capped", 1000, 10},
		{"capped", 5, 5},
		{"free", 1000, 1000},
		{"unknown", 100, 0}, // no readable record: the lowest class
	} {
		j := cluster.JobRecord{Spec: cluster.JobSpec{Name: "j", Tenant: tc.tenant, Workers: 1, Priority: tc.prio, Command: []string{"true"}}}
		wa := workerAssignment(v, j, cluster.WorkerKey{Job: "j"}, nil)
		if wa.Priority != tc.want {
			t.Errorf("tenant %s, job priority %d: assignment priority %d, want %d", tc.tenant, tc.prio, wa.Priority, tc.want)
		}
	}
}

// TestAssignmentUID: a worker's assignment carries its tenant's uid, a router's the next
// one (not the uid of the tenant's own code), and none for a tenant without a uid.
func TestAssignmentUID(t *testing.T) {
	v := newView(0, 0, 0, 0)
	tenants := map[string]coord.Entry{}
	for name, uid := range map[string]int{"a": 200000, "old": 0} {
		b, _ := json.Marshal(cluster.TenantRecord{Tenant: cluster.Tenant{Name: name, UID: uid}})
		tenants[name] = coord.Entry{Value: b}
	}
	v.setCaps(slog.New(slog.DiscardHandler), tenants)
	for _, tc := range []struct {
		tenant, job string
		want        int
	}{
		{"a", "j", 200000},
		{"a", "j" + routerSuffix, 200001},
		{"old", "j", 0},
		{"old", "j" + routerSuffix, 0},
	} {
		j := cluster.JobRecord{Spec: cluster.JobSpec{Name: tc.job, Tenant: tc.tenant, Workers: 1, Command: []string{"true"}}}
		if wa := workerAssignment(v, j, cluster.WorkerKey{Job: tc.job}, nil); wa.UID != tc.want {
			t.Errorf("tenant %s, job %s: uid %d, want %d", tc.tenant, tc.job, wa.UID, tc.want)
		}
	}
}
