package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testCluster is a master (or several) on one embedded store, with node records written
// by simulated agents (package agents/sim), which speak the real agent's store protocol and
// pass its conformance suite. The real agent is tested in package agents and end to end.
type testCluster struct {
	t      testing.TB
	srv    *coord.Server
	admin  coord.Store
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	regs   map[*Master]*prometheus.Registry // each master's metrics
	grace  time.Duration                    // masters' re-registration window
	// beat is the simulated agents' heartbeat: short beside the masters' debounce, so
	// that what an agent does reaches them at once.
	beat time.Duration
}

func newTestCluster(t testing.TB) *testCluster {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testCluster{t: t, srv: srv, ctx: ctx, cancel: cancel, regs: map[*Master]*prometheus.Registry{},
		grace: 50 * time.Millisecond, beat: 10 * time.Millisecond}
	tc.admin = tc.connect(-1)
	if err := ensureDirs(ctx, tc.admin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		tc.wg.Wait()
		srv.Close()
	})
	return tc
}

func (tc *testCluster) connect(timeout time.Duration) *coord.Embedded {
	c, err := tc.srv.Connect(coord.Options{SessionTimeout: timeout, Logger: quiet})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c
}

// master starts a master on its own client; cancel stops it.
func (tc *testCluster) master(id string) (*Master, *coord.Embedded, context.CancelFunc) {
	c := tc.connect(-1)
	reg := prometheus.NewRegistry()
	// A short re-registration window: these tests lose nodes right after the master starts.
	m, err := New(c, Config{ID: id, Logger: quiet, Debounce: 20 * time.Millisecond, Registry: reg, ReregisterGrace: tc.grace})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.regs[m] = reg
	ctx, cancel := context.WithCancel(tc.ctx)
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		_ = m.Run(ctx)
	}()
	return m, c, cancel
}

// node starts a simulated agent (agents/sim: it passes the agent conformance suite) for n,
// whose workers start and stop at once, and returns its store client; closing, crashing or
// expiring the client's session makes the node lost.
func (tc *testCluster) node(n cluster.Node) *coord.Embedded {
	return tc.agent(n, sim.Config{})
}

// agent starts a simulated agent for n with cfg (its Behavior and Hooks; the rest is set
// here) on a client of its own, and returns the client. The agent stops with the test.
func (tc *testCluster) agent(n cluster.Node, cfg sim.Config) *coord.Embedded {
	c := tc.connect(-1)
	cfg.Heartbeat, cfg.Logger = tc.beat, quiet
	cfg.Open = func(context.Context) (coord.Store, error) { return c, nil }
	ctx, cancel := context.WithTimeout(tc.ctx, testenv.Timeout(5*time.Second))
	defer cancel()
	a, err := sim.Start(ctx, cfg, n)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { _ = a.Close() })
	return c
}

