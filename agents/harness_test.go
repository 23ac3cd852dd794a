package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/process"
)

const (
	// tenantUID is the uid the harness's master gives tenant "search".
	tenantUID      = 300000
	nodeID         = "n1"
	sessionTimeout = 2 * time.Second // short, with a margin for loaded test machines
	heartbeat      = 100 * time.Millisecond
)

// countingStore counts the writes made through it.
type countingStore struct {
	coord.Store
	writes atomic.Int64

	mu     sync.Mutex
	values [][]byte // node records written, for diagnostics
}

func (c *countingStore) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	c.writes.Add(1)
	c.mu.Lock()
	c.values = append(c.values, value)
	c.mu.Unlock()
	return c.Store.Put(ctx, key, value, version)
}

func (c *countingStore) Create(ctx context.Context, key string, value []byte, mode coord.Mode) (string, error) {
	c.writes.Add(1)
	return c.Store.Create(ctx, key, value, mode)
}

func (c *countingStore) Delete(ctx context.Context, key string, version int64) error {
	c.writes.Add(1)
	return c.Store.Delete(ctx, key, version)
}

func (c *countingStore) Txn(ctx context.Context, ops ...coord.Op) ([]coord.OpResult, error) {
	c.writes.Add(1)
	return c.Store.Txn(ctx, ops...)
}

// lastValues returns the last n values written with Put.
func (c *countingStore) lastValues(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, v := range c.values[max(len(c.values)-n, 0):] {
		out = append(out, string(v))
	}
	return out
}

// harness is one agent test: a store (embedded or ZooKeeper), a process driver in a cgroup
// parent of its own, and the agent's configuration.
type harness struct {
	t         *testing.T
	kind      string
	store     coord.Store // the test's own client: assignments and reads
	srv       *coord.Server
	zkURL     string
	dialer    *zktest.Partition
	stateDir  string
	helperDir string
	cgParent  string
	cfg       agents.Config
	drv       *process.Driver

	stampOnce sync.Once
	assignMu  sync.Mutex
	assigned  []cluster.WorkerAssignment
	prepull   []string // the assignment's pre-pull list (images_test.go)

	// usageCalls counts the agents' Usage calls: every agents' sampleEvery heartbeats an agent
	// samples each running worker's memory, so the count shows heartbeats that write nothing.
	usageCalls atomic.Int64
}

// meteredDriver counts Usage calls into calls.
type meteredDriver struct {
	isolation.Driver
	calls *atomic.Int64
}

func (d meteredDriver) Usage(ctx context.Context, id string) (isolation.Usage, error) {
	d.calls.Add(1)
	return d.Driver.Usage(ctx, id)
}

// Logs passes on the driver's logs (the process driver is an isolation.LogReader).
func (d meteredDriver) Logs(ctx context.Context, id string, opts isolation.LogOptions) (io.ReadCloser, error) {
	return d.Driver.(isolation.LogReader).Logs(ctx, id, opts)
}

func newHarness(t *testing.T, kind string) *harness {
	t.Helper()
	testenv.Cgroups(t)
	h := &harness{
		t:         t,
		kind:      kind,
		stateDir:  filepath.Join(t.TempDir(), "state"),
		helperDir: t.TempDir(),
		cgParent:  fmt.Sprintf("/stormdock-agents-test-%x", rand.Uint32()),
	}
	// Workers run as their tenants' uids: the helper's reports go where every user writes.
	openUp(t, h.helperDir, 0o777)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch kind {
	case "mem":
		srv, err := coord.NewServer(coord.ServerOptions{Logger: testenv.Logger(h.t, slog.LevelError)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		h.srv = srv
		s, err := srv.Connect(coord.Options{SessionTimeout: -1, Logger: testenv.Logger(h.t, slog.LevelError)})
		if err != nil {
			t.Fatal(err)
		}
		h.store = s
		t.Cleanup(func() { s.Close() })
	case "zk":
		addr := testenv.ZKAddr(t)
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
		chroot := fmt.Sprintf("/stormdock-agents-test/%s-%x", name, rand.Uint64())
		h.zkURL = "zk://" + addr + chroot
		s, err := coord.Open(ctx, h.zkURL, coord.Options{SessionTimeout: 4 * time.Second, Logger: testenv.Logger(h.t, slog.LevelError)})
		if err != nil {
			t.Fatal(err)
		}
		h.store = s
		t.Cleanup(func() { s.Close() })
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := coord.DeleteTree(ctx, s, "/"); err != nil {
				t.Logf("cleanup %s: %v", chroot, err)
			}
		})
	default:
		t.Fatalf("unknown store %q", kind)
	}
	h.cfg = agents.Config{
		Node: cluster.Node{ID: nodeID, Host: "host-1", DC: "dc-a", Rack: "r1", Slots: 4,
			Memory: 4 << 30, CPU: 4000, Labels: map[string]string{"disk": "ssd"}},
		StateDir:        h.stateDir,
		SessionTimeout:  sessionTimeout,
		Heartbeat:       heartbeat,
		Self:            stormdockBin,
		Launcher:        shimBin,
		RestartBackoff:  100 * time.Millisecond,
		MaxBackoff:      2 * time.Second,
		CrashLoopWindow: time.Minute,
		Logger:          testenv.Logger(h.t, slog.LevelError),
	}
	h.drv = h.newDriver()
	t.Cleanup(h.cleanupWorkers)
	t.Cleanup(func() {
		// Leases kept below /run (a state directory the tenants' uids cannot reach).
		if target, err := os.Readlink(filepath.Join(h.stateDir, "leases")); err == nil && strings.HasPrefix(target, "/run/stormdock/") {
			os.RemoveAll(target)
		}
	})
	return h
}

