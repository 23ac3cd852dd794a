// Package sim runs simulated node agents for benchmarks and for the master's tests: each
// speaks the real agent's store protocol and "runs" its workers without processes.
//
// A simulated agent holds a store session of its own, registers its node as a session-bound
// entry (cluster.NodeKey) holding a cluster.NodeRecord, watches its assignment
// (cluster.AssignmentKey), acts only on an assignment stamped with its current session (as
// the real agent's gate does), and writes its record when it changed: a worker's or an
// image's change at once, at the real agent's pace (package agents/pace), a memory reading
// at the next heartbeat. Closing it ends its session, and its entry vanishes as a dead
// node's does. The real agent and this one pass the same conformance checks (package
// agents/agenttest).
//
// By default a worker runs as soon as it is assigned and is gone as soon as it is not. A test
// shapes that with Config.Behavior (how long starts, stops and image pulls take, which
// workers crash-loop) and hears each transition through Config.Hooks, as Nomad's mock
// driver is configured per task.
//
// Simulated agents are goroutines: a benchmark runs thousands in one process, each with its
// own ZooKeeper connection (see Config.Store.BufferSize and ZooKeeper's maxClientCnxns).
package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/agents/pace"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Defaults for Config.
const (
	DefaultHeartbeat = time.Second
	// DefaultBufferSize is each simulated agent's ZooKeeper client buffer: its assignment and
	// its record must fit (a node's compact assignment of 16 workers is about 2 KiB). Ten
	// thousand agents hold two buffers each.
	DefaultBufferSize = 32 << 10
	// memoryQuantum is the step of a worker's memory reading, as the real agent rounds it.
	memoryQuantum = 4 << 20
)

// Config configures simulated agents.
type Config struct {
	// Store is the coordination store's URL; Options its client options, one client per
	// agent. A zero Options.BufferSize becomes DefaultBufferSize.
	Store   string
	Options coord.Options
	// Open, when set, opens each agent's client instead of coord.Open(Store, Options).
	Open func(ctx context.Context) (coord.Store, error)
	// Heartbeat is how often an agent writes its record when only its memory readings
	// changed (see Churn). Default DefaultHeartbeat.
	Heartbeat time.Duration
	// Churn is the share of heartbeats on which one of the node's workers reports a new
	// memory reading, as a busy worker's crossing a rounding step does: 0.2 models a node
	// whose readings change at every sample of the real agent (every fifth heartbeat).
	Churn float64
	// Isolation lists the drivers the agents claim (default process).
	Isolation []string
	// Events, when set, hears what the agents do (for a benchmark's clocks).
	Events Events
	// Metrics, when set, serves the agents' job metrics to the masters (metrics.go): their
	// nodes' records name it as their endpoint.
	Metrics *Metrics
	// Behavior shapes how workers start, stop and crash, and images pull; Hooks hear it.
	Behavior Behavior
	Hooks    Hooks
	// Identity, when set, gives each node the identity its record publishes (the real
	// agent's keys, cluster.NodeIdentity), for tests of the masters' secrets delivery.
	Identity func(node string) *cluster.NodeIdentity
	Logger   *slog.Logger
}

// Behavior is how a simulated agent's workers and images behave, for tests of the master.
// The zero value starts and stops every worker at once and pulls every image at once.
type Behavior struct {
	// Start is how long a worker is reported starting before it runs (or crash-loops).
	Start time.Duration
	// Stop is how long a worker is reported stopping before it is gone, as one that takes
	// its grace to exit. A replaced worker's successor starts once it is gone, as the real
	// agent replaces a worker in place.
	Stop time.Duration
	// Pull is how long pulling an image ahead (cluster.NodeAssignment.Prepull) takes: the
	// node reports it pulling meanwhile, then ready.
	Pull time.Duration
	// Fail, when set, is asked about each worker as it finishes starting: a non-nil Failure
	// makes it crash-loop (reported in backoff) instead of running. It is called with the
	// agent's state locked: it must not block or call the Agent.
	Fail func(node string, w cluster.WorkerAssignment) *Failure
}

// Failure is how a crash-looping worker is reported.
type Failure struct {
	Restarts int    // restarts, all of them recent (within the crash-loop window)
	Exit     string // its last exit, as "exited with code 3"
}