// assignments reads every node's assignment from the store. The keys are read one by one,
// so a read that overlaps a move can see a worker on both nodes; such a read is retried,
// and a worker that stays on two nodes fails the test.
func (tc *testCluster) assignments() map[cluster.WorkerKey]string {
	tc.t.Helper()
	var out map[cluster.WorkerKey]string
	testenv.EventuallyWith(tc.t, "a read of the assignments with each worker on one node", time.Second, func() (bool, string) {
		var err error
		if out, err = tc.readAssignments(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return out
}

func (tc *testCluster) readAssignments() (map[cluster.WorkerKey]string, error) {
	out := map[cluster.WorkerKey]string{}
	names, err := tc.admin.Children(tc.ctx, cluster.AssignmentsKey)
	if err != nil {
		tc.t.Fatal(err)
	}
	for _, n := range names {
		e, err := tc.admin.Get(tc.ctx, cluster.AssignmentsKey+"/"+n)
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

// reconciled waits until m, which leads, has finished a reconcile that began after the call:
// evidence that it acted on what its mirrors held when called. One may be under way when it
// is called, so it waits for two, each after a poke: the second began after the first ended.
func (tc *testCluster) reconciled(m *Master) {
	tc.t.Helper()
	for range 2 {
		n := tc.reconciles(m)
		m.poke()
		testenv.Eventually(tc.t, "a reconcile of "+m.cfg.ID, 5*time.Second, func() bool { return tc.reconciles(m) > n })
	}
}

// reconciles is how many reconciles m has finished.
func (tc *testCluster) reconciles(m *Master) float64 {
	return testenv.Metric(tc.t, tc.regs[m], "stormdock_master_reconcile_duration_seconds", nil)
}

func testNodes(dcs, racks, perRack int) []cluster.Node {
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

func testSpec(name string, workers int) *cluster.JobSpec {
	return &cluster.JobSpec{Name: name, Tenant: "search", Workers: workers,
		Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}, Command: []string{"sleep", "1000"},
		Placement: cluster.PlacementSpec{Spread: []string{"dc", "rack"}}}
}

func TestMasterPlacesAndReplacesLostNode(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	clients := map[string]*coord.Embedded{}
	for _, n := range testNodes(2, 2, 2) {
		clients[n.ID] = tc.node(n)
	}
	testenv.Eventually(t, "the master sees 8 nodes", 5*time.Second, func() bool { return len(m.view().nodes) == 8 })
	if err := desired.CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.ctx, tc.admin, testSpec("wc", 12)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "12 workers assigned", 5*time.Second, func() bool { return len(tc.assignments()) == 12 })
	before := tc.assignments()
	perNode := map[string]int{}
	for _, n := range before {
		perNode[n]++
	}
	for n, c := range perNode {
		if c > 2 {
			t.Errorf("node %s has %d workers; an even spread over 8 nodes puts at most 2", n, c)
		}
	}
	// Lose a node that has workers: only its workers move.
	lost := before[cluster.WorkerKey{Job: "wc", Worker: 0}]
	clients[lost].Close()
	testenv.Eventually(t, "workers of the lost node re-placed", 5*time.Second, func() bool {
		a := tc.assignments()
		if len(a) != 12 {
			return false
		}
		for _, n := range a {
			if n == lost {
				return false
			}
		}
		return true
	})
	after := tc.assignments()
	for k, n := range before {
		if n != lost && after[k] != n {
			t.Errorf("worker %s moved from %s to %s though its node stayed", k, n, after[k])
		}
	}
}

func TestMasterFailoverKeepsAssignments(t *testing.T) {
	tc := newTestCluster(t)
	m1, c1, _ := tc.master("m1")
	testenv.Eventually(t, "m1 leads", 5*time.Second, m1.Leader)
	m2, _, _ := tc.master("m2")
	for _, n := range testNodes(1, 2, 2) {
		tc.node(n)
	}
	testenv.Eventually(t, "the master sees 4 nodes", 5*time.Second, func() bool { return len(m1.view().nodes) == 4 })
	if err := desired.CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.ctx, tc.admin, testSpec("wc", 6)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "6 workers assigned", 5*time.Second, func() bool { return len(tc.assignments()) == 6 })
	before := tc.assignments()
	versions := map[string]int64{}
	for _, n := range slices.Collect(maps.Values(before)) {
		e, _ := tc.admin.Get(tc.ctx, cluster.AssignmentsKey+"/"+n)
		versions[n] = e.Version
	}
	if m2.Leader() {
		t.Fatal("two leaders")
	}
	c1.Crash() // the leader's process dies: its session ends, m2 takes over
	testenv.Eventually(t, "m2 leads", 5*time.Second, m2.Leader)
	// Once the new leader has reconciled, nothing may have been rewritten.
	tc.reconciled(m2)
	after := tc.assignments()
	if !maps.Equal(before, after) {
		t.Errorf("assignments changed across failover:\nbefore %v\nafter  %v", before, after)
	}
	for n, v := range versions {
		e, _ := tc.admin.Get(tc.ctx, cluster.AssignmentsKey+"/"+n)
		if e.Version != v {
			t.Errorf("new leader rewrote the assignment of %s (version %d -> %d)", n, v, e.Version)
		}
	}
}

func TestAPI(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	for _, n := range testNodes(1, 1, 2) {
		tc.node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.view().nodes) == 2 })
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	ctx := tc.ctx
	token := api.NewToken()
	if _, err := tc.admin.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient(srv.URL, token)
	if err != nil {
		t.Fatal(err)
	}
	anon, _ := api.NewClient(srv.URL, "")
	if _, err := anon.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "missing API token") {
		t.Fatalf("call without token: %v", err)
	}
	forged, _ := api.NewClient(srv.URL, "sdt_forged")
	if _, err := forged.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "invalid API token") {
		t.Fatalf("call with a wrong token: %v", err)
	}
	spec := "name: wc\ntenant: search\nworkers: 4\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n"

	_, err = cl.SubmitJob(ctx, []byte(spec))
	if !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), `unknown tenant "search"`) {
		t.Fatalf("submit for unknown tenant: %v", err)
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "search", MaxWorkers: 6}); err != nil {
		t.Fatal(err)
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "search"}); !errors.Is(err, api.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	_, err = cl.SubmitJob(ctx, []byte("name: wc\nworkers: 0\n"))
	if !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "workers: must be at least 1 (line 2)") {
		t.Fatalf("bad spec: %v", err)
	}
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, []byte(spec)); !errors.Is(err, api.ErrExists) {
		t.Fatalf("duplicate submit: %v", err)
	}
	_, err = cl.SubmitJob(ctx, []byte(strings.Replace(spec, "name: wc", "name: wc2", 1)))
	if !errors.Is(err, api.ErrQuota) || err.Error() != "tenant search: 4 of 6 workers used, asked for 4 more" {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := cl.ScaleJob(ctx, "wc", 7); !errors.Is(err, api.ErrQuota) || !strings.Contains(err.Error(), "4 of 6 workers used, asked for 3 more") {
		t.Fatalf("scale over quota: %v", err)
	}
	testenv.Eventually(t, "4 running", 5*time.Second, func() bool {
		st, err := cl.Job(ctx, "wc")
		return err == nil && st.Summary.Running == 4
	})
	// 2 nodes x 4 slots: scaling to 6 fits; the quota allows 6.
	if _, err := cl.ScaleJob(ctx, "wc", 6); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "6 running", 5*time.Second, func() bool {
		st, err := cl.Job(ctx, "wc")
		return err == nil && st.Summary.Running == 6
	})
	// A tenant token sees and changes only its tenant's jobs.
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "ads"}); err != nil {
		t.Fatal(err)
	}
	adsToken, err := cl.TenantToken(ctx, "ads")
	if err != nil {
		t.Fatal(err)
	}
	ads, _ := api.NewClient(srv.URL, adsToken)
	if _, err := ads.ScaleJob(ctx, "wc", 1); !errors.Is(err, api.ErrForbidden) || !strings.Contains(err.Error(), "the token of tenant ads cannot act on tenant search's jobs") {
		t.Fatalf("cross-tenant scale: %v", err)
	}
	if _, err := ads.KillJob(ctx, "wc", 0); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("cross-tenant kill: %v", err)
	}
	if _, err := ads.SubmitJob(ctx, []byte(strings.Replace(spec, "name: wc", "name: wc3", 1))); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("cross-tenant submit: %v", err)
	}
	if jobs, err := ads.Jobs(ctx); err != nil || len(jobs) != 0 {
		t.Fatalf("tenant ads sees %v, %v", jobs, err)
	}
	if err := ads.CreateTenant(ctx, cluster.Tenant{Name: "evil"}); !errors.Is(err, api.ErrForbidden) {
		t.Fatalf("tenant creating a tenant: %v", err)
	}
	if st, err := cl.Job(ctx, "wc"); err != nil || st.Summary.Workers != 6 {
		t.Fatalf("refused calls changed the job: %+v, %v", st.Summary, err)
	}
	nodes, err := cl.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].SlotsUsed+nodes[1].SlotsUsed != 6 {
		t.Fatalf("nodes = %+v, %v", nodes, err)
	}
	if err := cl.DrainNode(ctx, "nope", true); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("drain unknown node: %v", err)
	}
	if _, err := cl.Job(ctx, "nope"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if _, err := cl.KillJob(ctx, "wc", time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "job removed", 5*time.Second, func() bool {
		_, err := cl.Job(ctx, "wc")
		return errors.Is(err, api.ErrNotFound)
	})
	if len(tc.assignments()) != 0 {
		t.Errorf("killed job still assigned: %v", tc.assignments())
	}
}

