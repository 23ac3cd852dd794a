package master_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
)

func TestAvoidFor(t *testing.T) {
	for _, c := range []struct {
		cfg     master.Config
		strikes int
		want    time.Duration
	}{
		{master.Config{}, 1, 5 * time.Minute},
		{master.Config{}, 2, 10 * time.Minute},
		{master.Config{}, 4, 40 * time.Minute},
		{master.Config{}, 5, time.Hour}, // capped
		{master.Config{}, 50, time.Hour},
		{master.Config{AvoidPeriod: time.Second, AvoidMax: 3 * time.Second}, 2, 2 * time.Second},
		{master.Config{AvoidPeriod: time.Second, AvoidMax: 3 * time.Second}, 3, 3 * time.Second},
		{master.Config{AvoidPeriod: 2 * time.Hour}, 1, 2 * time.Hour}, // the cap is never below the period
	} {
		if got := master.AvoidFor(c.cfg, c.strikes); got != c.want {
			t.Errorf("AvoidFor(%v/%v, %d) = %s, want %s", c.cfg.AvoidPeriod, c.cfg.AvoidMax, c.strikes, got, c.want)
		}
	}
}

func nodeConf(t *testing.T, tc *clustertest.Sim, id string) cluster.NodeConf {
	t.Helper()
	var c cluster.NodeConf
	e, err := tc.Admin.Get(tc.Ctx, cluster.NodeConfsKey+"/"+id)
	if err == nil {
		_ = json.Unmarshal(e.Value, &c)
	}
	return c
}

// TestAvoidanceHeals: a job whose worker crash-loops on every node gets every node avoided
// in turn, yet is never left unplaced (an avoided node takes it when nothing else does);
// each avoidance runs out by itself, and a node the job crash-loops on again avoids it for
// twice as long.
func TestAvoidanceHeals(t *testing.T) {
	tc := clustertest.NewSim(t)
	const period = 300 * time.Millisecond
	crash := func(_ string, w cluster.WorkerAssignment) *sim.Failure {
		if w.Key.Job == "wc" {
			return &sim.Failure{Restarts: 6, Exit: "exited with code 3"}
		}
		return nil
	}
	nodes := clustertest.Nodes(1, 1, 2)
	for _, n := range nodes {
		tc.Agent(n, sim.Config{Behavior: sim.Behavior{Fail: crash}})
	}
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.AvoidPeriod, c.AvoidMax = period, 10*period })
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("wc", 1)); err != nil {
		t.Fatal(err)
	}
	key := cluster.WorkerKey{Job: "wc", Worker: 0}
	var second api.Event
	testenv.EventuallyWith(t, "a second crash loop on one node", 30*time.Second, func() (bool, string) {
		evs, _ := m.Events().Query(api.EventFilter{Job: "wc"}, 0)
		var seen []string
		for _, e := range evs {
			if e.Kind == api.EventWorkerCrashLoop {
				seen = append(seen, e.Reason)
				if strings.Contains(e.Reason, "(crash loop 2 there)") {
					second = e
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("assigned to %q; crash loops: %q", tc.Assignments()[key], seen)
	})
	// Both nodes took their turn being avoided, and healed.
	evs, _ := m.Events().Query(api.EventFilter{Job: "wc"}, 0)
	healed := map[string]bool{}
	for _, e := range evs {
		if e.Kind == api.EventNodeAvoidEnded {
			healed[e.Node] = true
		}
	}
	if len(healed) == 0 {
		t.Errorf("no node.avoid-ended event: %+v", evs)
	}
	c := nodeConf(t, tc, second.Node)
	a, ok := c.Avoidance("wc")
	if !ok || a.Strikes < 2 {
		t.Fatalf("node %s: avoidances %+v, want wc's with 2 strikes", second.Node, c.Avoided)
	}
	if a.Strikes == 2 {
		if d := a.Until.Sub(second.Time); d < 2*period-10*time.Millisecond {
			t.Errorf("second avoidance lasts %s from its event, want twice the %s period", d, period)
		}
	}
	// Never unplaced for long: with every node avoided the worker is still assigned.
	testenv.Eventually(t, "wc/0 assigned", 5*time.Second, func() bool { return tc.Assignments()[key] != "" })
}

// TestAvoidedNodeTakesWorkersWhenNothingElseFits: a node that avoids a job takes its
// workers when no other can (here: one worker per node, two workers, two nodes), while the
// other workers keep away from it; a node record of an earlier master (a plain list of jobs)
// still reads, and its avoidance gets a period.
func TestAvoidedNodeTakesWorkersWhenNothingElseFits(t *testing.T) {
	tc := clustertest.NewSim(t)
	nodes := clustertest.Nodes(1, 1, 2)
	bad, good := nodes[0].ID, nodes[1].ID
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	if err := desired.UpdateNodeConf(tc.Ctx, tc.Admin, bad, func(c *cluster.NodeConf) {
		c.Avoid, c.Avoided = []string{"wc"}, []cluster.Avoidance{{Job: "wc", Until: until, Strikes: 3}}
	}); err != nil {
		t.Fatal(err)
	}
	// As an earlier master wrote it: avoid as a plain list.
	if _, err := tc.Admin.Put(tc.Ctx, cluster.NodeConfsKey+"/"+good, []byte(`{"avoid":["old"]}`), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		tc.Node(n)
	}
	m, _, _ := tc.Master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	wc := clustertest.Spec("wc", 1)
	wc.Placement.MaxPerNode = 1
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, wc); err != nil {
		t.Fatal(err)
	}
	w0, w1 := cluster.WorkerKey{Job: "wc", Worker: 0}, cluster.WorkerKey{Job: "wc", Worker: 1}
	testenv.EventuallyWith(t, "wc/0 on the node that does not avoid it", 5*time.Second, func() (bool, string) {
		return tc.Assignments()[w0] == good, fmt.Sprint(tc.Assignments())
	})
	// A second worker fits only on the avoided node: it goes there rather than nowhere.
	if _, err := desired.ScaleJob(tc.Ctx, tc.Admin, "wc", 2); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "wc/1 on the avoided node", 5*time.Second, func() (bool, string) {
		a := tc.Assignments()
		return a[w0] == good && a[w1] == bad, fmt.Sprint(a)
	})
	old, ok := nodeConf(t, tc, good).Avoidance("old")
	if !ok || old.Strikes != 1 || time.Until(old.Until) > master.DefaultAvoidPeriod || time.Until(old.Until) < master.DefaultAvoidPeriod-time.Minute {
		t.Errorf("an earlier master's avoidance: %+v (found %v), want a first strike for the default period", old, ok)
	}
	if c := nodeConf(t, tc, bad); !c.Avoiding("wc", time.Now()) || !slices.Contains(c.Avoid, "wc") {
		t.Errorf("node %s no longer avoids wc: %+v", bad, c)
	}
}

