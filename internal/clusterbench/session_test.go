package clusterbench

import (
	"fmt"
	"testing"

	"github.com/stormdock/stormdock/cluster"
)

// TestGroups: nodes share a session only with nodes of their own rack, at most per of them,
// and every node is in exactly one group: the loss of a rack closes its sessions and no other.
func TestGroups(t *testing.T) {
	var nodes []cluster.Node
	for d := range 2 {
		for r := range 3 {
			for n := range 5 {
				nodes = append(nodes, cluster.Node{ID: fmt.Sprintf("n%d-%d-%d", d, r, n), DC: fmt.Sprint(d), Rack: fmt.Sprint(r)})
			}
		}
	}
	// Racks of uneven size, in an order that interleaves them.
	nodes = append(nodes, cluster.Node{ID: "x", DC: "0", Rack: "1"}, cluster.Node{ID: "y", DC: "1", Rack: "2"})
	for _, tc := range []struct{ per, want int }{{0, 32}, {1, 32}, {2, 6 * 3}, {5, 6 + 2}, {10, 6}} {
		t.Run(fmt.Sprint(tc.per), func(t *testing.T) {
			gs := groups(nodes, tc.per)
			if len(gs) != tc.want {
				t.Errorf("%d groups, want %d", len(gs), tc.want)
			}
			seen := map[int]int{}
			for _, g := range gs {
				if len(g) == 0 || len(g) > max(tc.per, 1) {
					t.Errorf("a group of %d nodes", len(g))
				}
				for _, i := range g {
					seen[i]++
					if a, b := nodes[i], nodes[g[0]]; a.DC != b.DC || a.Rack != b.Rack {
						t.Errorf("%s and %s share a session across racks", a.ID, b.ID)
					}
				}
			}
			for i := range nodes {
				if seen[i] != 1 {
					t.Errorf("node %s in %d groups", nodes[i].ID, seen[i])
				}
			}
		})
	}
}