// Hooks hear each worker's and image's transitions on a node as the agent makes them, before
// the record reporting them is written. They are called from the agent's goroutine, must not
// block, and may be nil.
type Hooks struct {
	// Running: node runs w (it finished starting and did not fail).
	Running func(node string, w cluster.WorkerAssignment)
	// Stopping: node begins stopping the worker running w; next is the assignment that
	// replaces it there once it is gone, nil when it is not replaced.
	Stopping func(node string, w cluster.WorkerAssignment, next *cluster.WorkerAssignment)
	// Stopped: worker k is gone from node.
	Stopped func(node string, k cluster.WorkerKey)
	// Pulled: node holds image ref, pulled ahead.
	Pulled func(node, ref string)
}

// Events hears what simulated agents do. Its methods are called from every agent's goroutine
// at once and must not block.
type Events interface {
	// Assigned: node acts on an assignment stamped with its session, which lists these
	// workers to run (workers marked Stop excluded).
	Assigned(node string, workers []cluster.WorkerKey)
	// Acked: node's record, as the store now holds it, reports these workers running for
	// the first time since they started there.
	Acked(node string, workers []cluster.WorkerKey)
}

func (c *Config) defaults() {
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Options.BufferSize == 0 {
		c.Options.BufferSize = DefaultBufferSize
	}
	if len(c.Isolation) == 0 {
		c.Isolation = []string{cluster.IsolationProcess}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Options.Logger == nil {
		c.Options.Logger = c.Logger
	}
}

// Agent is one simulated node agent.
type Agent struct {
	cfg      Config
	node     cluster.Node
	store    coord.Store
	key      string
	assign   string
	instance string
	started  time.Time
	log      *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
	logs   *cluster.LogsEndpoint // where the masters read the node's metrics (Config.Metrics)

	mu      sync.Mutex
	status  Status
	workers map[cluster.WorkerKey]*slot // the loop's; read under mu
	images  map[string]*image           // pulled ahead, by ref; the loop's; read under mu
	// dirty says the workers or images changed since the record was last written (the
	// loop's): a heartbeat with nothing changed costs no encoding, which ten thousand agents
	// in one process would otherwise pay every second.
	dirty bool
	// changed says a worker or an image changed (not just a memory reading): the real
	// agent writes such a change at once, paced (package pace), not at the next heartbeat.
	changed bool
}

// slot is one worker the agent handles: starting, running, crash-looping or stopping.
type slot struct {
	st cluster.WorkerStatus     // what the record reports
	wa cluster.WorkerAssignment // what runs
	// due is when the worker's start or stop ends (zero: neither under way); next is the
	// assignment to start once a stopping worker is gone.
	due  time.Time
	next *cluster.WorkerAssignment
}

// image is an image pulled ahead: done is when its pull ends.
type image struct {
	st   cluster.ImageStatus
	done time.Time
}

// Status is what an agent has done so far.
type Status struct {
	Session int64 // the session its entry was last written under
	Writes  int   // record writes
	Running int   // workers it runs
	Stamped int64 // the session of the assignment it last acted on
	// Expired counts sessions the agent lost to expiry (its process too slow to keep them,
	// or cut off): a simulated agent never loses one otherwise.
	Expired  int
	LastErr  string
	Register time.Duration // from Start to its entry's first write
}

// Start opens the agent's store session, registers its node and runs it until Close. The
// node's labels get isolation/<mode>=true for each driver in cfg.Isolation, as a real
// agent's do.
func Start(ctx context.Context, cfg Config, node cluster.Node) (*Agent, error) {
	cfg.defaults()
	key, err := cluster.NodeKey(node.ID)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	assign, _ := cluster.AssignmentKey(node.ID)
	labels := make(map[string]string, len(node.Labels)+len(cfg.Isolation))
	for k, v := range node.Labels {
		labels[k] = v
	}
	for _, m := range cfg.Isolation {
		labels["isolation/"+m] = "true"
	}
	node.Labels = labels
	var logs *cluster.LogsEndpoint
	if cfg.Metrics != nil {
		node.Addr, logs = cfg.Metrics.Endpoint()
	}
	a := &Agent{logs: logs, cfg: cfg, node: node, key: key, assign: assign, instance: fmt.Sprintf("sim-%x", rand.Uint64()),
		started: time.Now().UTC().Truncate(time.Millisecond), log: cfg.Logger.With("node", node.ID, "component", "sim"),
		done: make(chan struct{}), workers: map[cluster.WorkerKey]*slot{}, images: map[string]*image{}}
	begin := time.Now()
	if cfg.Open != nil {
		a.store, err = cfg.Open(ctx)
	} else {
		a.store, err = coord.Open(ctx, cfg.Store, cfg.Options)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: node %s: %w", node.ID, err)
	}
	w := &writer{store: a.store, key: key, host: node.Host, version: -1}
	rec, _ := a.record()
	if err := w.write(ctx, rec); err != nil {
		a.store.Close()
		return nil, fmt.Errorf("sim: register node %s: %w", node.ID, err)
	}
	a.status.Session, a.status.Writes, a.status.Register = a.store.SessionID(), 1, time.Since(begin)
	// The watches are armed before Start returns: whatever the master writes from now on
	// reaches the agent.
	lctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	assignments, err := a.store.Watch(lctx, assign)
	if err != nil {
		cancel()
		a.store.Close()
		return nil, fmt.Errorf("sim: node %s: watch assignment: %w", node.ID, err)
	}
	sessions := a.store.SessionEvents(lctx)
	if cfg.Metrics != nil {
		cfg.Metrics.add(a)
	}
	go a.loop(lctx, w, rec, assignments, sessions)
	return a, nil
}

// Node is the node the agent registered.
func (a *Agent) Node() cluster.Node { return a.node }

// Status reports what the agent has done.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.status
	for _, s := range a.workers {
		if s.st.State == cluster.WorkerRunning {
			st.Running++
		}
	}
	return st
}

