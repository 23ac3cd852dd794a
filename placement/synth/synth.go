// Package synth makes synthetic clusters and jobs: deterministic node sets and workloads
// for the placement engine's tests and benchmarks, and for `stormdock bench placement` and
// `stormdock bench cluster`, which ship it in the binary.
package synth

import (
	"fmt"
	"math/rand/v2"

	"github.com/stormdock/stormdock/cluster"
)

// Config describes a synthetic cluster and workload.
type Config struct {
	DCs          int // data centers
	RacksPerDC   int
	NodesPerRack int
	Slots        int // per node
	Memory       cluster.Bytes
	CPU          cluster.CPU
	Jobs         int
	Workers      int // over all jobs
	Spread       []string
	Seed         uint64
}

// Default is the acceptance scenario: 10,000 nodes (4 dcs x 25 racks x 100 nodes, 16 slots
// each) and 1,000 jobs totalling 100,000 workers spread over dc and rack.
func Default() Config {
	return Config{DCs: 4, RacksPerDC: 25, NodesPerRack: 100, Slots: 16, Memory: 64 << 30, CPU: 32000,
		Jobs: 1000, Workers: 100000, Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: 1}
}

// Nodes returns the cluster, every node empty and healthy.
func (c Config) Nodes() []cluster.Node {
	nodes := make([]cluster.Node, 0, c.DCs*c.RacksPerDC*c.NodesPerRack)
	for d := range c.DCs {
		for r := range c.RacksPerDC {
			for n := range c.NodesPerRack {
				nodes = append(nodes, cluster.Node{
					ID: NodeID(d, r, n), DC: DCName(d), Rack: RackName(r),
					Slots: c.Slots, Memory: c.Memory, CPU: c.CPU,
				})
			}
		}
	}
	return nodes
}

// DCName, RackName and NodeID name the synthetic domains.
func DCName(d int) string       { return fmt.Sprintf("dc-%d", d) }
func RackName(r int) string     { return fmt.Sprintf("r%03d", r) }
func NodeID(d, r, n int) string { return fmt.Sprintf("dc%d-r%03d-n%04d", d, r, n) }

// JobSpecs returns Jobs jobs whose sizes vary around the mean and add up to Workers, with
// mixed memory, cpu and priorities. It is deterministic for a given Seed.
func (c Config) JobSpecs() []cluster.JobSpec {
	rng := rand.New(rand.NewPCG(c.Seed, 0x5707d0c))
	sizes := make([]int, c.Jobs)
	left := c.Workers
	for i := range sizes {
		jobsLeft := c.Jobs - i
		mean := left / jobsLeft
		if jobsLeft == 1 || mean < 2 {
			sizes[i] = mean
		} else {
			sizes[i] = mean/2 + rng.IntN(mean+1) // mean/2 .. 3mean/2
		}
		sizes[i] = max(1, min(sizes[i], left-(jobsLeft-1), cluster.MaxWorkersPerJob))
		left -= sizes[i]
	}
	mems := []cluster.Bytes{256 << 20, 512 << 20, 1 << 30, 2 << 30}
	cpus := []cluster.CPU{250, 500, 1000, 2000}
	jobs := make([]cluster.JobSpec, c.Jobs)
	for i := range jobs {
		jobs[i] = cluster.JobSpec{
			Name:      fmt.Sprintf("job-%05d", i),
			Tenant:    fmt.Sprintf("team-%d", i%7),
			Workers:   sizes[i],
			Resources: cluster.Resources{Memory: mems[rng.IntN(len(mems))], CPU: cpus[rng.IntN(len(cpus))]},
			Command:   []string{"stormdock", "worker"},
			Placement: cluster.PlacementSpec{Spread: c.Spread},
			Priority:  rng.IntN(cluster.MaxPriority + 1),
		}
	}
	return jobs
}
