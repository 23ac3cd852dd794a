package nomad_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision/autoscale"
)

// TestAutoscaleRecorded is the cluster autoscaler on the Nomad provider, through the recorded
// exchanges (no Nomad server runs here: see testdata/README.md), with a real master and
// simulated agents playing what Nomad's clients run. Two agents of 4 slots and a job of 10
// workers: 2 wait for room, so the Nomad job is scaled to 3 (a client joins) and they run.
// The job scaled down to 4 workers leaves the third agent idle: it is drained through the
// master first, then the Nomad job is scaled back to 2. Both changes are cluster events.
func TestAutoscaleRecorded(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := e.p.Create(ctx, e.spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	token, err := e.tokens.Read("rec")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient(c.API, token)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, []byte("name: wc\ntenant: t1\nworkers: 10\nresources: {memory: 16Mi, cpu: 0.05}\ncommand: [x]\n")); err != nil {
		t.Fatal(err)
	}
	var decided []autoscale.Decision
	ctl := &autoscale.Controller{Name: "rec", Provider: e.p, Client: cl, Decided: func(d autoscale.Decision) { decided = append(decided, d) },
		// IdleFor covers the moment between the added node's registration and the waiting
		// workers' placement on it, when it is still empty (1 ms removed it at once, now and then).
		Policy: autoscale.Policy{Min: 2, Max: 3, Grace: cluster.Duration(time.Millisecond), IdleFor: cluster.Duration(2 * time.Second),
			Cooldown: cluster.Duration(time.Millisecond)}}
	running := func(n int) func() (bool, string) {
		return func() (bool, string) {
			st, err := cl.JobSummary(ctx, "wc")
			if err != nil {
				return false, err.Error()
			}
			return st.Summary.Running == n && st.Summary.Unplaced == 0 && st.Summary.Stopping == 0, fmt.Sprintf("%+v", st.Summary)
		}
	}
	// Out: step until the waiting workers run (the first look starts the grace).
	testenv.EventuallyWith(t, "the 10 workers running on 3 agents", time.Minute, func() (bool, string) {
		if _, err := ctl.Step(ctx); err != nil {
			return false, err.Error()
		}
		return running(10)()
	})
	if len(decided) != 1 || decided[0].Kind != autoscale.Add || decided[0].To != 3 || !strings.Contains(decided[0].Reason, "2 workers wait for room") {
		t.Fatalf("decisions: %+v, want one add to 3 for 2 waiting workers", decided)
	}
	// In: 4 workers fit on two agents; the third goes once idle.
	if _, err := cl.ScaleJob(ctx, "wc", 4); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the idle agent removed", time.Minute, func() (bool, string) {
		if _, err := ctl.Step(ctx); err != nil {
			return false, err.Error()
		}
		st, err := e.p.Status(ctx, "rec")
		if err != nil {
			return false, err.Error()
		}
		return len(st.Agents) == 2, fmt.Sprintf("%d agents; decisions %+v", len(st.Agents), decided)
	})
	testenv.EventuallyWith(t, "the 4 workers running", time.Minute, running(4))
	last := decided[len(decided)-1]
	if last.Kind != autoscale.Remove || last.To != 2 || !slices.Equal(last.Remove, []string{"nomad-client-3"}) {
		t.Errorf("last decision %+v, want nomad-client-3 removed", last)
	}
	// What Nomad was asked: scale to 3, then to 2, the drain of the third before the second.
	scales := e.rp.requests(http.MethodPut, "/v1/job/stormdock-rec/scale")
	if len(scales) != 2 || !strings.Contains(string(scales[0].Body), `"Count":3`) || !strings.Contains(string(scales[1].Body), `"Count":2`) {
		t.Errorf("scale requests: %+v", scales)
	}
	ev := e.events.list()
	drain := slices.Index(ev, "master POST /v1/nodes/nomad-client-3/drain")
	scaleIn := slices.Index(ev, "nomad PUT /v1/job/stormdock-rec/scale")
	for i, s := range ev {
		if s == "nomad PUT /v1/job/stormdock-rec/scale" {
			scaleIn = i
		}
	}
	if drain < 0 || drain > scaleIn {
		t.Errorf("drain at %d, scale-in at %d: %v", drain, scaleIn, ev)
	}
	// The master's event log is written in batches: wait for the second event to be read.
	var kinds []string
	testenv.EventuallyWith(t, "both cluster events", time.Minute, func() (bool, string) {
		evs, err := cl.Events(ctx, api.EventFilter{}, 1000)
		if err != nil {
			return false, err.Error()
		}
		kinds = kinds[:0]
		for _, e := range evs {
			if e.Kind == api.EventClusterAutoscaled {
				kinds = append(kinds, e.Object+": "+e.Reason)
			}
		}
		return len(kinds) >= 2, fmt.Sprintf("%q", kinds)
	})
	if len(kinds) != 2 || !strings.HasPrefix(kinds[0], "cluster/rec: 2 workers wait for room") || !strings.Contains(kinds[1], "nomad-client-3 idle") {
		t.Errorf("cluster events: %q", kinds)
	}
}
