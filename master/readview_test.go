package master

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stormdock/stormdock/cluster"
)

// TestSummaryCountsAsSummarize: the summaries a state tallies in one pass over its nodes
// are those summarize counts job by job, over random states: workers assigned, stopping,
// unassigned or unplaced; reported by the node they are assigned to, by another (a copy
// left behind) or by none; beyond a job's spec (scaled in, a link dropped); jobs running or
// killed. Each worker is reported running by one node at most: where two report it running,
// summarize counts the copy the view met first, and the tally the one on its node (see
// TestSummaryRunningOnItsNode).
func TestSummaryCountsAsSummarize(t *testing.T) {
	states := []string{cluster.WorkerRunning, cluster.WorkerStarting, cluster.WorkerBackoff, cluster.WorkerStopping, cluster.WorkerEvicted}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		v := newView(0, 0, 0, 0)
		var keys []cluster.WorkerKey
		for j := range 1 + rng.IntN(5) {
			spec := cluster.JobSpec{Name: fmt.Sprintf("job-%d", j), Workers: 1 + rng.IntN(6)}
			if rng.IntN(3) == 0 {
				spec.Links = []string{"a", "b"}[:1+rng.IntN(2)]
			}
			rec := cluster.JobRecord{Spec: spec, State: cluster.JobRunning}
			if rng.IntN(5) == 0 {
				rec.State = cluster.JobKilled
			}
			v.jobs[spec.Name] = Job{rec: rec, version: 1}
			// Workers the spec no longer has: scaled in, or of a link dropped.
			wide := spec
			wide.Workers += 2
			if wide.Mirrored() {
				wide.Links = []string{"a", "b", "c"}
			}
			keys = append(keys, wide.Keys()...)
		}
		nodes := []string{"n1", "n2", "n3", "n4"}
		assigns := map[string]cluster.NodeAssignment{}
		reports := map[string][]cluster.WorkerStatus{}
		unplaced := map[cluster.WorkerKey]string{}
		for _, k := range keys {
			node := nodes[rng.IntN(len(nodes))]
			switch rng.IntN(5) {
			case 0: // unassigned
			case 1:
				unplaced[k] = "no node fits"
			default:
				a := assigns[node]
				a.Workers = append(a.Workers, cluster.WorkerAssignment{Key: k, Stop: rng.IntN(6) == 0})
				assigns[node] = a
			}
			running := false
			for _, at := range nodes {
				if rng.IntN(3) != 0 {
					continue
				}
				s := states[rng.IntN(len(states))]
				if s == cluster.WorkerRunning {
					if running {
						s = cluster.WorkerStopping
					}
					running = true
				}
				reports[at] = append(reports[at], cluster.WorkerStatus{Key: k, State: s})
			}
		}
		for _, id := range nodes {
			v.addNode(id, 1, cluster.NodeRecord{Node: cluster.Node{ID: id}, Workers: reports[id]})
		}
		st := &Snapshot{v: v, assigns: assigns, unplaced: unplaced}
		all := st.allAssigned()
		for name, j := range v.jobs {
			got := st.Summary(j)
			want := summarize(v, j.rec, all, unplaced)
			if got != want {
				t.Fatalf("seed %d, job %s: tallied %+v, summarize counts %+v", seed, name, got, want)
			}
			if j.version++; st.Summary(j) != want {
				t.Fatalf("seed %d, job %s: a record newer than the state counted alone: %+v, want %+v", seed, name, st.Summary(j), want)
			}
		}
	}
}

// TestSummaryRunningOnItsNode: a worker runs where it is assigned, though a copy left on
// another node also reports running (until it is stopped, it is counted stopping).
func TestSummaryRunningOnItsNode(t *testing.T) {
	k := cluster.WorkerKey{Job: "j", Worker: 0}
	v := newView(0, 0, 0, 0)
	j := Job{rec: cluster.JobRecord{Spec: cluster.JobSpec{Name: "j", Workers: 1}, State: cluster.JobRunning}, version: 1}
	v.jobs["j"] = j
	v.addNode("old", 1, cluster.NodeRecord{Workers: []cluster.WorkerStatus{{Key: k, State: cluster.WorkerRunning}}})
	v.addNode("new", 1, cluster.NodeRecord{Workers: []cluster.WorkerStatus{{Key: k, State: cluster.WorkerRunning}}})
	st := &Snapshot{v: v, assigns: map[string]cluster.NodeAssignment{"new": {Workers: []cluster.WorkerAssignment{{Key: k}}}}}
	if s := st.Summary(j); s.Running != 1 || s.Stopping != 1 {
		t.Fatalf("running %d, stopping %d: want 1 running on its node and 1 stopping", s.Running, s.Stopping)
	}
}
