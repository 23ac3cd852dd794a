package autoscale

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

func nodes(used ...int) []Node {
	out := make([]Node, len(used))
	for i, u := range used {
		out[i] = Node{ID: fmt.Sprintf("a%d", i+1), DC: "dc-a", Rack: fmt.Sprintf("r%d", i%2+1), Slots: 4, Used: u, Schedulable: true,
			Jobs: map[string][]string{}}
	}
	return out
}

// TestDecide walks a cluster through time: workers waiting for room get nodes after the
// grace; idle nodes go after idleFor, highest first, never below min, never when their
// workers would not fit or a job would lose a rack it spreads over; refusals say why.
func TestDecide(t *testing.T) {
	p := Policy{Min: 2, Max: 4, Grace: cluster.Duration(30 * time.Second), IdleFor: cluster.Duration(time.Minute),
		Cooldown: cluster.Duration(20 * time.Second)}
	t0 := time.Unix(1e9, 0)
	type look struct {
		at                time.Duration
		nodes             []Node
		waiting, unplaced int
		kind              string
		to                int
		reason            string
	}
	for _, tc := range []struct {
		name  string
		looks []look
	}{
		{"waiting gets nodes after the grace", []look{
			{at: 0, nodes: nodes(4, 4), waiting: 5, unplaced: 5, kind: Steady, to: 2},
			{at: 20 * time.Second, nodes: nodes(4, 4), waiting: 5, unplaced: 5, kind: Steady, to: 2},
			{at: 31 * time.Second, nodes: nodes(4, 4), waiting: 5, unplaced: 5, kind: Add, to: 4, reason: "5 workers wait for room for 31s (grace 30s): 2 -> 4 nodes of 4 slots"},
		}},
		{"the wait starts over once nobody waits", []look{
			{at: 0, nodes: nodes(4, 4), waiting: 1, unplaced: 1, kind: Steady, to: 2},
			{at: 20 * time.Second, nodes: nodes(4, 4), kind: Steady, to: 2},
			{at: 40 * time.Second, nodes: nodes(4, 4), waiting: 1, unplaced: 1, kind: Steady, to: 2},
		}},
		{"at max: refused, said why", []look{
			{at: 0, nodes: nodes(4, 4, 4, 4), waiting: 3, unplaced: 3, kind: Steady, to: 4},
			{at: time.Minute, nodes: nodes(4, 4, 4, 4), waiting: 3, unplaced: 3, kind: Refuse, to: 4, reason: "want 5 nodes of 4 slots, but max is 4"},
		}},
		{"unplaced for other reasons add nothing and remove nothing", []look{
			{at: 0, nodes: nodes(1, 0, 0), unplaced: 2, kind: Steady, to: 3},
			{at: 10 * time.Minute, nodes: nodes(1, 0, 0), unplaced: 2, kind: Steady, to: 3},
		}},
		{"idle nodes go, highest first, not below min", []look{
			{at: 0, nodes: nodes(3, 0, 0, 0), kind: Steady, to: 4},
			{at: 30 * time.Second, nodes: nodes(3, 0, 0, 0), kind: Steady, to: 4},
			{at: 61 * time.Second, nodes: nodes(3, 0, 0, 0), kind: Remove, to: 2, reason: "a3, a4 idle (at most 0% of slots used) for 1m0s: drained and removed, 4 -> 2 nodes"},
		}},
		{"a busy node stops the removal below it", []look{
			{at: 0, nodes: nodes(0, 0, 2, 0), kind: Steady, to: 4},
			{at: 2 * time.Minute, nodes: nodes(0, 0, 2, 0), kind: Remove, to: 3},
		}},
		{"a node with a worker is not idle at idleBelow 0", []look{
			{at: 0, nodes: nodes(4, 4, 1), kind: Steady, to: 3},
			{at: 2 * time.Minute, nodes: nodes(4, 4, 1), kind: Steady, to: 3},
		}},
		{"out of range: back in", []look{
			{at: 0, nodes: nodes(1), kind: Add, to: 2, reason: "1 nodes is outside the policy's 2..4: 1 -> 2"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			for i, l := range tc.looks {
				d := Decide(p, &st, Observation{Now: t0.Add(l.at), Nodes: l.nodes, SlotsPerNode: 4, WaitingForRoom: l.waiting, Unplaced: l.unplaced})
				if d.Kind != l.kind || d.To != l.to || !strings.Contains(d.Reason, l.reason) {
					t.Fatalf("look %d at %s: %s to %d (%q), want %s to %d (%q)", i, l.at, d.Kind, d.To, d.Reason, l.kind, l.to, l.reason)
				}
			}
		})
	}
}

// TestDecideSafety: idle nodes whose workers fit nowhere else, or whose removal takes the
// last node of a rack a job spreads over, stay, with a refusal that says which and why.
func TestDecideSafety(t *testing.T) {
	p := Policy{Min: 1, Max: 5, IdleBelow: 0.5, IdleFor: cluster.Duration(time.Minute)}
	t0 := time.Unix(1e9, 0)
	for _, tc := range []struct {
		name   string
		nodes  []Node
		kind   string
		reason string
	}{
		{"fits", nodes(2, 1), Remove, "a2 idle"},
		{"does not fit", nodes(4, 1), Refuse, "its 1 workers would not fit on the other nodes (0 free slots)"},
		{"last node of a rack a job spreads over", func() []Node {
			n := nodes(1, 1) // a1 in r1, a2 in r2
			n[1].Jobs = map[string][]string{"wc": {cluster.DomainRack}}
			return n
		}(), Refuse, "job wc spreads over racks and dc-a/r2 would have no other node"},
		{"another node of the rack stays", func() []Node {
			n := nodes(1, 1, 1) // a1 r1, a2 r2, a3 r1
			n[2].Jobs = map[string][]string{"wc": {cluster.DomainDC, cluster.DomainRack}}
			return n
		}(), Remove, "a3 idle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			_ = Decide(p, &st, Observation{Now: t0, Nodes: tc.nodes, SlotsPerNode: 4})
			d := Decide(p, &st, Observation{Now: t0.Add(2 * time.Minute), Nodes: tc.nodes, SlotsPerNode: 4})
			if d.Kind != tc.kind || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("%s: %q, want %s: %q", d.Kind, d.Reason, tc.kind, tc.reason)
			}
		})
	}
}

