package placement_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
)

// iterations of each property test; every one is a different random cluster and workload.
const iterations = 400

func dump(in placement.Input) string {
	b, _ := json.Marshal(in)
	return string(b)
}

var allDCs = []string{"dc-a", "dc-b", "dc-c"}

// randomCluster makes a small, varied cluster: a few dcs, racks and nodes, some of them
// used, throttled, unschedulable, draining, labelled or dedicated to a tenant's pool.
func randomCluster(rng *rand.Rand) []cluster.Node {
	var nodes []cluster.Node
	dcs := 1 + rng.IntN(len(allDCs))
	for d := range dcs {
		racks := 1 + rng.IntN(3)
		for r := range racks {
			for i := range 1 + rng.IntN(4) {
				n := cluster.Node{
					ID: fmt.Sprintf("n-%d-%d-%d", d, r, i), DC: allDCs[d], Rack: fmt.Sprintf("r%d", r),
					Slots:  rng.IntN(7),
					Memory: cluster.Bytes(1+rng.IntN(8)) << 30,
					CPU:    cluster.CPU(1000 * (1 + rng.IntN(8))),
				}
				if rng.IntN(4) == 0 {
					n.Used = cluster.Usage{Slots: rng.IntN(3), Memory: cluster.Bytes(rng.IntN(2)) << 30, CPU: cluster.CPU(500 * rng.IntN(3))}
				}
				if rng.IntN(6) == 0 {
					n.Throttled = 1 + rng.IntN(3)
				}
				n.Unschedulable = rng.IntN(20) == 0
				n.Draining = rng.IntN(20) == 0
				switch rng.IntN(3) {
				case 0:
					n.Labels = map[string]string{"disk": "ssd"}
				case 1:
					n.Labels = map[string]string{"disk": "hdd", "gpu": "yes"}
				}
				switch rng.IntN(12) {
				case 0:
					n.Pool = "t1"
				case 1:
					n.Pool = "t9" // a tenant with no jobs: its nodes stay empty
				}
				nodes = append(nodes, n)
			}
		}
	}
	return nodes
}

var spreads = [][]string{nil, {"dc"}, {"rack"}, {"node"}, {"dc", "rack"}, {"dc", "rack", "node"}, {"rack", "node"}, {"dc", "node"}}

// randomJobs makes a few valid jobs with mixed demands, constraints and priorities.
func randomJobs(rng *rand.Rand) []cluster.JobSpec {
	jobs := make([]cluster.JobSpec, 1+rng.IntN(6))
	for i := range jobs {
		j := cluster.JobSpec{
			Name: fmt.Sprintf("job-%d", i), Tenant: fmt.Sprintf("t%d", rng.IntN(3)),
			Workers:   1 + rng.IntN(12),
			Resources: cluster.Resources{Memory: cluster.Bytes(256<<20) << rng.IntN(4), CPU: cluster.CPU(250 << rng.IntN(4))},
			Command:   []string{"x"},
			Priority:  100 * rng.IntN(4),
		}
		j.Placement.Spread = spreads[rng.IntN(len(spreads))]
		if rng.IntN(3) == 0 {
			j.Placement.MaxPerNode = 1 + rng.IntN(3)
		}
		if rng.IntN(4) == 0 {
			j.Placement.Strategy = cluster.StrategyBinpack
		}
		if rng.IntN(4) == 0 {
			j.Placement.NodeLabels = map[string]string{"disk": "ssd"}
		}
		switch rng.IntN(6) {
		case 0:
			j.Placement.DCs = []string{"dc-a", "dc-c"}
		case 1:
			j.Placement.DCs = []string{"dc-z"} // exists nowhere
		case 2:
			j.Links, j.Output = []string{"dc-a", "dc-b"}, "file:///tmp/out"
		}
		if err := j.Validate(); err != nil {
			panic(err)
		}
		jobs[i] = j
	}
	return jobs
}

