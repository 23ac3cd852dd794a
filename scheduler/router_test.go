package scheduler

import (
	"reflect"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/multidc"
)

// TestRouterCommand: the router worker's command line is one `stormdock router` reads back
// into the mirrored job's store, links, sink and port.
func TestRouterCommand(t *testing.T) {
	rec := cluster.JobRecord{RouterPort: 17101, Spec: cluster.JobSpec{Name: "mirror", Tenant: "t", Links: []string{"dc-a", "dc-b"},
		Output: "file:///var/out.jsonl"}}
	rr := routerRecord(rec, "zk://127.0.0.1:2181/sd", []string{"dc-a", "dc-b", "dc-c"})
	cmd := rr.Spec.Command
	if len(cmd) < 2 || cmd[0] != "stormdock" || cmd[1] != multidc.RouterCommand {
		t.Fatalf("command %q, want stormdock %s ...", cmd, multidc.RouterCommand)
	}
	var got multidc.RouterArgs
	if err := got.Parse(cmd[2:]); err != nil {
		t.Fatal(err)
	}
	want := multidc.DefaultRouterArgs()
	want.Store, want.Job, want.Links, want.Sink, want.Listen = "zk://127.0.0.1:2181/sd", "mirror", []string{"dc-a", "dc-b"}, "file:///var/out.jsonl", "127.0.0.1:17101"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("router reads %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(rr.Spec.Placement.DCs, []string{"dc-c"}) {
		t.Fatalf("router placed in %v, want outside the links: [dc-c]", rr.Spec.Placement.DCs)
	}
}