// Close stops the agent and ends its session: its node entry vanishes at once.
func (a *Agent) Close() error {
	if a.cfg.Metrics != nil {
		a.cfg.Metrics.remove(a)
	}
	a.cancel()
	<-a.done
	return a.store.Close()
}

// loop handles assignments, session changes and heartbeats until ctx is done.
func (a *Agent) loop(ctx context.Context, w *writer, last []byte, assignments <-chan coord.Event, sessions <-chan coord.SessionEvent) {
	defer close(a.done)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	// Heartbeats of many agents spread over the interval rather than beating together.
	first := time.NewTimer(time.Duration(r.Int64N(int64(a.cfg.Heartbeat))))
	defer first.Stop()
	var beat <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	// due fires when the next start, stop or pull ends (cfg.Behavior).
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	arm := func() {
		if at, ok := a.next(); ok {
			due.Reset(time.Until(at))
		}
	}
	var unacked []cluster.WorkerKey // started since the last write
	force := false
	// A worker's or an image's change is written at once, as the real agent writes it
	// (agents/heartbeat.go, flush): when no start is under way (a burst of starts is one
	// write), at the real agent's pace (package pace). Memory readings wait for the heartbeat.
	var writes pace.Credit
	beating := false // this turn is a heartbeat's (not a prompt write's)
	prompt := time.NewTimer(time.Hour)
	prompt.Stop()
	defer prompt.Stop()
	soon := func() {
		if a.changed && !a.starting() {
			prompt.Reset(time.Until(writes.Next(time.Now())))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-assignments:
			if !ok {
				return
			}
			unacked = a.apply(ev, unacked)
			arm()
			soon()
			continue
		case <-due.C:
			unacked = a.advance(time.Now(), unacked)
			arm()
			soon()
			continue
		case <-prompt.C:
			if !a.changed {
				continue
			}
			beating = false
		case ev, ok := <-sessions:
			if !ok {
				return
			}
			if ev.Type == coord.SessionExpired {
				a.mu.Lock()
				a.status.Expired++
				a.mu.Unlock()
			}
			if ev.Type == coord.SessionNew {
				// The store client re-created the entry under the new session with the
				// record last written; write it anew so the master sees this session's.
				w.version, force = -1, true
			}
			continue
		case <-first.C:
			ticker = time.NewTicker(a.cfg.Heartbeat)
			beat = ticker.C
			beating = true
		case <-beat:
			beating = true
		}
		if beating && a.cfg.Churn > 0 && r.Float64() < a.cfg.Churn {
			a.churn(r)
		}
		if !force && !a.dirty {
			continue
		}
		rec, _ := a.record()
		if !force && bytes.Equal(rec, last) {
			a.dirty, a.changed = false, false
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, a.cfg.Heartbeat)
		err := w.write(wctx, rec)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				a.log.Warn("write node record", "err", err)
				a.mu.Lock()
				a.status.LastErr = err.Error()
				a.mu.Unlock()
			}
			continue
		}
		last, force, a.dirty, a.changed = rec, false, false, false
		writes.Took(time.Now())
		a.mu.Lock()
		a.status.Writes++
		a.status.Session = a.store.SessionID()
		a.mu.Unlock()
		if len(unacked) > 0 {
			if a.cfg.Events != nil {
				a.cfg.Events.Acked(a.node.ID, unacked)
			}
			unacked = nil
		}
	}
}

