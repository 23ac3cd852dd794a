package placement_test

import (
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement"
	"github.com/stormdock/stormdock/placement/synth"
)

// Run with GOMAXPROCS=1: go test -run '^$' -bench . -benchmem ./placement/

func benchFull(b *testing.B, c synth.Config) {
	nodes, jobs := c.Nodes(), c.JobSpecs()
	b.ReportAllocs()
	var r *placement.Result
	for b.Loop() {
		var err error
		r, err = placement.Plan(placement.Input{Nodes: nodes, Jobs: jobs})
		if err != nil {
			b.Fatal(err)
		}
	}
	if len(r.Unplaced) != 0 {
		b.Fatalf("%d workers unplaced: %s", len(r.Unplaced), r.Unplaced[0].Reason)
	}
	b.ReportMetric(float64(len(r.Placements))*float64(b.N)/b.Elapsed().Seconds(), "placements/s")
	skew, err := placement.MaxSkew(nodes, jobs, r.Placements)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(skew), "max-skew")
}

// BenchmarkPlanFull is the acceptance scenario: 10,000 nodes, 1,000 jobs, 100,000 workers.
func BenchmarkPlanFull(b *testing.B) { benchFull(b, synth.Default()) }

// BenchmarkPlanRackLost re-plans the full scenario after one rack is gone.
func BenchmarkPlanRackLost(b *testing.B) { benchRackLost(b, synth.Default()) }

// BenchmarkPlanMillionRackLost re-plans the million-worker scenario after one rack is gone.
func BenchmarkPlanMillionRackLost(b *testing.B) { benchRackLost(b, million()) }

func benchRackLost(b *testing.B, c synth.Config) {
	nodes, jobs := c.Nodes(), c.JobSpecs()
	full, err := placement.Plan(placement.Input{Nodes: nodes, Jobs: jobs})
	if err != nil {
		b.Fatal(err)
	}
	lostDC, lostRack := synth.DCName(1), synth.RackName(7)
	var left []cluster.Node
	lost := map[string]bool{}
	for _, n := range nodes {
		if n.DC == lostDC && n.Rack == lostRack {
			lost[n.ID] = true
		} else {
			left = append(left, n)
		}
	}
	onRack := 0
	for _, p := range full.Placements {
		if lost[p.Node] {
			onRack++
		}
	}
	in := placement.Input{Nodes: left, Jobs: jobs, Current: full.Placements}
	b.ReportAllocs()
	var r *placement.Result
	for b.Loop() {
		r, err = placement.Plan(in)
		if err != nil {
			b.Fatal(err)
		}
	}
	if len(r.Moves) != onRack {
		b.Fatalf("%d moves, want the %d workers of the lost rack", len(r.Moves), onRack)
	}
	for _, m := range r.Moves {
		if !lost[m.From] || m.To == "" {
			b.Fatalf("unexpected move %+v", m)
		}
	}
	b.ReportMetric(float64(onRack), "moved")
	skew, err := placement.MaxSkew(left, jobs, r.Placements)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(skew), "max-skew")
}

// BenchmarkPlanMillion places 1,000,000 workers of 10,000 jobs on 50,000 nodes of 32 slots.
func BenchmarkPlanMillion(b *testing.B) { benchFull(b, million()) }

func million() synth.Config {
	c := synth.Default()
	c.NodesPerRack, c.Slots, c.Memory, c.CPU = 500, 32, 128<<30, 64000
	c.Jobs, c.Workers = 10000, 1000000
	return c
}

// BenchmarkPlanOverloaded asks for 25% more workers than the cluster has slots, so many
// jobs are cut short and the preemption search runs for each of them.
func BenchmarkPlanOverloaded(b *testing.B) {
	c := synth.Default()
	c.Workers = 200000
	nodes, jobs := c.Nodes(), c.JobSpecs()
	b.ReportAllocs()
	var r *placement.Result
	for b.Loop() {
		var err error
		if r, err = placement.Plan(placement.Input{Nodes: nodes, Jobs: jobs}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(r.Placements)), "placed")
	b.ReportMetric(float64(len(r.Unplaced)), "unplaced")
}
