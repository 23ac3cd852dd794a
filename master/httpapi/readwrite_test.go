package httpapi_test

import (
	"fmt"
	"testing"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// TestReadYourWrites: a client that changes something through the API reads its change
// back at once, although the API answers from the leader's last reconcile.
func TestReadYourWrites(t *testing.T) {
	f := newAPIFixture(t)
	ctx := f.tc.Ctx
	cl, _ := api.NewClient(f.srv.URL, f.admin)
	nodes, err := cl.Nodes(ctx)
	if err != nil || len(nodes) == 0 {
		t.Fatalf("nodes: %v %v", nodes, err)
	}
	node := nodes[0].ID
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "ryw"}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("ryw-%d", i)
		spec := fmt.Sprintf("name: %s\ntenant: ryw\nworkers: 1\nresources: {memory: 16Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n", name)
		if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Job(ctx, name); err != nil {
			t.Fatalf("job %s read right after its submission: %v", name, err)
		}
		if _, err := cl.KillJob(ctx, name, 0); err != nil {
			t.Fatal(err)
		}
		for _, drain := range []bool{true, false} {
			if err := cl.DrainNode(ctx, node, drain); err != nil {
				t.Fatal(err)
			}
			nodes, err := cl.Nodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				if n.ID == node && n.Draining != drain {
					t.Fatalf("round %d: node %s listed with draining %v right after drain=%v", i, node, n.Draining, drain)
				}
			}
		}
	}
}
