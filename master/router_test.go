package master

import (
	"reflect"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/multidc"
)

// TestRouterCommand: the router worker's command line is one `stormdock router` reads back
// into the mirrored job's store, links, sink and listen address (its node's, expanded by the
// router from its environment).
func TestRouterCommand(t *testing.T) {
	rec := cluster.JobRecord{Spec: cluster.JobSpec{Name: "mirror", Tenant: "t", Links: []string{"dc-a", "dc-b"},
		Output: "file:///var/out.jsonl"}, OutputLinkTokenHashes: map[string]string{"dc-a": "aa", "dc-b": "bb"}}
	rr := routerRecord(rec, "zk://127.0.0.1:2181/sd", 6)
	cmd := rr.Spec.Command
	if len(cmd) < 2 || cmd[0] != "stormdock" || cmd[1] != multidc.RouterCommand {
		t.Fatalf("command %q, want stormdock %s ...", cmd, multidc.RouterCommand)
	}
	var got multidc.RouterArgs
	if err := got.Parse(cmd[2:]); err != nil {
		t.Fatal(err)
	}
	want := multidc.DefaultRouterArgs()
	want.Store, want.Job, want.Links, want.Sink, want.Listen = "zk://127.0.0.1:2181/sd", "mirror", []string{"dc-a", "dc-b"}, "file:///var/out.jsonl", "$STORMDOCK_ADDR:$STORMDOCK_PORT"
	// The tenant's part of the sink dir, and each link's token hash.
	want.Tenant, want.LinkTokenHashes = "t", map[string]string{"dc-a": "aa", "dc-b": "bb"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("router reads %+v, want %+v", got, want)
	}
	if rr.Spec.Workers != 2 || !reflect.DeepEqual(rr.Spec.Placement.Spread, []string{"dc", "node"}) || rr.Spec.Placement.MaxPerNode != 1 {
		t.Fatalf("routers: %d workers spread over %v, at most %d a node; want a standby in another data center",
			rr.Spec.Workers, rr.Spec.Placement.Spread, rr.Spec.Placement.MaxPerNode)
	}
	if one := routerRecord(rec, "zk://127.0.0.1:2181/sd", 1); one.Spec.Workers != 1 {
		t.Fatalf("a one-node cluster runs %d routers, want 1", one.Spec.Workers)
	}
	if local := routerRecord(rec, "mem://", 6); local.Spec.Workers != 1 {
		t.Fatalf("routers on a store they cannot share: %d of them, want 1 (they could not elect one leader)", local.Spec.Workers)
	}
	if len(rr.Spec.Secrets) != 0 {
		t.Fatalf("routers of a job without an output secret get secrets %v", rr.Spec.Secrets)
	}
	// An output secret: the routers get it as a secret of theirs, and its name (never its
	// value) on their command line.
	rec.Spec.OutputSecret = "sinkpass"
	rr = routerRecord(rec, "zk://127.0.0.1:2181/sd", 6)
	if err := got.Parse(rr.Spec.Command[2:]); err != nil {
		t.Fatal(err)
	}
	if got.OutputSecret != "sinkpass" || !reflect.DeepEqual(rr.Spec.Secrets, []string{"sinkpass"}) {
		t.Fatalf("routers of a job with an output secret: --output-secret %q, secrets %v", got.OutputSecret, rr.Spec.Secrets)
	}
}
