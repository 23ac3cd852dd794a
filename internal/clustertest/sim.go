package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Sim is a master (or several) on one embedded store, in the test's process, with node
// records written by simulated agents (package agents/sim), which speak the real agent's
// store protocol and pass its conformance suite, and the masters' HTTP API on test
// servers. The real agent is tested in package agents and end to end.
type Sim struct {
	T     testing.TB
	Store *coord.Server
	// Admin is a store client of the test's own.
	Admin coord.Store
	// Ctx ends when the test does.
	Ctx context.Context
	// Grace is the masters' re-registration window (master.Config.ReregisterGrace): short,
	// for the tests lose nodes right after a master starts.
	Grace time.Duration
	// Beat is the simulated agents' heartbeat: short beside the masters' debounce, so that
	// what an agent does reaches them at once.
	Beat time.Duration

	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	regs   map[*master.Master]*prometheus.Registry // each master's metrics
}

// NewSim starts the store; masters and nodes are started with Master and Node. Everything
// stops when the test ends.
func NewSim(t testing.TB) *Sim {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sim{T: t, Store: srv, Ctx: ctx, cancel: cancel, regs: map[*master.Master]*prometheus.Registry{},
		Grace: 50 * time.Millisecond, Beat: 10 * time.Millisecond}
	s.Admin = s.Connect(-1)
	if err := master.EnsureDirs(ctx, s.Admin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		s.wg.Wait()
		srv.Close()
	})
	return s
}

// Connect opens a store client with the session timeout (-1: the store's default), closed
// when the test ends.
func (s *Sim) Connect(timeout time.Duration) *coord.Embedded {
	c, err := s.Store.Connect(coord.Options{SessionTimeout: timeout, Logger: quiet})
	if err != nil {
		s.T.Fatal(err)
	}
	s.T.Cleanup(func() { c.Close() })
	return c
}

// Master starts a master named id on its own client, its config changed by each of opts;
// cancel stops it.
func (s *Sim) Master(id string, opts ...func(*master.Config)) (*master.Master, *coord.Embedded, context.CancelFunc) {
	c := s.Connect(-1)
	reg := prometheus.NewRegistry()
	cfg := master.Config{ID: id, Logger: quiet, Debounce: 20 * time.Millisecond, Registry: reg, ReregisterGrace: s.Grace}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := master.New(c, cfg)
	if err != nil {
		s.T.Fatal(err)
	}
	s.mu.Lock()
	s.regs[m] = reg
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(s.Ctx)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = m.Run(ctx)
	}()
	return m, c, cancel
}

// Registry is the registry of m's metrics (nil for a master that Master did not start).
func (s *Sim) Registry(m *master.Master) *prometheus.Registry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.regs[m]
}

// Node starts a simulated agent for n, whose workers start and stop at once, and returns its
// store client; closing, crashing or expiring the client's session makes the node lost.
func (s *Sim) Node(n cluster.Node) *coord.Embedded {
	return s.Agent(n, sim.Config{})
}

// Agent starts a simulated agent for n with cfg (its Behavior and Hooks; the rest is set
// here) on a client of its own, and returns the client. The agent stops with the test.
func (s *Sim) Agent(n cluster.Node, cfg sim.Config) *coord.Embedded {
	c := s.Connect(-1)
	cfg.Heartbeat, cfg.Logger = s.Beat, quiet
	cfg.Open = func(context.Context) (coord.Store, error) { return c, nil }
	ctx, cancel := context.WithTimeout(s.Ctx, testenv.Timeout(5*time.Second))
	defer cancel()
	a, err := sim.Start(ctx, cfg, n)
	if err != nil {
		s.T.Fatal(err)
	}
	s.T.Cleanup(func() { _ = a.Close() })
	return c
}

// API serves m's HTTP API (package master/httpapi) on a test server, closed when the test
// ends.
func (s *Sim) API(m *master.Master, cfg httpapi.Config) (*httptest.Server, *httpapi.API) {
	h := httpapi.New(m, cfg)
	srv := httptest.NewServer(h)
	s.T.Cleanup(srv.Close)
	return srv, h
}

// AdminToken makes a new admin token and stores its hash, as a master's data directory
// does, and returns it.
func (s *Sim) AdminToken() string {
	s.T.Helper()
	token := api.NewToken()
	if _, err := s.Admin.Put(s.Ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.AnyVersion); err != nil {
		s.T.Fatal(err)
	}
	return token
}