// apply takes a new version of the node's assignment: on one stamped with the agent's
// session it starts the workers it lists, stops the others, replaces those whose run
// changed (stopped first, then started, in place) and pulls the images it lists ahead, each
// taking as long as cfg.Behavior says. It returns the workers running and not yet reported.
func (a *Agent) apply(ev coord.Event, unacked []cluster.WorkerKey) []cluster.WorkerKey {
	var na cluster.NodeAssignment
	if ev.Exists && len(ev.Entry.Value) > 0 {
		if err := json.Unmarshal(ev.Entry.Value, &na); err != nil {
			a.log.Error("ignoring unreadable assignment", "err", err)
			return unacked
		}
	}
	// No assignment, or one written before the master saw this session (the real agent's
	// gate): change nothing until the master stamps one with this session.
	if na.Session == 0 || na.Session != a.store.SessionID() {
		return unacked
	}
	want := make(map[cluster.WorkerKey]cluster.WorkerAssignment, len(na.Workers))
	keys := make([]cluster.WorkerKey, 0, len(na.Workers))
	for _, wa := range na.Workers {
		if !wa.Stop {
			want[wa.Key] = wa
			keys = append(keys, wa.Key)
		}
	}
	now := time.Now()
	var heard []func()
	a.mu.Lock()
	a.status.Stamped = na.Session
	// In key order, as advance goes: hooks hear one node's transitions in a steady order.
	for _, k := range slices.SortedFunc(maps.Keys(a.workers), cluster.WorkerKey.Compare) {
		s := a.workers[k]
		wa, ok := want[k]
		switch {
		case s.st.State == cluster.WorkerStopping:
			// Already on its way out: what follows it is whatever this assignment lists.
			s.next = nil
			if ok {
				s.next = &wa
			}
		case !ok && s.st.State == cluster.WorkerBackoff:
			// Nothing runs: gone at once.
			delete(a.workers, k)
			a.dirty, a.changed = true, true
			if h := a.cfg.Hooks.Stopped; h != nil {
				heard = append(heard, func() { h(a.node.ID, k) })
			}
		case !ok:
			heard = a.stopLocked(s, nil, now, heard)
		case s.wa.SameRun(wa):
			// The same run at a new generation (a live change): the worker takes it as it runs.
			if s.st.Generation != wa.Generation {
				s.st.Generation, a.dirty, a.changed = wa.Generation, true, true
			}
			s.wa = wa
		case s.st.State == cluster.WorkerBackoff:
			// Not running: the next start takes the new assignment at once, as the real
			// agent's does.
			a.startLocked(wa, now)
		default:
			heard = a.stopLocked(s, &wa, now, heard)
		}
	}
	for k, wa := range want {
		if _, ok := a.workers[k]; !ok {
			a.startLocked(wa, now)
		}
	}
	for _, ref := range na.Prepull {
		if _, ok := a.images[ref]; !ok {
			a.images[ref] = &image{st: cluster.ImageStatus{Ref: ref, State: cluster.ImagePulling, Since: stamp(now)},
				done: now.Add(a.cfg.Behavior.Pull)}
			a.dirty, a.changed = true, true
		}
	}
	a.mu.Unlock()
	for _, f := range heard {
		f()
	}
	unacked = slices.DeleteFunc(unacked, func(k cluster.WorkerKey) bool { _, ok := want[k]; return !ok })
	if a.cfg.Events != nil {
		a.cfg.Events.Assigned(a.node.ID, keys)
	}
	return a.advance(now, unacked)
}