func (h *harness) newDriver() *process.Driver {
	h.t.Helper()
	d, err := process.New(process.Config{
		CgroupParent: h.cgParent,
		StateDir:     filepath.Join(h.stateDir, "process"),
		Shim:         shimBin,
		Logger:       testenv.Logger(h.t, slog.LevelError),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

// cleanupWorkers stops whatever workers are left (adopting them through a fresh driver, in
// case the test's driver was closed) and removes the cgroup parent.
func (h *harness) cleanupWorkers() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.drv.Close()
	d := h.newDriver()
	defer d.Close()
	if _, err := d.Adopt(ctx); err != nil {
		h.t.Logf("cleanup adopt: %v", err)
	}
	ws, _ := d.List(ctx)
	for _, w := range ws {
		if _, err := d.Stop(ctx, w.Spec.ID, time.Second); err != nil {
			h.t.Logf("cleanup stop %s: %v", w.Spec.ID, err)
		}
	}
	if err := d.RemoveParent(); err != nil {
		h.t.Logf("cleanup cgroup parent %s: %v", h.cgParent, err)
	}
}

// agentStore opens the agent's own client, with the session timeout of the tests.
func (h *harness) agentStore() coord.Store {
	h.t.Helper()
	var s coord.Store
	var err error
	switch h.kind {
	case "mem":
		s, err = h.srv.Connect(coord.Options{SessionTimeout: sessionTimeout, Logger: testenv.Logger(h.t, slog.LevelError)})
	case "zk":
		h.dialer = &zktest.Partition{}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err = coord.Open(ctx, h.zkURL, coord.Options{SessionTimeout: sessionTimeout, Dialer: h.dialer.Dial, Logger: testenv.Logger(h.t, slog.LevelError)})
	}
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { s.Close() })
	return s
}

// runningAgent is an Agent being run by a test.
type runningAgent struct {
	a      *agents.Agent
	store  coord.Store
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop cancels the agent (workers keep running) and returns Run's result.
func (ra *runningAgent) stop() error {
	ra.once.Do(func() {
		ra.cancel()
		select {
		case ra.err = <-ra.done:
		case <-time.After(20 * time.Second):
			ra.err = errors.New("agent did not stop within 20s")
		}
	})
	return ra.err
}

// start runs an agent with cfg on store and the harness's driver.
func (h *harness) start(cfg agents.Config, store coord.Store) *runningAgent {
	h.t.Helper()
	a, err := agents.New(cfg, store, agents.Driver{Isolation: cluster.IsolationProcess, Driver: meteredDriver{h.drv, &h.usageCalls}})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, store: store, cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	h.t.Cleanup(func() {
		if err := ra.stop(); err != nil {
			h.t.Errorf("agent Run: %v", err)
		}
	})
	return ra
}

// wa is an assignment of worker idx of job running the helper in mode.
func (h *harness) wa(job string, idx int, gen int64, mode string) cluster.WorkerAssignment {
	return cluster.WorkerAssignment{
		Key:        cluster.WorkerKey{Job: job, Worker: idx},
		Generation: gen,
		Tenant:     "search",
		UID:        tenantUID,
		Workers:    3,
		Isolation:  cluster.IsolationProcess,
		Command:    []string{"stormdock", "helper"},
		Env:        map[string]string{"HELPER_DIR": h.helperDir, "HELPER_MODE": mode, "HELPER_CRASH_AFTER": "100ms"},
		Resources:  cluster.Resources{Memory: 128 << 20, CPU: 200},
		Grace:      cluster.Duration(2 * time.Second),
		Output:     "http://127.0.0.1:9/out",
	}
}

// assign writes the node's assignment as the master would: stamped with the session that
// owns the node's entry. Like the master, the harness stamps it anew whenever the node
// registers under another session (stampLoop).
func (h *harness) assign(ws ...cluster.WorkerAssignment) {
	h.t.Helper()
	h.stampOnce.Do(func() { h.stampLoop() })
	h.assignMu.Lock()
	defer h.assignMu.Unlock()
	h.assigned = ws
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var session int64
	if e, err := h.store.Get(ctx, cluster.NodesKey+"/"+nodeID); err == nil {
		session = e.Owner
	}
	if err := h.writeAssignment(ctx, session); err != nil {
		h.t.Fatal(err)
	}
}

// setAssigned changes what the harness's master wants without writing it: it goes out with
// the next stamp (the node registered under a new session).
func (h *harness) setAssigned(ws ...cluster.WorkerAssignment) {
	h.assignMu.Lock()
	h.assigned = ws
	h.assignMu.Unlock()
}

// writeAssignment writes h.assigned stamped with session; assignMu is held.
func (h *harness) writeAssignment(ctx context.Context, session int64) error {
	b, err := json.Marshal(cluster.NodeAssignment{Node: nodeID, Workers: h.assigned, Prepull: h.prepull, Session: session})
	if err != nil {
		return err
	}
	_, err = h.store.Put(ctx, cluster.AssignmentsKey+"/"+nodeID, b, coord.AnyVersion)
	return err
}

// stampLoop re-stamps the assignment whenever the node's entry gets a new owner.
func (h *harness) stampLoop() {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	ch, err := h.store.Watch(ctx, cluster.NodesKey+"/"+nodeID)
	if err != nil {
		h.t.Fatal(err)
	}
	go func() {
		var last int64
		for ev := range ch {
			if !ev.Exists || ev.Entry.Owner == last {
				continue
			}
			last = ev.Entry.Owner
			h.assignMu.Lock()
			_ = h.writeAssignment(ctx, last)
			h.assignMu.Unlock()
		}
	}()
}

// record reads the node record; ok is false when there is none.
func (h *harness) record() (rec cluster.NodeRecord, e coord.Entry, ok bool) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := h.store.Get(ctx, cluster.NodesKey+"/"+nodeID)
	if errors.Is(err, coord.ErrNotFound) {
		return rec, e, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		h.t.Fatal(err)
	}
	return rec, e, true
}

// waitRecord polls the node record until cond holds.
func (h *harness) waitRecord(what string, timeout time.Duration, cond func(cluster.NodeRecord) bool) cluster.NodeRecord {
	h.t.Helper()
	var rec cluster.NodeRecord
	testenv.EventuallyWith(h.t, what, timeout, func() (bool, string) {
		var ok bool
		if rec, _, ok = h.record(); ok && cond(rec) {
			return true, ""
		}
		b, _ := json.MarshalIndent(rec, "", "  ")
		return false, "node record:\n" + string(b)
	})
	return rec
}

// states maps worker keys to state in a record.
func states(rec cluster.NodeRecord) map[string]cluster.WorkerStatus {
	m := map[string]cluster.WorkerStatus{}
	for _, w := range rec.Workers {
		m[w.Key.String()] = w
	}
	return m
}

// allRunning returns a condition: exactly keys, all running.
func allRunning(keys ...string) func(cluster.NodeRecord) bool {
	return func(rec cluster.NodeRecord) bool {
		st := states(rec)
		if len(st) != len(keys) {
			return false
		}
		for _, k := range keys {
			if w, ok := st[k]; !ok || w.State != cluster.WorkerRunning || w.PID == 0 {
				return false
			}
		}
		return true
	}
}

// reports returns the helper's start reports for key (job[.link].worker), oldest first.
func (h *harness) reports(key string) []helperReport {
	h.t.Helper()
	ms, _ := filepath.Glob(filepath.Join(h.helperDir, key+".*.json"))
	var out []helperReport
	for _, m := range ms {
		if strings.Count(strings.TrimPrefix(filepath.Base(m), key+"."), ".") != 1 {
			continue // another key with this one as prefix
		}
		b, err := os.ReadFile(m)
		if err != nil {
			h.t.Fatal(err)
		}
		var r helperReport
		if err := json.Unmarshal(b, &r); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// waitReports waits until key has n start reports and returns them.
func (h *harness) waitReports(key string, n int) []helperReport {
	h.t.Helper()
	var reps []helperReport
	testenv.Eventually(h.t, fmt.Sprintf("%d start reports of %s", n, key), 10*time.Second, func() bool {
		reps = h.reports(key)
		return len(reps) >= n
	})
	return reps
}

// terminated reports whether the helper with pid drained on SIGTERM.
func (h *harness) terminated(key string, pid int) bool {
	_, err := os.Stat(filepath.Join(h.helperDir, fmt.Sprintf("%s.%d.term", key, pid)))
	return err == nil
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