func TestDrainMovesWorkersOff(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	for _, n := range testNodes(1, 2, 2) {
		tc.node(n)
	}
	testenv.Eventually(t, "the master sees 4 nodes", 5*time.Second, func() bool { return len(m.view().nodes) == 4 })
	if err := desired.CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.ctx, tc.admin, testSpec("wc", 8)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "8 workers assigned", 5*time.Second, func() bool { return len(tc.assignments()) == 8 })
	if err := desired.UpdateNodeConf(tc.ctx, tc.admin, "n-0-0-0", func(c *cluster.NodeConf) { c.Draining = true }); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "drained node empty", 5*time.Second, func() bool {
		a := tc.assignments()
		for _, n := range a {
			if n == "n-0-0-0" {
				return false
			}
		}
		return len(a) == 8
	})
}

func TestCrashLoopMovesJobOffNode(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	tc.node(cluster.Node{ID: "good", DC: "dc", Rack: "r1", Slots: 4, Memory: 4 << 30, CPU: 4000})
	// A node whose agent reports worker 0 crash-looping, written by hand.
	bad := tc.connect(-1)
	rec := cluster.NodeRecord{Node: cluster.Node{ID: "bad", DC: "dc", Rack: "r2", Slots: 4, Memory: 4 << 30, CPU: 4000,
		Labels: map[string]string{"isolation/process": "true"}}, Isolation: []string{"process"}}
	val, _ := json.Marshal(rec)
	if _, err := bad.Create(tc.ctx, cluster.NodesKey+"/bad", val, coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.view().nodes) == 2 })
	if err := desired.CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.ctx, tc.admin, testSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "2 workers assigned", 5*time.Second, func() bool { return len(tc.assignments()) == 2 })
	onBad := cluster.WorkerKey{}
	for k, n := range tc.assignments() {
		if n == "bad" {
			onBad = k
		}
	}
	if onBad.Job == "" {
		t.Fatalf("spread put nothing on node bad: %v", tc.assignments())
	}
	rec.Workers = []cluster.WorkerStatus{{Key: onBad, State: cluster.WorkerBackoff, Restarts: 9, RecentRestarts: 6, LastExit: "exited with code 1"}}
	val, _ = json.Marshal(rec)
	if _, err := bad.Put(tc.ctx, cluster.NodesKey+"/bad", val, coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	// The move waits for the old copy: bad's assignment loses the worker first, and only
	// once bad no longer reports it (its agent stopped it) does good get it.
	testenv.Eventually(t, "the worker taken off node bad", 5*time.Second, func() bool {
		a := tc.assignments()
		return len(a) == 1 && a[onBad] == ""
	})
	if a := tc.assignments(); a[onBad] != "" {
		t.Fatalf("worker %s assigned to %s while node bad still reports it", onBad, a[onBad])
	}
	rec.Workers = nil
	val, _ = json.Marshal(rec)
	if _, err := bad.Put(tc.ctx, cluster.NodesKey+"/bad", val, coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the job moved off node bad", 5*time.Second, func() bool {
		a := tc.assignments()
		return len(a) == 2 && a[onBad] == "good"
	})
	e, err := tc.admin.Get(tc.ctx, cluster.NodeConfsKey+"/bad")
	if err != nil || !strings.Contains(string(e.Value), `"avoid":["wc"]`) {
		t.Fatalf("node bad not noted: %s, %v", e.Value, err)
	}
}