// randomCurrent places some workers at random, as a previous plan on another cluster
// might have: some on lost nodes, some of removed jobs or past the worker count.
func randomCurrent(rng *rand.Rand, nodes []cluster.Node, jobs []cluster.JobSpec) []cluster.Placement {
	var cur []cluster.Placement
	for _, j := range jobs {
		for _, k := range j.Keys() {
			if rng.IntN(3) == 0 || len(nodes) == 0 {
				continue
			}
			node := nodes[rng.IntN(len(nodes))].ID
			if rng.IntN(15) == 0 {
				node = "gone"
			}
			cur = append(cur, cluster.Placement{Job: k.Job, Link: k.Link, Worker: k.Worker, Node: node})
		}
	}
	if rng.IntN(3) == 0 && len(nodes) > 0 {
		cur = append(cur, cluster.Placement{Job: "old-job", Worker: 0, Node: nodes[0].ID})
		k := jobs[0].Keys()[0]
		cur = append(cur, cluster.Placement{Job: k.Job, Link: k.Link, Worker: 999, Node: nodes[0].ID})
	}
	return cur
}

func plan(t *testing.T, in placement.Input) *placement.Result {
	t.Helper()
	r, err := placement.Plan(in)
	if err != nil {
		t.Fatalf("Plan: %v\ninput: %s", err, dump(in))
	}
	return r
}

func TestPropertyFreshPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range iterations {
		in := placement.Input{Nodes: randomCluster(rng), Jobs: randomJobs(rng)}
		r := plan(t, in)
		verify(t, in, r, true)
		if len(r.Moves) != 0 {
			t.Fatalf("a fresh plan has moves: %v", r.Moves)
		}
	}
}

func TestPropertyFromCurrent(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range iterations {
		nodes, jobs := randomCluster(rng), randomJobs(rng)
		in := placement.Input{Nodes: nodes, Jobs: jobs, Current: randomCurrent(rng, nodes, jobs)}
		verify(t, in, plan(t, in), false)
	}
}

// Re-planning a plan's own output changes nothing.
func TestPropertyReplanIsStable(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range iterations {
		nodes, jobs := randomCluster(rng), randomJobs(rng)
		in := placement.Input{Nodes: nodes, Jobs: jobs, Current: randomCurrent(rng, nodes, jobs)}
		r := plan(t, in)
		in2 := placement.Input{Nodes: nodes, Jobs: jobs, Current: r.Placements}
		r2 := plan(t, in2)
		verify(t, in2, r2, false)
		if len(r2.Moves) != 0 || !reflect.DeepEqual(r.Placements, r2.Placements) || !reflect.DeepEqual(r.Unplaced, r2.Unplaced) {
			t.Fatalf("re-plan changed the plan: moves %v\ninput: %s", r2.Moves, dump(in2))
		}
	}
}

// The same input in another order gives the same plan.
func TestPropertyDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range iterations {
		nodes, jobs := randomCluster(rng), randomJobs(rng)
		in := placement.Input{Nodes: nodes, Jobs: jobs, Current: randomCurrent(rng, nodes, jobs)}
		r := plan(t, in)
		sh := placement.Input{Nodes: slices.Clone(nodes), Jobs: slices.Clone(jobs), Current: slices.Clone(in.Current)}
		rng.Shuffle(len(sh.Nodes), func(i, j int) { sh.Nodes[i], sh.Nodes[j] = sh.Nodes[j], sh.Nodes[i] })
		rng.Shuffle(len(sh.Jobs), func(i, j int) { sh.Jobs[i], sh.Jobs[j] = sh.Jobs[j], sh.Jobs[i] })
		rng.Shuffle(len(sh.Current), func(i, j int) { sh.Current[i], sh.Current[j] = sh.Current[j], sh.Current[i] })
		if r2 := plan(t, sh); !reflect.DeepEqual(r, r2) {
			t.Fatalf("shuffled input gave another plan\ninput: %s", dump(in))
		}
	}
}

