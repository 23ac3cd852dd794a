package desired

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// TestPriorityCap: a spec above its tenant's cap is refused, at submit and at update, with
// one line naming the cap and the command that raises it, and the store keeps what it had.
func TestPriorityCap(t *testing.T) {
	cases := []struct {
		name      string
		cap       int // the tenant's MaxPriority; -1: a record stored before caps existed
		submit    int // the submitted job's priority
		update    int // the priority the update asks for
		submitErr bool
		updateErr bool
	}{
		{"no cap field: lowest class only", -1, 0, 0, false, false},
		{"no cap field refuses any priority", -1, 1, 0, true, false},
		{"default cap refuses any priority", 0, 5, 0, true, false},
		{"at the cap", 100, 100, 100, false, false},
		{"update above the cap", 100, 10, 101, false, true},
		{"update lowering", 100, 100, 50, false, false},
		{"submit above the cap", 10, 1000, 0, true, false},
		{"top cap", cluster.MaxPriority, cluster.MaxPriority, 0, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts := newTestStore(t)
			if c.cap < 0 {
				// A record written before the field existed: no maxPriority key at all.
				key, _ := cluster.TenantKey("search")
				if _, err := ts.admin.Create(ts.ctx, key, []byte(`{"name":"search","created":"2026-01-01T00:00:00Z"}`), 0); err != nil {
					t.Fatal(err)
				}
			} else if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search", MaxPriority: c.cap}}); err != nil {
				t.Fatal(err)
			}
			spec := testSpec("wc", 2)
			spec.Priority = c.submit
			_, err := SubmitJob(ts.ctx, ts.admin, spec)
			checkCapErr(t, "submit", err, c.submitErr, c.submit)
			if c.submitErr {
				if _, _, err := ReadJob(ts.ctx, ts.admin, "wc"); !errors.Is(err, api.ErrNotFound) {
					t.Fatalf("refused submit stored the job: %v", err)
				}
				return
			}
			before, _, err := ReadJob(ts.ctx, ts.admin, "wc")
			if err != nil {
				t.Fatal(err)
			}
			next := *spec
			next.Priority = c.update
			next.Command = []string{"sleep", "2000"} // something to roll out even at the same priority
			_, _, err = UpdateJob(ts.ctx, ts.admin, "wc", Change{Spec: &next, Who: "admin"})
			checkCapErr(t, "update", err, c.updateErr, c.update)
			after, _, rerr := ReadJob(ts.ctx, ts.admin, "wc")
			if rerr != nil {
				t.Fatal(rerr)
			}
			if c.updateErr && !reflect.DeepEqual(before, after) {
				t.Errorf("refused update changed the job:\nbefore %+v\nafter  %+v", before, after)
			}
			if !c.updateErr && after.Spec.Priority != c.update {
				t.Errorf("priority %d after the update, want %d", after.Spec.Priority, c.update)
			}
		})
	}
}

func checkCapErr(t *testing.T, what string, err error, want bool, prio int) {
	t.Helper()
	if !want {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return
	}
	if !errors.Is(err, api.ErrQuota) {
		t.Fatalf("%s: error %v, want over quota", what, err)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "may use priority up to") ||
		!strings.Contains(msg, "stormdock tenant update search --max-priority "+strconv.Itoa(prio)) {
		t.Errorf("%s: error %q should be one line naming the cap and the command that raises it", what, msg)
	}
}

// TestUpdateTenant: fields not given stay as they are; a cap out of range changes nothing.
func TestUpdateTenant(t *testing.T) {
	ts := newTestStore(t)
	if err := CreateTenant(ts.ctx, ts.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search", MaxWorkers: 7}}); err != nil {
		t.Fatal(err)
	}
	p := 100
	got, err := UpdateTenant(ts.ctx, ts.admin, "search", api.TenantChange{MaxPriority: &p})
	if err != nil || got.MaxPriority != 100 || got.MaxWorkers != 7 {
		t.Fatalf("update: %+v, %v; want max priority 100, max workers 7", got, err)
	}
	for _, bad := range []int{-1, cluster.MaxPriority + 1} {
		if _, err := UpdateTenant(ts.ctx, ts.admin, "search", api.TenantChange{MaxPriority: &bad}); !errors.Is(err, api.ErrBadInput) {
			t.Errorf("max priority %d: %v, want bad input", bad, err)
		}
	}
	if _, err := UpdateTenant(ts.ctx, ts.admin, "nobody", api.TenantChange{MaxPriority: &p}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown tenant: %v, want not found", err)
	}
	rec, _, err := ReadTenant(ts.ctx, ts.admin, "search")
	if err != nil || rec.MaxPriority != 100 || rec.MaxWorkers != 7 {
		t.Errorf("stored %+v, %v; want max priority 100, max workers 7", rec.Tenant, err)
	}
}
