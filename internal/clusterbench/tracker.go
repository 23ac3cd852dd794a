package clusterbench

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// tracker follows every simulated agent's assignments and acknowledgements (sim.Events):
// where each worker is assigned, where it runs as far as the store knows, and how often it
// was started. It is the benchmark's clock: the time of the event that completed a phase is
// the latest of its workers' times, not when a poll noticed.
type tracker struct {
	mu         sync.Mutex
	byNode     map[string][]cluster.WorkerKey // each node's stamped assignment
	assignedTo map[cluster.WorkerKey]string
	assignedAt map[cluster.WorkerKey]time.Time
	runningOn  map[cluster.WorkerKey]string
	ackedAt    map[cluster.WorkerKey]time.Time
	acks       map[cluster.WorkerKey]int // starts reported, over the run
	dead       map[string]bool           // closed nodes: their late events are dropped
}

func newTracker() *tracker {
	return &tracker{byNode: map[string][]cluster.WorkerKey{}, assignedTo: map[cluster.WorkerKey]string{},
		assignedAt: map[cluster.WorkerKey]time.Time{}, runningOn: map[cluster.WorkerKey]string{},
		ackedAt: map[cluster.WorkerKey]time.Time{}, acks: map[cluster.WorkerKey]int{}, dead: map[string]bool{}}
}

// Assigned implements sim.Events.
func (t *tracker) Assigned(node string, keys []cluster.WorkerKey) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead[node] {
		return
	}
	for _, k := range t.byNode[node] {
		if slices.Contains(keys, k) {
			continue
		}
		if t.assignedTo[k] == node {
			delete(t.assignedTo, k)
		}
		if t.runningOn[k] == node {
			delete(t.runningOn, k)
		}
	}
	for _, k := range keys {
		if t.assignedTo[k] != node {
			t.assignedTo[k], t.assignedAt[k] = node, now
		}
	}
	t.byNode[node] = slices.Clone(keys)
}

// Acked implements sim.Events.
func (t *tracker) Acked(node string, keys []cluster.WorkerKey) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead[node] {
		return
	}
	for _, k := range keys {
		t.runningOn[k], t.ackedAt[k] = node, now
		t.acks[k]++
	}
}

// kill drops closed nodes: their workers are neither assigned nor running any more.
func (t *tracker) kill(nodes []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range nodes {
		t.dead[n] = true
		for _, k := range t.byNode[n] {
			if t.assignedTo[k] == n {
				delete(t.assignedTo, k)
			}
			if t.runningOn[k] == n {
				delete(t.runningOn, k)
			}
		}
		delete(t.byNode, n)
	}
}

// progress counts keys assigned to a live node, and those also acknowledged there.
func (t *tracker) progress(keys []cluster.WorkerKey) (assigned, acked int, lastAssigned, lastAcked time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		node, ok := t.assignedTo[k]
		if !ok {
			continue
		}
		assigned++
		lastAssigned = later(lastAssigned, t.assignedAt[k])
		if t.runningOn[k] == node {
			acked++
			lastAcked = later(lastAcked, t.ackedAt[k])
		}
	}
	return assigned, acked, lastAssigned, lastAcked
}

// snapshot copies where every worker is assigned and how often each was started.
func (t *tracker) snapshot() (map[cluster.WorkerKey]string, map[cluster.WorkerKey]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.assignedTo), maps.Clone(t.acks)
}

// startedTwice counts workers started more than once over the run.
func (t *tracker) startedTwice() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.acks {
		if c > 1 {
			n++
		}
	}
	return n
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
