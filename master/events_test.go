package master_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/multidc"
)

// TestFailoverEvents: a failover a router records in its job's record becomes a
// link.failover event of the job's tenant; the failover before the master led does not.
func TestFailoverEvents(t *testing.T) {
	tc := clustertest.NewSim(t)
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	spec := clustertest.Spec("mj", 1)
	spec.Links, spec.Output = []string{"dc-a", "dc-b"}, "file:///tmp/out.jsonl"
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, spec); err != nil {
		t.Fatal(err)
	}
	write := func(from, to, reason string, at time.Time, next int64) {
		t.Helper()
		rec := multidc.RouterRecord{Status: multidc.Status{Job: "mj", Active: to,
			LastFailover: &multidc.Failover{From: from, To: to, Reason: reason, At: at, NextOffset: next}}}
		b, _ := json.Marshal(rec)
		if _, err := tc.Admin.Put(tc.Ctx, cluster.RoutersKey+"/mj", b, coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	write("dc-b", "dc-a", multidc.ReasonHeartbeat, time.Now().Add(-time.Hour), 10) // before this master
	m, _, _ := tc.Master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	// A failover the moment the master leads, while its watch may still be listing the
	// routers' records, is recorded as one of its term (rounded up: the term began before).
	at := time.Now().Truncate(time.Millisecond).Add(time.Millisecond)
	write("dc-a", "dc-b", multidc.ReasonManual, at, 1234)
	testenv.EventuallyWith(t, "the failover's event", 5*time.Second, func() (bool, string) {
		evs, _ := m.Events().Query(api.EventFilter{Job: "mj"}, 0)
		var fo []api.Event
		for _, e := range evs {
			if e.Kind == api.EventLinkFailover {
				fo = append(fo, e)
			}
		}
		if len(fo) != 1 {
			return false, fmt.Sprintf("%+v", fo)
		}
		e := fo[0]
		ok := e.Object == "link/mj@dc-b" && e.Link == "dc-b" && e.Tenant == "search" && e.Time.Equal(at) &&
			e.Reason == "from dc-a to dc-b (manual), delivering from offset 1234"
		return ok, fmt.Sprintf("%+v", e)
	})
}

// A job submitted between a master's election and its first view of the cluster is in that
// view's baseline; its submission is still recorded, by the time it was made, while a job
// submitted before the term began is the last leader's to record.
func TestSubmittedAtTermStart(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	since := time.Now()
	job := func(name string, submitted time.Time) cluster.JobRecord {
		spec := clustertest.Spec(name, 1)
		return cluster.JobRecord{Spec: *spec, State: cluster.JobRunning, Submitted: submitted}
	}
	// The reconciler of a term whose first view holds both jobs.
	master.ObserveEvents(m, since, map[string]cluster.JobRecord{
		"before": job("before", since.Add(-time.Second)),
		"after":  job("after", since.Add(time.Millisecond)),
	})
	testenv.EventuallyWith(t, "the submission after the term began recorded", 5*time.Second, func() (bool, string) {
		var got []string
		for _, job := range []string{"before", "after"} {
			evs, _ := m.Events().Query(api.EventFilter{Job: job}, 0)
			for _, e := range evs {
				if e.Kind == api.EventJobSubmitted {
					got = append(got, e.Job)
				}
			}
		}
		return slices.Equal(got, []string{"after"}), fmt.Sprintf("submitted events for %v", got)
	})
}