// startLocked begins starting wa's worker; advance ends the start when it is due.
func (a *Agent) startLocked(wa cluster.WorkerAssignment, now time.Time) {
	a.workers[wa.Key] = &slot{wa: wa, due: now.Add(a.cfg.Behavior.Start),
		st: cluster.WorkerStatus{Key: wa.Key, Generation: wa.Generation, Restart: wa.Restart, State: cluster.WorkerStarting, Since: stamp(now)}}
	a.dirty, a.changed = true, true
}

// stopLocked begins stopping s, to start next in its place once it is gone (nil: none). It
// returns heard with the Stopping hook's call added.
func (a *Agent) stopLocked(s *slot, next *cluster.WorkerAssignment, now time.Time, heard []func()) []func() {
	s.st.State, s.due, s.next, a.dirty, a.changed = cluster.WorkerStopping, now.Add(a.cfg.Behavior.Stop), next, true, true
	if h := a.cfg.Hooks.Stopping; h != nil {
		w := s.wa
		heard = append(heard, func() { h(a.node.ID, w, next) })
	}
	return heard
}

// advance ends every start, stop and pull due by now, and returns unacked with the workers
// that began running added. A stop that ends starts the worker's successor, which may end at
// once too.
func (a *Agent) advance(now time.Time, unacked []cluster.WorkerKey) []cluster.WorkerKey {
	b, h := a.cfg.Behavior, a.cfg.Hooks
	var heard []func()
	a.mu.Lock()
	for changed := true; changed; {
		changed = false
		for _, k := range slices.SortedFunc(maps.Keys(a.workers), cluster.WorkerKey.Compare) {
			s := a.workers[k]
			if s.due.IsZero() || s.due.After(now) {
				continue
			}
			s.due, changed, a.dirty, a.changed = time.Time{}, true, true, true
			switch s.st.State {
			case cluster.WorkerStarting:
				if f := b.fail(a.node.ID, s.wa); f != nil {
					s.st.State, s.st.Restarts, s.st.RecentRestarts, s.st.LastExit, s.st.Since = cluster.WorkerBackoff, f.Restarts, f.Restarts, f.Exit, stamp(now)
					s.st.ExitReason = cluster.ExitCrashed
					continue
				}
				s.st.State, s.st.PID, s.st.Since = cluster.WorkerRunning, 1, stamp(now)
				s.st.Memory = cluster.Bytes(min(s.wa.Resources.Memory/2, 64<<20)) / memoryQuantum * memoryQuantum
				unacked = append(unacked, k)
				if h.Running != nil {
					wa := s.wa
					heard = append(heard, func() { h.Running(a.node.ID, wa) })
				}
			case cluster.WorkerStopping:
				delete(a.workers, k)
				if h.Stopped != nil {
					heard = append(heard, func() { h.Stopped(a.node.ID, k) })
				}
				if s.next != nil {
					a.startLocked(*s.next, now)
				}
			}
		}
	}
	for _, ref := range slices.Sorted(maps.Keys(a.images)) {
		im := a.images[ref]
		if im.st.State != cluster.ImagePulling || im.done.After(now) {
			continue
		}
		im.st.State, im.st.Since, a.dirty, a.changed = cluster.ImageReady, stamp(now), true, true
		if h.Pulled != nil {
			heard = append(heard, func() { h.Pulled(a.node.ID, ref) })
		}
	}
	a.mu.Unlock()
	for _, f := range heard {
		f()
	}
	return unacked
}

