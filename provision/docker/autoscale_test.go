package docker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision"
	"github.com/stormdock/stormdock/provision/autoscale"
)

// TestAutoscale is the cluster autoscaler on real Docker hosts: one agent of 4 slots and a
// job of 6 workers, 2 of which wait for room: the controller adds an agent (cluster
// scale's path) and they run there. The job scaled to 2 leaves the new agent idle: it is
// drained through the master and removed, and the workers keep running on the first. Both
// changes are cluster events.
func TestAutoscale(t *testing.T) {
	p, spec, _ := newProvider(t, 1)
	tokens := provision.Tokens{Dir: p.TokenDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	cl := apiClient(t, tokens, c)
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, []byte("name: wc\ntenant: t1\nworkers: 6\nresources: {memory: 16Mi, cpu: 0.05}\n"+
		"command: [stormdock, worker, wordcount, --rate, '5']\ngracePeriod: 2s\n")); err != nil {
		t.Fatal(err)
	}
	var decided []autoscale.Decision
	ctl := &autoscale.Controller{Name: spec.Name, Provider: p, Client: cl, Decided: func(d autoscale.Decision) { decided = append(decided, d) },
		Policy: autoscale.Policy{Min: 1, Max: 2, Grace: cluster.Duration(time.Second), IdleFor: cluster.Duration(time.Second),
			Cooldown: cluster.Duration(time.Second)}}
	testenv.EventuallyWith(t, "the 6 workers running on 2 agents", 3*time.Minute, func() (bool, string) {
		if _, err := ctl.Step(ctx); err != nil {
			return false, err.Error()
		}
		_, sum, err := workers(ctx, cl)
		if err != nil {
			return false, err.Error()
		}
		return sum.Running == 6 && sum.Unplaced == 0, fmt.Sprintf("%+v; decisions %+v", sum, decided)
	})
	if len(decided) != 1 || decided[0].Kind != autoscale.Add || decided[0].To != 2 {
		t.Fatalf("decisions %+v, want one add to 2", decided)
	}
	if _, err := cl.ScaleJob(ctx, "wc", 2); err != nil {
		t.Fatal(err)
	}
	// Workers 0 to 3 were placed on the first agent (4 and 5 waited): the scale-in stops
	// 2 to 5, and the second agent is left idle.
	second := spec.SlotAt(1).Node
	testenv.EventuallyWith(t, "the second agent removed", 3*time.Minute, func() (bool, string) {
		if _, err := ctl.Step(ctx); err != nil {
			return false, err.Error()
		}
		st, err := p.Status(ctx, spec.Name)
		if err != nil {
			return false, err.Error()
		}
		return len(st.Agents) == 1, fmt.Sprintf("%d agents; decisions %+v", len(st.Agents), decided)
	})
	ws := settled(t, cl, 2, time.Minute)
	for i, w := range ws {
		if w.node == second {
			t.Errorf("worker %d still on the removed agent %s", i, second)
		}
	}
	evs, err := cl.Events(ctx, api.EventFilter{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.Kind == api.EventClusterAutoscaled {
			got = append(got, e.Reason)
		}
	}
	if len(got) != 2 || !strings.Contains(got[0], "2 workers wait for room") || !strings.Contains(got[1], second+" idle") {
		t.Errorf("cluster events %q", got)
	}
}
