package desired

import (
	"errors"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

func scaledSpec(name string, workers int) *cluster.JobSpec {
	s := testSpec(name, workers)
	s.Scaling = &cluster.ScalingPolicy{Min: 2, Max: 6, Metric: "input_backlog", Target: 100}
	return s
}

// TestAutoscaleJob: the autoscaler's change takes the path of job scale (a new epoch, the
// quota) and records the decision; a manual scale pauses the policy, and then the
// autoscaler's changes are refused until it is resumed; a change decided on a count that
// moved meanwhile is refused.
func TestAutoscaleJob(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search", MaxWorkers: 5}}); err != nil {
		t.Fatal(err)
	}
	rec, err := SubmitJob(tc.ctx, tc.admin, scaledSpec("wc", 2))
	if err != nil {
		t.Fatal(err)
	}
	d := cluster.ScalingDecision{At: time.Now().UTC(), From: 2, To: 4, Metric: "input_backlog", Value: 250, Target: 100, Reason: "over target"}
	got, err := AutoscaleJob(tc.ctx, tc.admin, "wc", d)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Workers != 4 || got.Epoch != rec.Epoch+1 || got.Autoscale == nil || got.Autoscale.Last == nil || got.Autoscale.Last.To != 4 {
		t.Fatalf("after the autoscaler's change: workers %d, epoch %d (was %d), state %+v", got.Spec.Workers, got.Epoch, rec.Epoch, got.Autoscale)
	}
	// The tenant may run 5: 6 is over quota, and nothing changes.
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "wc", cluster.ScalingDecision{From: 4, To: 6}); !errors.Is(err, api.ErrQuota) {
		t.Fatalf("over the quota: err = %v", err)
	}
	// Decided on 2 workers, but the job has 4 now.
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "wc", cluster.ScalingDecision{From: 2, To: 3}); !errors.Is(err, ErrPolicyChanged) {
		t.Fatalf("a stale decision: err = %v", err)
	}
	paused, err := ScaleJobAs(tc.ctx, tc.admin, "wc", 3, "tenant/search")
	if err != nil {
		t.Fatal(err)
	}
	if a := paused.Autoscale; a == nil || !a.Paused || a.PausedBy != "tenant/search" || a.Last == nil || a.Last.To != 4 {
		t.Fatalf("a manual scale: %+v, want the policy paused by tenant/search and its last decision kept", a)
	}
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "wc", cluster.ScalingDecision{From: 3, To: 4}); !errors.Is(err, ErrPolicyChanged) {
		t.Fatalf("a paused policy's change: err = %v", err)
	}
	resumed, err := SetAutoscale(tc.ctx, tc.admin, "wc", false, "admin")
	if err != nil || resumed.Autoscale.Paused {
		t.Fatalf("resume: %+v, %v", resumed.Autoscale, err)
	}
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "wc", cluster.ScalingDecision{From: 3, To: 2}); err != nil {
		t.Fatalf("a resumed policy's change: %v", err)
	}
	// A job without a policy has none to pause, and its manual scale stores no state.
	if _, err := SubmitJob(tc.ctx, tc.admin, testSpec("plain", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := SetAutoscale(tc.ctx, tc.admin, "plain", true, "admin"); !errors.Is(err, api.ErrBadInput) {
		t.Fatalf("pause without a policy: err = %v", err)
	}
	if p, err := ScaleJob(tc.ctx, tc.admin, "plain", 2); err != nil || p.Autoscale != nil {
		t.Fatalf("manual scale of a job without a policy: %+v, %v", p.Autoscale, err)
	}
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "plain", cluster.ScalingDecision{From: 2, To: 1}); !errors.Is(err, ErrPolicyChanged) {
		t.Fatalf("the autoscaler on a job without a policy: err = %v", err)
	}
}

// TestUpdateKeepsTheAutoscaledCount: an update of a job whose policy runs keeps the count
// the policy set (within the new range), rather than the file's.
func TestUpdateKeepsTheAutoscaledCount(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := SubmitJob(tc.ctx, tc.admin, scaledSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := AutoscaleJob(tc.ctx, tc.admin, "wc", cluster.ScalingDecision{From: 2, To: 5}); err != nil {
		t.Fatal(err)
	}
	next := scaledSpec("wc", 2)
	next.Env = map[string]string{"MODE": "fast"}
	next.Scaling.Max = 4
	rec, _, err := UpdateJob(tc.ctx, tc.admin, "wc", Change{Spec: next})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Spec.Workers != 4 {
		t.Fatalf("an update to max 4 of a job the policy scaled to 5: %d workers, want 4", rec.Spec.Workers)
	}
}