// stamp is a time as records carry it.
func stamp(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

// fail asks Fail about w, if set.
func (b Behavior) fail(node string, w cluster.WorkerAssignment) *Failure {
	if b.Fail == nil {
		return nil
	}
	return b.Fail(node, w)
}

// next is when the next start, stop or pull ends; ok is false when none is under way.
func (a *Agent) next() (at time.Time, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.workers {
		if !s.due.IsZero() && (!ok || s.due.Before(at)) {
			at, ok = s.due, true
		}
	}
	for _, im := range a.images {
		if im.st.State == cluster.ImagePulling && (!ok || im.done.Before(at)) {
			at, ok = im.done, true
		}
	}
	return at, ok
}

// churn moves one running worker's memory reading by a step.
func (a *Agent) churn(r *rand.Rand) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.workers) == 0 {
		return
	}
	i := r.IntN(len(a.workers))
	for _, w := range a.workers {
		if i > 0 {
			i--
			continue
		}
		if s := &w.st; s.State == cluster.WorkerRunning {
			if s.Memory > memoryQuantum && r.IntN(2) == 0 {
				s.Memory -= memoryQuantum
			} else {
				s.Memory += memoryQuantum
			}
			a.dirty = true
		}
		return
	}
}

// starting reports a worker still starting: the real agent writes a burst of starts once
// they have all ended (or at the heartbeat).
func (a *Agent) starting() bool {
	for _, w := range a.workers {
		if w.st.State == cluster.WorkerStarting {
			return true
		}
	}
	return false
}

// record encodes the node record as the agent would write it now.
func (a *Agent) record() ([]byte, error) {
	a.mu.Lock()
	ws := make([]cluster.WorkerStatus, 0, len(a.workers))
	for _, s := range a.workers {
		ws = append(ws, s.st)
	}
	var imgs []cluster.ImageStatus
	for _, im := range a.images {
		imgs = append(imgs, im.st)
	}
	a.mu.Unlock()
	slices.SortFunc(ws, func(x, y cluster.WorkerStatus) int { return x.Key.Compare(y.Key) })
	slices.SortFunc(imgs, func(x, y cluster.ImageStatus) int { return strings.Compare(x.Ref, y.Ref) })
	return json.Marshal(cluster.NodeRecord{
		Node:      a.node,
		Health:    cluster.NodeHealth{State: cluster.HealthHealthy},
		Workers:   ws,
		Images:    imgs,
		Isolation: a.cfg.Isolation,
		Agent:     a.instance,
		Started:   a.started,
		Identity:  a.identity(),
		Logs:      a.logs,
	})
}

func (a *Agent) identity() *cluster.NodeIdentity {
	if a.cfg.Identity == nil {
		return nil
	}
	return a.cfg.Identity(a.node.ID)
}

// writer keeps the node's session-bound entry, as the real agent's keeper does: it creates
// it under the agent's session and rewrites it at its version, never unconditionally (an
// unconditional write while the entry is gone would make it persistent).
type writer struct {
	store   coord.Store
	key     string
	host    string
	version int64 // -1: unknown
}

var errTaken = errors.New("node entry held by another agent's session")

func (w *writer) write(ctx context.Context, b []byte) error {
	for range 5 {
		if w.version >= 0 {
			v, err := w.store.Put(ctx, w.key, b, w.version)
			switch {
			case err == nil:
				w.version = v
				return nil
			case errors.Is(err, coord.ErrNotFound), errors.Is(err, coord.ErrConflict):
				w.version = -1
			default:
				return err
			}
		}
		_, err := w.store.Create(ctx, w.key, b, coord.Ephemeral)
		if err == nil {
			w.version = 0
			return nil
		}
		if !errors.Is(err, coord.ErrExists) {
			return err
		}
		e, err := w.store.Get(ctx, w.key)
		switch {
		case errors.Is(err, coord.ErrNotFound):
			continue
		case err != nil:
			return err
		case e.Owner == w.store.SessionID():
			w.version = e.Version
			continue
		}
		var old cluster.NodeRecord
		_ = json.Unmarshal(e.Value, &old)
		if old.Node.Host != w.host {
			return fmt.Errorf("%w: %s (host %q)", errTaken, w.key, old.Node.Host)
		}
		// An earlier agent of this host whose session has not timed out: take over.
		if err := w.store.Delete(ctx, w.key, e.Version); err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("write %s: gave up after repeated conflicts", w.key)
}