func TestForRoom(t *testing.T) {
	for reason, want := range map[string]bool{
		"0 of 3 nodes fit: no free slot (3)":                                            true,
		"0 of 4 nodes fit: not enough memory (2), maxPerNode 1 reached (2)":             true,
		"0 of 3 nodes fit: no free slot (2), node draining (1)":                         true,
		"0 of 3 nodes fit: no free slot (1), missing label disk=ssd (2)":                false,
		"0 of 2 nodes fit: outside tenant gold's pool (1), no free slot (1)":            false,
		"no node in data center dc-z":                                                   false,
		"tenant t1 is over quota":                                                       false,
		"0 of 5 nodes fit: not enough cpu (5)":                                          true,
		"0 of 1 nodes fit: avoided after crash loops (1)":                               false,
		"0 of 3 nodes fit: slots throttled (3)":                                         false,
		"0 of 3 nodes fit: node unschedulable (1), no free slot (2)":                    false,
		"waiting for node n3 (lost 2s ago) to come back: its workers stay put":          false,
		"0 of 3 nodes fit: no free slot (3), not in link dc dc-b (1)":                   false,
		"0 of 2 nodes fit: dc not allowed (1), no free slot (1)":                        false,
		"0 of 2 nodes fit: pool of another tenant (1), not enough memory (1)":           false,
		"0 of 6 nodes fit: not enough memory (3), not enough cpu (2), no free slot (1)": true,
	} {
		if got := ForRoom(reason); got != want {
			t.Errorf("ForRoom(%q) = %v, want %v", reason, got, want)
		}
	}
}

func TestPolicy(t *testing.T) {
	if _, err := ParsePolicy([]byte("min: 3\nmax: 2\nidleBelow: 1.5\n")); err == nil || !strings.Contains(err.Error(), "max 2 must be at least min 3") || !strings.Contains(err.Error(), "idleBelow") {
		t.Errorf("bad policy: %v", err)
	}
	if _, err := ParsePolicy([]byte("min: 1\nmax: 2\nwhen: always\n")); err == nil || !strings.Contains(err.Error(), "when: unknown field") {
		t.Errorf("unknown field: %v", err)
	}
	p, err := ParsePolicy([]byte("min: 1\nmax: 3\ngrace: 10s\n"))
	if err != nil || p.WithDefaults().Grace.Std() != 10*time.Second || p.WithDefaults().IdleFor.Std() != DefaultIdleFor {
		t.Errorf("good policy: %+v, %v", p, err)
	}
}