// checkOnlyMoves checks that every move is either allowed by ok or a preemption by a job
// of higher priority than the moved worker's (capacity being short).
func checkOnlyMoves(t *testing.T, in placement.Input, r *placement.Result, what string, ok func(placement.Move) bool) {
	t.Helper()
	prio := map[string]int{}
	for _, j := range in.Jobs {
		prio[j.Name] = j.Priority
	}
	for _, m := range r.Moves {
		if ok(m) {
			continue
		}
		by, preempted := strings.CutPrefix(m.Reason, "preempted by job ")
		by, _, _ = strings.Cut(by, " ")
		if !preempted || prio[by] <= prio[m.Job] {
			t.Fatalf("%s: unexpected move %+v\ninput: %s", what, m, dump(in))
		}
	}
}

// Losing or draining a node, or losing a rack, moves only the workers that were there.
func TestPropertyLostAndDrainedNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range iterations {
		nodes, jobs := randomCluster(rng), randomJobs(rng)
		r := plan(t, placement.Input{Nodes: nodes, Jobs: jobs})
		pick := nodes[rng.IntN(len(nodes))]
		wholeRack := rng.IntN(2) == 0
		victim := map[string]bool{}
		var rest []cluster.Node
		drained := slices.Clone(nodes)
		for i, n := range nodes {
			if n.ID == pick.ID || (wholeRack && n.DC == pick.DC && n.Rack == pick.Rack) {
				victim[n.ID] = true
				drained[i].Draining = true
			} else {
				rest = append(rest, n)
			}
		}
		onVictim := 0
		for _, p := range r.Placements {
			if victim[p.Node] {
				onVictim++
			}
		}
		for _, nodes := range [][]cluster.Node{rest, drained} {
			in := placement.Input{Nodes: nodes, Jobs: jobs, Current: r.Placements}
			r2 := plan(t, in)
			verify(t, in, r2, false)
			from := 0
			checkOnlyMoves(t, in, r2, fmt.Sprintf("nodes %v lost or drained", victim), func(m placement.Move) bool {
				if victim[m.From] {
					from++
					return !victim[m.To]
				}
				return false
			})
			if from != onVictim {
				t.Fatalf("%d of the %d workers on %v moved", from, onVictim, victim)
			}
		}
	}
}

// Scaling a job out adds only its new workers; scaling it in stops only its surplus.
func TestPropertyScale(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for range iterations {
		nodes, jobs := randomCluster(rng), randomJobs(rng)
		r := plan(t, placement.Input{Nodes: nodes, Jobs: jobs})
		k := rng.IntN(len(jobs))
		was := jobs[k].Workers

		out := slices.Clone(jobs)
		out[k].Workers = was + 1 + rng.IntN(6)
		in := placement.Input{Nodes: nodes, Jobs: out, Current: r.Placements}
		r2 := plan(t, in)
		verify(t, in, r2, false)
		checkOnlyMoves(t, in, r2, "scale out", func(placement.Move) bool { return false })

		if was == 1 {
			continue
		}
		scaled := slices.Clone(jobs)
		scaled[k].Workers = 1 + rng.IntN(was-1)
		in = placement.Input{Nodes: nodes, Jobs: scaled, Current: r.Placements}
		r3 := plan(t, in)
		verify(t, in, r3, false)
		// Freed room may also let a higher-priority worker that had none preempt.
		removed := 0
		checkOnlyMoves(t, in, r3, "scale in", func(m placement.Move) bool {
			if m.Job == scaled[k].Name && m.Worker >= scaled[k].Workers && m.To == "" && m.Reason == "scaled in" {
				removed++
				return true
			}
			return false
		})
		placedSurplus := 0
		for _, p := range r.Placements {
			if p.Job == scaled[k].Name && p.Worker >= scaled[k].Workers {
				placedSurplus++
			}
		}
		if removed != placedSurplus {
			t.Fatalf("scale in stopped %d workers, want %d", removed, placedSurplus)
		}
	}
}
