package master

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// recordingKV notes every operation of the transactions sent through it.
type recordingKV struct {
	coord.KV
	mu  sync.Mutex
	ops []coord.Op
}

func (k *recordingKV) Txn(ctx context.Context, ops ...coord.Op) ([]coord.OpResult, error) {
	k.mu.Lock()
	k.ops = append(k.ops, ops...)
	k.mu.Unlock()
	return k.KV.Txn(ctx, ops...)
}

// take returns the operations noted since the last take.
func (k *recordingKV) take() []coord.Op {
	k.mu.Lock()
	defer k.mu.Unlock()
	ops := k.ops
	k.ops = nil
	return ops
}

// newUnstarted makes a master on an embedded store of its own, with cfg's settings, and does
// not run it: the test drives its parts.
func newUnstarted(t *testing.T, cfg Config) (*coord.Embedded, *Master) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	store, err := srv.Connect(coord.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg.ID, cfg.Logger, cfg.Registry = "m1", quiet, prometheus.NewRegistry()
	m, err := New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store, m
}

// TestGoneNodeAssignmentRemovedNotEmptied: a node whose entry left the store (its session
// closed or expired) has its assignment removed once the plan's writes are out, and not
// emptied before them: no agent acts on it any more, and a data center's loss would
// otherwise write a quarter of the cluster's assignments before the first start. A node
// whose entry is in the store but unreadable has a live session whose agent may act on its
// assignment: that one is still emptied first, and kept.
func TestGoneNodeAssignmentRemovedNotEmptied(t *testing.T) {
	ctx := context.Background()
	store, m := newUnstarted(t, Config{})
	kv := &recordingKV{KV: store}
	r := &reconciler{m: m, kv: kv, assign: map[string]assignState{}}
	const gone, unreadable, live = "n-gone", "n-unreadable", "n-live"
	for i, node := range []string{gone, unreadable, live} {
		a := cluster.NodeAssignment{Node: node, Session: int64(i + 1), Workers: []cluster.WorkerAssignment{
			{Key: cluster.WorkerKey{Job: "wc", Worker: i}, Tenant: "search", Isolation: cluster.IsolationProcess, Command: []string{"true"}}}}
		b, _ := json.Marshal(a)
		key, _ := cluster.AssignmentKey(node)
		if _, err := store.Create(ctx, key, b, coord.Persistent); err != nil {
			t.Fatal(err)
		}
		if err := r.reload(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	v := newView(0, 2, 0, 0)
	v.addNode(live, 3, cluster.NodeRecord{Node: cluster.Node{ID: live}})
	v.unreadable[unreadable] = true
	// Every worker left its node: the plan wants nothing anywhere but an empty assignment
	// for the live node, as desired makes it.
	want := map[string]cluster.NodeAssignment{live: {Node: live, Session: 3}}

	if _, err := r.write(ctx, v, want); err != nil {
		t.Fatal(err)
	}
	ops := kv.take()
	keys := map[string]coord.Op{}
	for _, op := range ops {
		keys[op.Key] = op
	}
	goneKey, _ := cluster.AssignmentKey(gone)
	unreadableKey, _ := cluster.AssignmentKey(unreadable)
	liveKey, _ := cluster.AssignmentKey(live)
	if _, ok := keys[goneKey]; ok {
		t.Errorf("the gone node's assignment was written before the starts: %+v", keys[goneKey])
	}
	for _, k := range []string{unreadableKey, liveKey} {
		op, ok := keys[k]
		var a cluster.NodeAssignment
		if !ok || op.Kind != coord.OpPut || json.Unmarshal(op.Value, &a) != nil || len(a.Workers) != 0 {
			t.Errorf("%s: want an empty assignment written, got %+v (written: %v)", k, op, ok)
		}
	}

	if err := r.forgetLost(ctx, v, want); err != nil {
		t.Fatal(err)
	}
	ops = kv.take()
	if len(ops) != 1 || ops[0].Kind != coord.OpDelete || ops[0].Key != goneKey {
		t.Errorf("forgetLost sent %+v, want the gone node's assignment deleted alone", ops)
	}
	if _, err := store.Get(ctx, goneKey); err == nil {
		t.Errorf("the gone node's assignment is still stored")
	}
	for _, k := range []string{unreadableKey, liveKey} {
		if _, err := store.Get(ctx, k); err != nil {
			t.Errorf("%s: %v, want it kept", k, err)
		}
	}
	if got, want := slices.Sorted(maps.Keys(r.assign)), []string{live, unreadable}; !slices.Equal(got, want) {
		t.Errorf("the leader keeps assignments of %v, want %v", got, want)
	}
}

// TestAwaitBurst: after many nodes came or went, or many jobs changed, since the last
// reconcile (a data center's sessions closing one by one, a thousand jobs submitted
// together), planning waits until none has for five Debounces, and no longer than three
// MaxDebounces from the first change; after a few it does not wait. Node records' own
// changes never make a burst: they never stop.
func TestAwaitBurst(t *testing.T) {
	const debounce = time.Hour // a real sleep of it would never end: every sleep is the test's
	_, m := newUnstarted(t, Config{Debounce: debounce, MaxDebounce: 2 * debounce})
	// 1,000 nodes and 500 jobs: a burst is 20 nodes (one in 50), or 10 jobs.
	for i := range 1000 {
		m.nodes.entries[fmt.Sprintf("n%04d", i)] = coord.Entry{}
	}
	for i := range 500 {
		m.jobs.entries[fmt.Sprintf("j%04d", i)] = coord.Entry{}
	}
	type changes struct{ nodes, jobs, records int }
	change := func(c changes) {
		m.nodes.mu.Lock()
		m.nodes.members += uint64(c.nodes)
		m.nodes.gen += uint64(c.nodes + c.records)
		m.nodes.mu.Unlock()
		m.jobs.mu.Lock()
		m.jobs.gen += uint64(c.jobs)
		m.jobs.mu.Unlock()
	}
	for _, tc := range []struct {
		name    string
		before  changes       // since the last reconcile's view
		during  []changes     // during each sleep, in turn (then none)
		started time.Duration // how long ago the first change woke the loop
		sleeps  int
	}{
		{name: "a rack's worth, under a burst", before: changes{nodes: 19, jobs: 9}, during: []changes{{nodes: 5}}, sleeps: 0},
		{name: "node records changing", before: changes{records: 5000}, during: []changes{{records: 100}}, sleeps: 0},
		{name: "a data center, all seen", before: changes{nodes: 250}, sleeps: 1},
		{name: "a data center still leaving", before: changes{nodes: 100}, during: []changes{{nodes: 60}, {nodes: 60}, {nodes: 30}}, sleeps: 4},
		{name: "jobs still arriving", before: changes{jobs: 10}, during: []changes{{jobs: 300}, {jobs: 1}}, sleeps: 3},
		{name: "a burst ends though records change", before: changes{nodes: 100}, during: []changes{{records: 500}}, sleeps: 1},
		{name: "past the limit", before: changes{nodes: 250}, during: []changes{{nodes: 10}}, started: 3 * 2 * debounce, sleeps: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counts := m.burstCounts()
			change(tc.before)
			var slept []time.Duration
			sleep := func(ctx context.Context, d time.Duration) error {
				if len(slept) < len(tc.during) {
					change(tc.during[len(slept)])
				}
				slept = append(slept, d)
				if len(slept) > 100 {
					t.Fatal("still waiting after 100 quiet periods")
				}
				return nil
			}
			if err := m.awaitBurst(context.Background(), counts, time.Now().Add(-tc.started), sleep); err != nil {
				t.Fatal(err)
			}
			if len(slept) != tc.sleeps {
				t.Fatalf("slept %d times (%v), want %d", len(slept), slept, tc.sleeps)
			}
			for _, d := range slept {
				if d > 5*debounce || d < 5*debounce-time.Minute {
					t.Errorf("slept %v, want five Debounces (%v)", d, 5*debounce)
				}
			}
		})
	}
}