// Wordcount waits until m sees nodes nodes, creates the tenant of Spec's jobs, submits job wc
// of workers and waits until every one of them is assigned: the start of most tests of a
// master's placement.
func (s *Sim) Wordcount(m *master.Master, nodes, workers int) {
	s.T.Helper()
	testenv.Eventually(s.T, fmt.Sprintf("the master sees %d nodes", nodes), 5*time.Second, func() bool { return len(m.NodeEntries()) == nodes })
	if err := desired.CreateTenant(s.Ctx, s.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		s.T.Fatal(err)
	}
	if _, err := desired.SubmitJob(s.Ctx, s.Admin, Spec("wc", workers)); err != nil {
		s.T.Fatal(err)
	}
	testenv.Eventually(s.T, fmt.Sprintf("%d workers assigned", workers), 5*time.Second, func() bool { return len(s.Assignments()) == workers })
}

// Assignments reads every node's assignment from the store. The keys are read one by one,
// so a read that overlaps a move can see a worker on both nodes; such a read is retried,
// and a worker that stays on two nodes fails the test.
func (s *Sim) Assignments() map[cluster.WorkerKey]string {
	s.T.Helper()
	var out map[cluster.WorkerKey]string
	testenv.EventuallyWith(s.T, "a read of the assignments with each worker on one node", time.Second, func() (bool, string) {
		var err error
		if out, err = s.ReadAssignments(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

// ReadAssignments reads every node's assignment once: an error names a worker seen on two
// nodes.
func (s *Sim) ReadAssignments() (map[cluster.WorkerKey]string, error) {
	out := map[cluster.WorkerKey]string{}
	names, err := s.Admin.Children(s.Ctx, cluster.AssignmentsKey)
	if err != nil {
		s.T.Fatal(err)
	}
	for _, n := range names {
		e, err := s.Admin.Get(s.Ctx, cluster.AssignmentsKey+"/"+n)
		if err != nil {
			continue
		}
		var a cluster.NodeAssignment
		_ = json.Unmarshal(e.Value, &a)
		for _, w := range a.Workers {
			if prev, dup := out[w.Key]; dup {
				return nil, fmt.Errorf("worker %s assigned to %s and %s", w.Key, prev, n)
			}
			out[w.Key] = n
		}
	}
	return out, nil
}

// Reconciled waits until m, which leads, has finished a reconcile that began after the
// call: evidence that it acted on what its mirrors held when called. One may be under way
// when it is called, so it waits for two, each after a Replan: the second began after the
// first ended.
func (s *Sim) Reconciled(m *master.Master) {
	s.T.Helper()
	for range 2 {
		n := s.Reconciles(m)
		m.Replan()
		testenv.Eventually(s.T, "a reconcile of "+m.ID(), 5*time.Second, func() bool { return s.Reconciles(m) > n })
	}
}

// Reconciles is how many reconciles m has finished.
func (s *Sim) Reconciles(m *master.Master) float64 {
	return testenv.Metric(s.T, s.Registry(m), "stormdock_master_reconcile_duration_seconds", nil)
}

// Nodes are dcs data centers of racks racks of perRack nodes each, of 4 slots, 4 GiB and 4
// cpus, named n-DC-RACK-I in data centers dc-DC and racks r-RACK.
func Nodes(dcs, racks, perRack int) []cluster.Node {
	var out []cluster.Node
	for d := range dcs {
		for r := range racks {
			for i := range perRack {
				out = append(out, cluster.Node{ID: fmt.Sprintf("n-%d-%d-%d", d, r, i), DC: fmt.Sprintf("dc-%d", d),
					Rack: fmt.Sprintf("r-%d", r), Slots: 4, Memory: 4 << 30, CPU: 4000})
			}
		}
	}
	return out
}

// Spec is a job of tenant search of workers workers, spread over data centers and racks.
func Spec(name string, workers int) *cluster.JobSpec {
	return &cluster.JobSpec{Name: name, Tenant: "search", Workers: workers,
		Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}, Command: []string{"sleep", "1000"},
		Placement: cluster.PlacementSpec{Spread: []string{"dc", "rack"}}}
}
