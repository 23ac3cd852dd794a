// Package agenttest checks that a node agent speaks the store protocol masters rely on. The
// real agent and the benchmarks' simulated one (package agents/sim) run the same checks.
package agenttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Opener opens a store client for the agent under test. The suite routes its connections
// through a dialer it can cut, to make the agent's session expire as a partition would.
type Opener func(ctx context.Context, opts coord.Options) (coord.Store, error)

// Subject is one agent implementation under test.
type Subject struct {
	// Start runs the agent of node, with every store client it needs opened through open.
	// The returned function stops the agent and closes its clients.
	Start func(t *testing.T, node cluster.Node, open Opener) (stop func())
	// Worker is an assignment of the worker key that the agent can run.
	Worker func(key cluster.WorkerKey) cluster.WorkerAssignment
	// Heartbeat is the agent's heartbeat: it writes its record at most once per heartbeat.
	Heartbeat time.Duration
	// SessionTimeout is the session timeout the agent's clients ask for.
	SessionTimeout time.Duration
}

// Run checks subject against a ZooKeeper server at zkAddr:
//
//   - it registers its node as a session-bound entry holding a NodeRecord;
//   - it acts only on an assignment stamped with the session owning that entry;
//   - it reports the assigned workers running, writing at most one record per heartbeat;
//   - when its session is lost its entry vanishes; it registers again under a new session,
//     does not act on the assignment stamped with the old one, and runs what the assignment
//     re-stamped with the new session lists;
//   - stopped, its entry vanishes.
func Run(t *testing.T, zkAddr string, s Subject) {
	t.Run("register-and-run", func(t *testing.T) {
		c := newCheck(t, zkAddr, s)
		owner := c.registered()
		a := c.keys("alpha", 3)
		// Stamped with another session: as one written before the master saw this one.
		c.assign(owner+1, a)
		c.noneOf("an assignment stamped with another session", a)
		c.assign(owner, a)
		c.running("the stamped assignment's workers", a)
		c.stop()
		c.gone("the stopped agent's node entry")
	})
	t.Run("session-loss", func(t *testing.T) {
		c := newCheck(t, zkAddr, s)
		old := c.registered()
		a := c.keys("alpha", 2)
		c.assign(old, a)
		c.running("the stamped assignment's workers", a)

		c.part.Cut()
		c.gone("the node entry of the lost session")
		c.part.Heal()
		now := c.reregistered(old)

		// The master has not seen the new session: the assignment it holds is stamped with
		// the old one, and lists other workers. The agent must start none of them.
		b := c.keys("beta", 2)
		c.assign(old, b)
		c.noneOf("an assignment stamped with the lost session", b)
		c.assign(now, b)
		c.running("the re-stamped assignment's workers, and only those", b)
		c.stop()
		c.gone("the stopped agent's node entry")
	})
}

// check is one run of an agent against its own chroot.
type check struct {
	t     *testing.T
	s     Subject
	node  cluster.Node
	store coord.Store // the suite's own client, as a master's
	part  *zktest.Partition
	stopF func()
	ctx   context.Context
}

func newCheck(t *testing.T, zkAddr string, s Subject) *check {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	url := fmt.Sprintf("zk://%s/stormdock-agenttest/%s-%x", zkAddr, name, rand.Uint64())
	octx, ocancel := context.WithTimeout(ctx, testenv.Timeout(20*time.Second))
	defer ocancel()
	store, err := coord.Open(octx, url, coord.Options{SessionTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := coord.DeleteTree(dctx, store, "/"); err != nil {
			t.Logf("cleanup: %v", err)
		}
		store.Close()
	})
	for _, k := range []string{cluster.NodesKey, cluster.AssignmentsKey} {
		if _, err := store.Create(octx, k, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
			t.Fatal(err)
		}
	}
	c := &check{t: t, s: s, store: store, part: &zktest.Partition{}, ctx: ctx,
		node: cluster.Node{ID: "conformance-1", Host: "host-1", DC: "dc-a", Rack: "r1", Slots: 8, Memory: 8 << 30, CPU: 8000}}
	open := func(ctx context.Context, opts coord.Options) (coord.Store, error) {
		opts.Dialer = c.part.Dial
		return coord.Open(ctx, url, opts)
	}
	stop := s.Start(t, c.node, open)
	c.stopF = stop
	t.Cleanup(c.stop)
	return c
}

func (c *check) stop() {
	if c.stopF != nil {
		c.stopF()
		c.stopF = nil
	}
}

func (c *check) keys(job string, n int) []cluster.WorkerKey {
	out := make([]cluster.WorkerKey, n)
	for i := range out {
		out[i] = cluster.WorkerKey{Job: job, Worker: i}
	}
	return out
}

// entry reads the node's entry and record; ok is false while there is none.
func (c *check) entry() (coord.Entry, cluster.NodeRecord, bool) {
	c.t.Helper()
	key, _ := cluster.NodeKey(c.node.ID)
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	e, err := c.store.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return e, cluster.NodeRecord{}, false
	}
	if err != nil {
		c.t.Fatalf("read node entry: %v", err)
	}
	var rec cluster.NodeRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		c.t.Fatalf("node record is not a NodeRecord: %v\n%s", err, e.Value)
	}
	return e, rec, true
}

