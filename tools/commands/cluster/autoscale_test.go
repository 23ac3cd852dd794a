package cluster

import (
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/provision/autoscale"
)

// What `cluster autoscale` prints: the policy it keeps when it starts (the defaults filled
// in, as a policy file may leave them out) and each decision as it is made.
func TestAutoscaleOutput(t *testing.T) {
	for _, c := range []struct {
		name string
		pol  autoscale.Policy
		want string
	}{{
		name: "defaults",
		pol:  autoscale.Policy{Min: 1, Max: 5},
		want: "cluster prod: 3 nodes; keeping 1..5 (grace 30s, idle below 0% for 5m0s, cooldown 1m0s)",
	}, {
		name: "all given",
		pol: autoscale.Policy{Min: 2, Max: 9, Grace: cluster.Duration(time.Minute), IdleBelow: 0.25,
			IdleFor: cluster.Duration(30 * time.Minute), Cooldown: cluster.Duration(5 * time.Minute)},
		want: "cluster prod: 3 nodes; keeping 2..9 (grace 1m0s, idle below 25% for 30m0s, cooldown 5m0s)",
	}} {
		if got := policyLine("prod", 3, c.pol); got != c.want {
			t.Errorf("%s: policyLine:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
	at := time.Date(2026, 3, 1, 12, 0, 5, 0, time.Local)
	for _, c := range []struct {
		d    autoscale.Decision
		want string
	}{
		{autoscale.Decision{Kind: autoscale.Add, From: 3, To: 5, Reason: "4 workers waiting for room for 45s (grace 30s): 3 -> 5 nodes"},
			"12:00:05 add: 4 workers waiting for room for 45s (grace 30s): 3 -> 5 nodes"},
		{autoscale.Decision{Kind: autoscale.Refuse, Reason: "max 5 nodes reached"}, "12:00:05 refuse: max 5 nodes reached"},
	} {
		if got := decisionLine(at, c.d); got != c.want {
			t.Errorf("decisionLine:\n got %q\nwant %q", got, c.want)
		}
	}
}
