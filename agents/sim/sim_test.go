package sim_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/agenttest"
	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestConformance runs the agent protocol's checks, which the real agent passes too
// (agents/conformance_test.go), against a simulated agent.
func TestConformance(t *testing.T) {
	const heartbeat = 100 * time.Millisecond
	agenttest.Run(t, testenv.ZKAddr(t), agenttest.Subject{
		Heartbeat:      heartbeat,
		SessionTimeout: 2 * time.Second,
		Start: func(t *testing.T, node cluster.Node, open agenttest.Opener) func() {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(20*time.Second))
			defer cancel()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			a, err := sim.Start(ctx, sim.Config{Heartbeat: heartbeat, Churn: 0.5, Logger: log, Open: func(ctx context.Context) (coord.Store, error) {
				return open(ctx, coord.Options{SessionTimeout: 2 * time.Second, BufferSize: sim.DefaultBufferSize, Logger: log})
			}}, node)
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := a.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
		},
		Worker: func(k cluster.WorkerKey) cluster.WorkerAssignment {
			return cluster.WorkerAssignment{Key: k, Generation: 3, Tenant: "search", Workers: 3, Isolation: cluster.IsolationProcess,
				Command: []string{"true"}, Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}, Grace: cluster.Duration(time.Second)}
		},
	})
}

// embedded starts a simulated agent of node on its own client of srv, with cfg; it returns
// the agent and its client.
func embedded(t *testing.T, srv *coord.Server, cfg sim.Config, node cluster.Node) (*sim.Agent, *coord.Embedded) {
	t.Helper()
	c, err := srv.Connect(coord.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = quiet
	cfg.Open = func(context.Context) (coord.Store, error) { return c, nil }
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(5*time.Second))
	defer cancel()
	a, err := sim.Start(ctx, cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a, c
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// store is an embedded store with the directories a master creates, and a client of its
// own, as a master's.
func store(t *testing.T) (*coord.Server, coord.Store) {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	m, err := srv.Connect(coord.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, k := range []string{cluster.NodesKey, cluster.AssignmentsKey} {
		if _, err := m.Create(context.Background(), k, nil, coord.Persistent); err != nil {
			t.Fatal(err)
		}
	}
	return srv, m
}

// assign writes node's assignment of workers, stamped with session, as the master does.
func assign(t *testing.T, m coord.Store, node string, session int64, prepull []string, workers ...cluster.WorkerAssignment) {
	t.Helper()
	b, err := json.Marshal(cluster.NodeAssignment{Node: node, Session: session, Workers: workers, Prepull: prepull})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := cluster.AssignmentKey(node)
	if _, err := m.Put(context.Background(), key, b, coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
}

// record reads node's record.
func record(t *testing.T, m coord.Store, node string) (cluster.NodeRecord, int64) {
	t.Helper()
	key, _ := cluster.NodeKey(node)
	e, err := m.Get(context.Background(), key)
	if err != nil {
		return cluster.NodeRecord{}, 0
	}
	var rec cluster.NodeRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		t.Fatal(err)
	}
	return rec, e.Owner
}

// states lists a record's workers as key:state.
func states(rec cluster.NodeRecord) string {
	var out []string
	for _, w := range rec.Workers {
		out = append(out, fmt.Sprintf("%s:%s@%d", w.Key, w.State, w.Generation))
	}
	return strings.Join(out, " ")
}

func worker(job string, i int, gen int64, cmd ...string) cluster.WorkerAssignment {
	return cluster.WorkerAssignment{Key: cluster.WorkerKey{Job: job, Worker: i}, Generation: gen, Tenant: "search",
		Isolation: cluster.IsolationProcess, Command: cmd, Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}}
}

// A simulated agent, as the real one, ignores an assignment stamped with a session other
// than its own: one written before the master saw its session, and, once its session
// expired, the one stamped with the lost session. This is the agent the master's tests run
// against, on the embedded store they use.
func TestIgnoresAssignmentOfAnotherSession(t *testing.T) {
	srv, m := store(t)
	node := cluster.Node{ID: "n1", Host: "h1", DC: "dc", Rack: "r1", Slots: 4}
	_, c := embedded(t, srv, sim.Config{}, node)
	testenv.Eventually(t, "n1 registered", 5*time.Second, func() bool { _, owner := record(t, m, "n1"); return owner != 0 })
	old := c.SessionID()
	a, b := worker("alpha", 0, 1, "sleep", "1"), worker("beta", 0, 1, "sleep", "1")
	assign(t, m, "n1", old+1, nil, a)
	testenv.AssertUntil(t, "no worker of an assignment stamped with another session", 300*time.Millisecond, func() (bool, string) {
		rec, _ := record(t, m, "n1")
		return len(rec.Workers) == 0, states(rec)
	})
	assign(t, m, "n1", old, nil, a)
	testenv.EventuallyWith(t, "alpha/0 running", 5*time.Second, func() (bool, string) {
		rec, _ := record(t, m, "n1")
		return states(rec) == "alpha/0:running@1", states(rec)
	})

	// The session expires: the client opens another and restores the entry.
	if err := srv.ExpireSession(old); err != nil {
		t.Fatal(err)
	}
	var now int64
	testenv.Eventually(t, "n1 registered under a new session", 5*time.Second, func() bool {
		_, now = record(t, m, "n1")
		return now != 0 && now != old
	})
	assign(t, m, "n1", old, nil, b)
	testenv.AssertUntil(t, "alpha/0 alone, though the lost session's assignment lists beta/0", 300*time.Millisecond, func() (bool, string) {
		rec, _ := record(t, m, "n1")
		return states(rec) == "alpha/0:running@1", states(rec)
	})
	assign(t, m, "n1", now, nil, b)
	testenv.EventuallyWith(t, "beta/0 alone, as re-stamped", 5*time.Second, func() (bool, string) {
		rec, _ := record(t, m, "n1")
		return states(rec) == "beta/0:running@1", states(rec)
	})
}

// Behavior makes starts, stops and pulls take time and workers crash-loop, and Hooks hear
// each transition before the record reports it.
func TestBehaviorAndHooks(t *testing.T) {
	srv, m := store(t)
	var mu sync.Mutex
	var heard []string
	hear := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, fmt.Sprintf(format, args...))
	}
	cfg := sim.Config{
		Behavior: sim.Behavior{Start: 100 * time.Millisecond, Stop: 100 * time.Millisecond, Pull: 100 * time.Millisecond,
			Fail: func(node string, w cluster.WorkerAssignment) *sim.Failure {
				if slices.Contains(w.Command, "crash") {
					return &sim.Failure{Restarts: 4, Exit: "exited with code 3"}
				}
				return nil
			}},
		Hooks: sim.Hooks{
			Running: func(node string, w cluster.WorkerAssignment) { hear("%s running %s@%d", node, w.Key, w.Generation) },
			Stopping: func(node string, w cluster.WorkerAssignment, next *cluster.WorkerAssignment) {
				if next != nil {
					hear("%s stopping %s@%d for @%d", node, w.Key, w.Generation, next.Generation)
					return
				}
				hear("%s stopping %s@%d", node, w.Key, w.Generation)
			},
			Stopped: func(node string, k cluster.WorkerKey) { hear("%s stopped %s", node, k) },
			Pulled:  func(node, ref string) { hear("%s pulled %s", node, ref) },
		},
	}
	_, c := embedded(t, srv, cfg, cluster.Node{ID: "n1", Host: "h1", DC: "dc", Rack: "r1", Slots: 4})
	testenv.Eventually(t, "n1 registered", 5*time.Second, func() bool { _, owner := record(t, m, "n1"); return owner != 0 })
	sid := c.SessionID()
	wait := func(what, want string) {
		t.Helper()
		testenv.EventuallyWith(t, what, 5*time.Second, func() (bool, string) {
			rec, _ := record(t, m, "n1")
			return states(rec) == want, states(rec)
		})
	}

	assign(t, m, "n1", sid, nil, worker("a", 0, 1, "sleep", "1"), worker("a", 1, 1, "crash"))
	wait("both starting", "a/0:starting@1 a/1:starting@1")
	wait("a/0 running, a/1 crash-looping", "a/0:running@1 a/1:backoff@1")
	rec, _ := record(t, m, "n1")
	if w := rec.Workers[1]; w.RecentRestarts != 4 || w.Restarts != 4 || w.LastExit != "exited with code 3" {
		t.Errorf("crash-looping worker reported as %+v", w)
	}

	// A live change (generation alone) is taken as the worker runs; a new command replaces
	// the crash-looping worker in place, started at once as nothing runs; the image listed is
	// pulled ahead.
	assign(t, m, "n1", sid, []string{"img@sha256:2"}, worker("a", 0, 2, "sleep", "1"), worker("a", 1, 2, "sleep", "2"))
	wait("a/0 live at generation 2, a/1 replaced", "a/0:running@2 a/1:starting@2")
	wait("a/1 running", "a/0:running@2 a/1:running@2")
	testenv.EventuallyWith(t, "the image ready", 5*time.Second, func() (bool, string) {
		rec, _ := record(t, m, "n1")
		return len(rec.Images) == 1 && rec.Images[0].Ref == "img@sha256:2" && rec.Images[0].State == cluster.ImageReady, fmt.Sprint(rec.Images)
	})
	assign(t, m, "n1", sid, nil, worker("a", 1, 3, "sleep", "3"))
	wait("a/0 gone, a/1 stopping", "a/0:stopping@2 a/1:stopping@2")
	wait("a/1 replaced", "a/1:running@3")

	mu.Lock()
	defer mu.Unlock()
	want := []string{
		"n1 running a/0@1",
		"n1 running a/1@2", "n1 pulled img@sha256:2", // a crash-looping worker is replaced at once
		"n1 stopping a/0@2", "n1 stopping a/1@2 for @3", "n1 stopped a/0", "n1 stopped a/1", "n1 running a/1@3",
	}
	if !slices.Equal(heard, want) {
		t.Errorf("hooks heard\n%s\nwant\n%s", strings.Join(heard, "\n"), strings.Join(want, "\n"))
	}
}