func TestHeal(t *testing.T) {
	now := time.Now()
	cfg := master.Config{AvoidPeriod: time.Minute, AvoidMax: 10 * time.Minute}
	av := func(job string, until time.Duration, strikes int) cluster.Avoidance {
		return cluster.Avoidance{Job: job, Until: now.Add(until), Strikes: strikes}
	}
	for _, c := range []struct {
		name    string
		in      cluster.NodeConf
		avoid   []string
		avoided []string // jobs with an entry after
		healed  []string
		changed bool
	}{
		{"running", cluster.NodeConf{Avoid: []string{"a"}, Avoided: []cluster.Avoidance{av("a", time.Minute, 1)}},
			[]string{"a"}, []string{"a"}, nil, false},
		{"ran out: healed, strikes kept", cluster.NodeConf{Avoid: []string{"a", "b"}, Avoided: []cluster.Avoidance{av("a", -time.Second, 2), av("b", time.Minute, 1)}},
			[]string{"b"}, []string{"a", "b"}, []string{"a"}, true},
		{"ran out long ago: forgotten", cluster.NodeConf{Avoided: []cluster.Avoidance{av("a", -11*time.Minute, 3), av("b", -9*time.Minute, 1)}},
			nil, []string{"b"}, nil, true},
		{"an earlier master's record: a first strike", cluster.NodeConf{Avoid: []string{"old"}},
			[]string{"old"}, []string{"old"}, nil, true},
		{"nothing", cluster.NodeConf{Draining: true}, nil, nil, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, healed, changed := master.Heal(cfg, c.in, now)
			var avoided []string
			for _, a := range out.Avoided {
				avoided = append(avoided, a.Job)
			}
			slices.Sort(avoided)
			if !slices.Equal(out.Avoid, c.avoid) || !slices.Equal(avoided, c.avoided) || !slices.Equal(healed, c.healed) || changed != c.changed {
				t.Errorf("heal = avoid %v, entries %v, healed %v, changed %v; want %v, %v, %v, %v",
					out.Avoid, avoided, healed, changed, c.avoid, c.avoided, c.healed, c.changed)
			}
			if a, ok := out.Avoidance("old"); ok && (a.Strikes != 1 || !a.Until.After(now)) {
				t.Errorf("an earlier master's avoidance got %+v, want a first strike ending in the future", a)
			}
			if !out.Draining && c.in.Draining {
				t.Error("heal dropped other settings")
			}
		})
	}
}