// The agents these tests run against act, as the real agent does, only on an assignment
// stamped with the session that holds their node's entry: one stamped with another (as a
// master writes before it saw the node's new session) starts nothing.
func TestNodeIgnoresAssignmentOfAnotherSession(t *testing.T) {
	tc := newTestCluster(t)
	n := testNodes(1, 1, 1)[0]
	c := tc.node(n)
	key, _ := cluster.NodeKey(n.ID)
	reported := func() (cluster.NodeRecord, bool) {
		e, err := tc.admin.Get(tc.ctx, key)
		var rec cluster.NodeRecord
		return rec, err == nil && json.Unmarshal(e.Value, &rec) == nil
	}
	testenv.Eventually(t, "the node registered", 5*time.Second, func() bool { _, ok := reported(); return ok })
	assign := func(session int64) {
		t.Helper()
		w := cluster.WorkerAssignment{Key: cluster.WorkerKey{Job: "wc", Worker: 0}, Generation: 1, Tenant: "search",
			Isolation: cluster.IsolationProcess, Command: []string{"sleep", "1000"}}
		b, _ := json.Marshal(cluster.NodeAssignment{Node: n.ID, DC: n.DC, Rack: n.Rack, Session: session, Workers: []cluster.WorkerAssignment{w}})
		if _, err := tc.admin.Put(tc.ctx, cluster.AssignmentsKey+"/"+n.ID, b, coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	assign(c.SessionID() + 1)
	testenv.AssertUntil(t, "no worker reported", 20*tc.beat, func() (bool, string) {
		rec, _ := reported()
		return len(rec.Workers) == 0, fmt.Sprint(rec.Workers)
	})
	assign(c.SessionID())
	testenv.EventuallyWith(t, "wc/0 running", 5*time.Second, func() (bool, string) {
		rec, _ := reported()
		return len(rec.Workers) == 1 && rec.Workers[0].State == cluster.WorkerRunning, fmt.Sprint(rec.Workers)
	})
}
