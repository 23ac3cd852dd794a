package master

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/placement/synth"
)

// BenchmarkSnapshotJobList is what one published state costs to count and read: its
// tally (the leader makes it as it publishes) and pollers clients at once, each reading
// every job's summary (job list) and one job's workers' nodes (job status), from a state of
// nodes nodes with 10 running workers each in jobs of 100, as `stormdock bench cluster` lays
// them out. The leader publishes a new state at every reconcile, about once a second at ten
// thousand nodes:
//
//	go test -run '^$' -bench SnapshotJobList -count 5 ./master/
func BenchmarkSnapshotJobList(b *testing.B) {
	for _, nodes := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			st, jobs := benchSnapshot(nodes)
			const pollers = 10
			for b.Loop() {
				fresh := &Snapshot{v: st.v, assigns: st.assigns, unplaced: st.unplaced, why: st.why}
				var wg sync.WaitGroup
				for p := range pollers {
					wg.Go(func() {
						for _, j := range jobs {
							_ = fresh.Summary(j)
						}
						_ = fresh.Assigned(jobs[p].rec.Spec.Name)
					})
				}
				wg.Wait()
			}
		})
	}
}

// benchSnapshot is a state of nodes nodes of 4 dcs x 25 racks with 10 workers each, every
// worker running where it is assigned, and its jobs in name order.
func benchSnapshot(nodes int) (*Snapshot, []Job) {
	sc := synth.Config{DCs: 4, RacksPerDC: 25, NodesPerRack: nodes / 100, Slots: 16,
		Memory: 64 << 30, CPU: 32000, Jobs: nodes / 10, Workers: nodes * 10, Seed: 1}
	v := newView(sc.Jobs, nodes, 0, 0)
	var keys []cluster.WorkerKey
	for _, spec := range sc.JobSpecs() {
		v.jobs[spec.Name] = Job{rec: cluster.JobRecord{Spec: spec, State: cluster.JobRunning, Generation: 1}, version: 1}
		keys = append(keys, spec.Keys()...)
	}
	ns := sc.Nodes()
	per := make(map[string][]cluster.WorkerKey, len(ns))
	for i, k := range keys {
		id := ns[i%len(ns)].ID
		per[id] = append(per[id], k)
	}
	assigns := make(map[string]cluster.NodeAssignment, len(ns))
	for _, n := range ns {
		a := cluster.NodeAssignment{Node: n.ID, DC: n.DC, Rack: n.Rack}
		rec := cluster.NodeRecord{Node: n}
		for _, k := range per[n.ID] {
			a.Workers = append(a.Workers, cluster.WorkerAssignment{Key: k, Generation: 1, Workers: 100})
			rec.Workers = append(rec.Workers, cluster.WorkerStatus{Key: k, Generation: 1, State: cluster.WorkerRunning})
		}
		assigns[n.ID] = a
		v.addNode(n.ID, 1, rec)
	}
	jobs := make([]Job, 0, len(v.jobs))
	for _, name := range slices.Sorted(maps.Keys(v.jobs)) {
		jobs = append(jobs, v.jobs[name])
	}
	return &Snapshot{v: v, assigns: assigns, unplaced: map[cluster.WorkerKey]string{}}, jobs
}