// registered waits for the node's entry and checks it; it returns the owning session.
func (c *check) registered() int64 {
	c.t.Helper()
	var e coord.Entry
	var rec cluster.NodeRecord
	testenv.EventuallyWith(c.t, "the node's entry", 20*time.Second, func() (bool, string) {
		var ok bool
		e, rec, ok = c.entry()
		return ok, "no entry"
	})
	if !e.Ephemeral() {
		c.t.Fatalf("node entry is not session-bound (owner 0)")
	}
	if rec.Node.ID != c.node.ID || rec.Node.DC != c.node.DC || rec.Node.Rack != c.node.Rack || rec.Node.Slots != c.node.Slots {
		c.t.Fatalf("record's node = %+v, want %+v", rec.Node, c.node)
	}
	if rec.Agent == "" {
		c.t.Errorf("record names no agent instance")
	}
	mode := c.s.Worker(cluster.WorkerKey{Job: "x"}).Isolation
	if rec.Node.Labels["isolation/"+mode] != "true" || !slices.Contains(rec.Isolation, mode) {
		c.t.Errorf("record does not offer isolation %q: labels %v, isolation %v", mode, rec.Node.Labels, rec.Isolation)
	}
	return e.Owner
}

// reregistered waits for the node's entry under a session other than old.
func (c *check) reregistered(old int64) int64 {
	c.t.Helper()
	var owner int64
	testenv.EventuallyWith(c.t, "the node registered under a new session", 30*time.Second, func() (bool, string) {
		e, _, ok := c.entry()
		owner = e.Owner
		return ok && e.Owner != 0 && e.Owner != old, fmt.Sprintf("entry present %v, owner %x", ok, e.Owner)
	})
	return owner
}

// gone waits until the node's entry is gone.
func (c *check) gone(what string) {
	c.t.Helper()
	testenv.Eventually(c.t, what+" gone", 30*time.Second, func() bool {
		_, _, ok := c.entry()
		return !ok
	})
}

// assign writes the node's assignment of keys, stamped with session, as the master does.
func (c *check) assign(session int64, keys []cluster.WorkerKey) {
	c.t.Helper()
	a := cluster.NodeAssignment{Node: c.node.ID, DC: c.node.DC, Rack: c.node.Rack, Session: session, Workers: []cluster.WorkerAssignment{}}
	for _, k := range keys {
		a.Workers = append(a.Workers, c.s.Worker(k))
	}
	b, err := json.Marshal(a)
	if err != nil {
		c.t.Fatal(err)
	}
	key, _ := cluster.AssignmentKey(c.node.ID)
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if _, err := c.store.Put(ctx, key, b, coord.AnyVersion); err != nil {
		c.t.Fatal(err)
	}
}

// noneOf asserts, for a few heartbeats, that the agent reports none of keys.
func (c *check) noneOf(what string, keys []cluster.WorkerKey) {
	c.t.Helper()
	testenv.AssertUntil(c.t, "no worker of "+what, 5*c.s.Heartbeat+time.Second, func() (bool, string) {
		_, rec, _ := c.entry()
		for _, w := range rec.Workers {
			if slices.Contains(keys, w.Key) {
				return false, fmt.Sprintf("record reports %s (%s)", w.Key, w.State)
			}
		}
		return true, ""
	})
}

// running waits until the record reports exactly keys, all running, and checks that the
// agent wrote at most one record per heartbeat meanwhile.
func (c *check) running(what string, keys []cluster.WorkerKey) {
	c.t.Helper()
	start, _, _ := c.entry()
	began := time.Now()
	var last cluster.NodeRecord
	var e coord.Entry
	testenv.EventuallyWith(c.t, what+" running", 30*time.Second, func() (bool, string) {
		var ok bool
		e, last, ok = c.entry()
		if !ok {
			return false, "no node entry"
		}
		var got []string
		for _, w := range last.Workers {
			got = append(got, w.Key.String()+":"+w.State)
		}
		if len(last.Workers) != len(keys) {
			return false, fmt.Sprintf("record reports %v", got)
		}
		for _, w := range last.Workers {
			if !slices.Contains(keys, w.Key) || w.State != cluster.WorkerRunning {
				return false, fmt.Sprintf("record reports %v", got)
			}
		}
		return true, ""
	})
	for _, w := range last.Workers {
		if want := c.s.Worker(w.Key).Generation; w.Generation != want {
			c.t.Errorf("worker %s reported at generation %d, assigned %d", w.Key, w.Generation, want)
		}
	}
	if e.Owner == start.Owner {
		elapsed := time.Since(began)
		if writes, most := e.Version-start.Version, int64(elapsed/c.s.Heartbeat)+2; writes > most {
			c.t.Errorf("%d record writes in %s with a %s heartbeat, want at most %d", writes, elapsed, c.s.Heartbeat, most)
		}
	}
}