// A worker's start and stop are written at once, as the real agent writes them
// (agents/heartbeat.go, flush), not at the next heartbeat: with an hour's heartbeat the
// record still reports each within moments. Memory readings (Churn) alone wait for the
// heartbeat; this agent has none.
func TestChangesWrittenBeforeTheHeartbeat(t *testing.T) {
	srv, m := store(t)
	node := cluster.Node{ID: "n1", DC: "dc-a", Rack: "r1", Slots: 4, Memory: 4 << 30, CPU: 4000}
	_, c := embedded(t, srv, sim.Config{Heartbeat: time.Hour}, node)
	w0, w1 := worker("wc", 0, 1, "true"), worker("wc", 1, 1, "true")
	assign(t, m, node.ID, c.SessionID(), nil, w0, w1)
	testenv.EventuallyWith(t, "both workers reported running", 5*time.Second, func() (bool, string) {
		rec, _ := record(t, m, node.ID)
		s := states(rec)
		return s == "wc/0:running@1 wc/1:running@1", s
	})
	assign(t, m, node.ID, c.SessionID(), nil, w1)
	testenv.EventuallyWith(t, "worker 0 reported gone", 5*time.Second, func() (bool, string) {
		rec, _ := record(t, m, node.ID)
		s := states(rec)
		return s == "wc/1:running@1", s
	})
}
