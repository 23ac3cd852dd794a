package placement_test

import (
	"strings"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
)

func TestAvoidMovesWorkersOffAndExplains(t *testing.T) {
	nodes := []cluster.Node{node("a", "dc", "r1", 4), node("b", "dc", "r2", 4)}
	j := job("j", 2)
	r := plan(t, placement.Input{Nodes: nodes, Jobs: []cluster.JobSpec{j}})
	cur := r.Placements
	bad := where(r)["j/0"]
	r = plan(t, placement.Input{Nodes: nodes, Jobs: []cluster.JobSpec{j}, Current: cur, Avoid: map[string][]string{"j": {bad}}})
	for _, p := range r.Placements {
		if p.Node == bad {
			t.Errorf("worker %s still on avoided node %s", p.Key(), bad)
		}
	}
	if len(r.Moves) != 1 || r.Moves[0].From != bad || r.Moves[0].Worker != 0 {
		t.Errorf("moves = %+v, want only worker 0 off %s", r.Moves, bad)
	}
	// Avoiding every node explains itself; other jobs are not affected.
	other := job("o", 1)
	r = plan(t, placement.Input{Nodes: nodes, Jobs: []cluster.JobSpec{j, other}, Avoid: map[string][]string{"j": {"a", "b"}}})
	if len(r.Unplaced) != 2 || !strings.Contains(r.Unplaced[0].Reason, "avoided after crash loops (2)") {
		t.Errorf("unplaced = %+v", r.Unplaced)
	}
	if len(perNode(r, "o")) != 1 {
		t.Errorf("job o not placed: %+v", r.Placements)
	}
}

func TestHoldKeepsWorkersOffNewNodes(t *testing.T) {
	nodes := []cluster.Node{node("a1", "dc-a", "r", 4), node("b1", "dc-b", "r", 4)}
	j := job("j", 4)
	j.Placement.Spread = []string{cluster.DomainDC}
	r := plan(t, placement.Input{Nodes: nodes, Jobs: []cluster.JobSpec{j}})
	cur := r.Placements
	// dc-a is lost; its workers are held instead of moved.
	hold := map[cluster.WorkerKey]string{}
	for _, p := range cur {
		if p.Node == "a1" {
			hold[p.Key()] = "waiting for room"
		}
	}
	// A held worker whose node is fine keeps it.
	var kept cluster.WorkerKey
	for _, p := range cur {
		if p.Node == "b1" {
			kept = p.Key()
			hold[kept] = "waiting for room"
			break
		}
	}
	r = plan(t, placement.Input{Nodes: nodes[1:], Jobs: []cluster.JobSpec{j}, Current: cur, Hold: hold})
	if len(r.Placements) != 2 || where(r)[kept.String()] != "b1" {
		t.Errorf("placements = %+v, want the two b1 workers kept", r.Placements)
	}
	if len(r.Unplaced) != 2 {
		t.Fatalf("unplaced = %+v, want the two held workers", r.Unplaced)
	}
	for _, u := range r.Unplaced {
		if u.Reason != "waiting for room" {
			t.Errorf("held worker %d reason %q", u.Worker, u.Reason)
		}
	}
	if r.Unplaced[0].Worker > r.Unplaced[1].Worker {
		t.Errorf("unplaced not sorted: %+v", r.Unplaced)
	}
}
