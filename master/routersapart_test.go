package master_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
)

// A mirrored job's two routers end in one data center when the other is lost; the status
// says so; when the lost one comes back the standby router is moved there (the leader
// stays where it is), and the status stops saying so. Nothing else moves for it.
func TestRoutersMovedApartWhenTheirDCReturns(t *testing.T) {
	tc := clustertest.NewSim(t)
	// Two routers need a store both can open (one process's embedded store gets one): no
	// router runs in the simulation, the URL only has to say so.
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.RouterStore = "zk://127.0.0.1:2181/sim" })
	for _, n := range clustertest.Nodes(2, 1, 2) {
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 4 nodes", 10*time.Second, func() bool { return len(m.MirrorView().Nodes()) == 4 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	spec := clustertest.Spec("mirror", 1)
	spec.Links, spec.Output = []string{"dc-0", "dc-1"}, "http://127.0.0.1:9/sink"
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, spec); err != nil {
		t.Fatal(err)
	}
	dcOf := func(node string) string { return "dc-" + strings.Split(node, "-")[1] }
	routers := func() map[int]string { // router index -> node
		out := map[int]string{}
		for k, node := range tc.Assignments() {
			if k.Job == "mirror.router" {
				out[k.Worker] = node
			}
		}
		return out
	}
	routerDCs := func() ([]string, string) {
		r := routers()
		var dcs []string
		for _, n := range r {
			dcs = append(dcs, dcOf(n))
		}
		slices.Sort(dcs)
		return dcs, fmt.Sprint(r)
	}
	shared := func() string {
		sv := m.SinkView(tc.Ctx, m.MirrorView(), "mirror")
		if sv == nil {
			return "no sink view"
		}
		return sv.SharedDC
	}
	testenv.EventuallyWith(t, "the routers in dc-0 and dc-1", 10*time.Second, func() (bool, string) {
		dcs, where := routerDCs()
		return slices.Equal(dcs, []string{"dc-0", "dc-1"}) && shared() == "", where
	})

	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-1", cluster.DCFailed, false); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "both routers in dc-0, and the status saying so", 10*time.Second, func() (bool, string) {
		dcs, where := routerDCs()
		return slices.Equal(dcs, []string{"dc-0", "dc-0"}) && shared() == "dc-0", fmt.Sprintf("%s, shared %q", where, shared())
	})
	before := routers()
	others := map[cluster.WorkerKey]string{}
	for k, n := range tc.Assignments() {
		if k.Job != "mirror.router" {
			others[k] = n
		}
	}

	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-1", cluster.DCActive, false); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "a router back in dc-1", 30*time.Second, func() (bool, string) {
		dcs, where := routerDCs()
		return slices.Equal(dcs, []string{"dc-0", "dc-1"}) && shared() == "", fmt.Sprintf("%s, shared %q", where, shared())
	})
	after := routers()
	stayed := 0
	for i, n := range before {
		if after[i] == n {
			stayed++
		}
	}
	if stayed != 1 {
		t.Errorf("routers before the return %v, after %v: want one (the leader) where it was", before, after)
	}
	for k, n := range tc.Assignments() {
		if old, ok := others[k]; ok && old != n && k.Link != "dc-1" {
			t.Errorf("worker %s moved from %s to %s with the router", k, old, n)
		}
	}
}
