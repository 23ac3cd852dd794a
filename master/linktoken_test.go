package master_test

import (
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/multidc"
)

// TestLinkSenderTokens: a mirrored job's record keeps one token hash per link, each link's
// workers get their own link's token (not another link's, not the job's), and the router's
// command line carries the links' hashes.
func TestLinkSenderTokens(t *testing.T) {
	tc := clustertest.NewSim(t)
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range clustertest.Nodes(2, 1, 1) {
		tc.Node(n)
	}
	spec := clustertest.Spec("mj", 1)
	spec.Links, spec.Output = []string{"dc-0", "dc-1"}, "http://127.0.0.1:1/in"
	rec, err := desired.SubmitJob(tc.Ctx, tc.Admin, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.OutputLinkTokenHashes) != 2 || rec.OutputLinkTokenHashes["dc-0"] == rec.OutputLinkTokenHashes["dc-1"] {
		t.Fatalf("link token hashes %v, want one per link", rec.OutputLinkTokenHashes)
	}
	m, _, _ := tc.Master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	e, err := tc.Admin.Get(tc.Ctx, cluster.OutputKeyKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := hex.DecodeString(string(e.Value))
	tokens := func() map[cluster.WorkerKey]cluster.WorkerAssignment {
		out := map[cluster.WorkerKey]cluster.WorkerAssignment{}
		names, _ := tc.Admin.Children(tc.Ctx, cluster.AssignmentsKey)
		for _, n := range names {
			e, err := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+n)
			if err != nil {
				continue
			}
			var a cluster.NodeAssignment
			_ = json.Unmarshal(e.Value, &a)
			for _, w := range a.Workers {
				out[w.Key] = w
			}
		}
		return out
	}
	var got map[cluster.WorkerKey]cluster.WorkerAssignment
	testenv.Eventually(t, "the link workers and the router assigned", 5*time.Second, func() bool {
		got = tokens()
		return len(got) == 3
	})
	jobToken := multidc.SenderToken(key, "mj", rec.Submitted)
	for k, wa := range got {
		if k.Link == "" {
			// The router: the links' hashes on its command line, no token of its own.
			var a multidc.RouterArgs
			if err := a.Parse(wa.Command[2:]); err != nil {
				t.Fatal(err)
			}
			if wa.OutputToken != "" || len(a.LinkTokenHashes) != 2 || a.LinkTokenHashes["dc-0"] != rec.OutputLinkTokenHashes["dc-0"] || a.Tenant != "search" {
				t.Fatalf("router %s: token %q, args %+v", k, wa.OutputToken, a)
			}
			continue
		}
		want := multidc.LinkSenderToken(key, "mj", k.Link, rec.Submitted)
		if wa.OutputToken != want || wa.OutputToken == jobToken || api.HashToken(wa.OutputToken) != rec.OutputLinkTokenHashes[k.Link] {
			t.Errorf("worker %s has token %q, want its link's", k, wa.OutputToken)
		}
	}
}
