package master_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/placement/synth"
)

// BenchmarkLeaderRackLoss is the leader's own cost of losing a rack at cluster scale, apart
// from ZooKeeper's: one master on the embedded store, in this process, with simulated agents
// (1s heartbeat) holding 10 workers per node of 16 slots over 4 dcs x 25 racks, as `stormdock
// bench cluster` lays them out. Each op closes one more rack's agents (1% of the nodes) and
// waits until every worker they held is assigned to a live node; it reports the leader's
// reconcile thread cpu per op (stormdock_master_reconcile_cpu_seconds_total), which is what
// the reconciles cost whatever the store, and once the submission's. The racks are not given
// back, so -benchtime is at most 20x:
//
//	go test -run '^$' -bench 'LeaderRackLoss/nodes=10000' -benchtime 5x -cpuprofile cpu.out ./master/
func BenchmarkLeaderRackLoss(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchRackLoss(b, n) })
	}
}

// placedAt hears the simulated agents: the node each worker was last assigned to.
type placedAt struct {
	mu sync.Mutex
	at map[cluster.WorkerKey]string
}

func (p *placedAt) Assigned(node string, workers []cluster.WorkerKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range workers {
		p.at[k] = node
	}
}

func (p *placedAt) Acked(string, []cluster.WorkerKey) {}

// count is how many of keys are placed on a node outside lost.
func (p *placedAt) count(keys []cluster.WorkerKey, lost map[string]bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, k := range keys {
		if node, ok := p.at[k]; ok && !lost[node] {
			n++
		}
	}
	return n
}

func benchRackLoss(b *testing.B, nodes int) {
	const dcs, racks, slots = 4, 25, 16
	sc := synth.Config{DCs: dcs, RacksPerDC: racks, NodesPerRack: nodes / (dcs * racks), Slots: slots,
		Memory: slots * 4 << 30, CPU: slots * 2000, Jobs: nodes / 10, Workers: nodes * 10,
		Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: 1}
	tc := clustertest.NewSim(b)
	tc.Beat, tc.Grace = time.Second, time.Second
	m, _, stop := tc.Master("m1", func(c *master.Config) { c.Debounce = 50 * time.Millisecond })
	placed := &placedAt{at: map[cluster.WorkerKey]string{}}
	clients := map[string]*coord.Embedded{}
	byRack := map[string][]string{}
	for _, n := range sc.Nodes() {
		clients[n.ID] = tc.Agent(n, sim.Config{Events: placed})
		byRack[n.DC+"/"+n.Rack] = append(byRack[n.DC+"/"+n.Rack], n.ID)
	}
	// The master stops before the agents do (cleanups run last first): it is not to re-plan
	// a cluster losing every node when the benchmark ends.
	b.Cleanup(stop)
	wait := testenv.Timeout(10 * time.Minute)
	testenv.Eventually(b, "the master sees every node", wait, func() bool { return len(m.MirrorView().Nodes()) == len(clients) })
	var keys []cluster.WorkerKey
	jobs := sc.JobSpecs()
	for t := range 7 {
		if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: fmt.Sprintf("team-%d", t), MaxPriority: cluster.MaxPriority}}); err != nil {
			b.Fatal(err)
		}
	}
	cpu0 := reconcileCPU(tc, m)
	for i := range jobs {
		jobs[i].Command = []string{"true"}
		keys = append(keys, jobs[i].Keys()...)
		if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, &jobs[i]); err != nil {
			b.Fatal(err)
		}
	}
	testenv.Eventually(b, "every worker assigned", wait, func() bool { return placed.count(keys, nil) == len(keys) })
	submitCPU := reconcileCPU(tc, m) - cpu0

	lost := map[string]bool{}
	var cpu, passes float64
	i := 0
	for b.Loop() {
		if i >= 20 {
			b.Fatal("20 racks lost: run with -benchtime 20x or fewer")
		}
		// A rack in each dc in turn, none lost twice.
		rack := synth.DCName(i%dcs) + "/" + synth.RackName(i/dcs)
		i++
		onRack := map[string]bool{}
		for _, id := range byRack[rack] {
			onRack[id] = true
		}
		var moving []cluster.WorkerKey
		placed.mu.Lock()
		for k, node := range placed.at {
			if onRack[node] {
				moving = append(moving, k)
			}
		}
		placed.mu.Unlock()
		before, n := reconcileCPU(tc, m), tc.Reconciles(m)
		for id := range onRack {
			lost[id] = true
			clients[id].Close()
		}
		testenv.Eventually(b, "the rack's workers assigned elsewhere", wait, func() bool {
			return placed.count(moving, lost) == len(moving)
		})
		cpu += reconcileCPU(tc, m) - before
		passes += tc.Reconciles(m) - n
	}
	b.ReportMetric(cpu*1000/float64(i), "reconcile-cpu-ms/op")
	b.ReportMetric(passes/float64(i), "reconciles/op")
	b.ReportMetric(submitCPU, "submit-cpu-s")
}

func reconcileCPU(tc *clustertest.Sim, m *master.Master) float64 {
	return testenv.Metric(tc.T, tc.Registry(m), "stormdock_master_reconcile_cpu_seconds_total", nil)
}
