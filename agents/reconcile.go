package agents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
)

// slot is one worker the agent handles: running, backing off after a crash, being started or
// stopped. A slot's fields belong to the loop goroutine.
type slot struct {
	id     string
	mode   string
	assign cluster.WorkerAssignment
	known  bool // assign is what runs; false for an adopted worker without a record
	port   int
	// metricsPort is where the worker may serve its metrics (0: none given).
	metricsPort int

	state       string // a cluster.Worker* state, or "" while waiting for a (re)start
	pid         int
	containerID string
	since       time.Time
	memory      cluster.Bytes

	restarts int
	oomKills int         // ends at the memory limit, for the job's metrics
	recent   []time.Time // restarts within the crash-loop window
	// quick counts the crashes in a row that came within StableRun of their start: the
	// backoff doubles with them alone.
	quick    int
	lastExit string
	// exitReason is why the worker last ended (a cluster.Exit* value); lapses counts its
	// stops for a lapsed lease, which are not restarts.
	exitReason string
	lapses     int
	// leaseGen is the node lease's generation as the worker began to run (see started).
	leaseGen leaseGen
	failures int // failed starts in a row
	retryAt  time.Time

	evicted    bool // stopped for memory pressure: not restarted here
	busy       bool // a driver call is in flight
	held       bool // the driver still holds the ended worker: release it before a start
	seq        int  // instance counter: results of an older instance are ignored
	cancelWait context.CancelFunc

	// files guards the worker's secrets directory; delivered are the secrets in it (names
	// and versions). A rotation in flight is secretsBusy; one that failed is tried again
	// at secretsRetry.
	files           *workerFiles
	delivered       []cluster.SecretRef
	secretsBusy     bool
	secretsFailures int
	secretsRetry    time.Time
}

// record is what the agent keeps on disk of the worker (state.go).
func (s *slot) record() record {
	return record{Assignment: s.assign, Isolation: s.mode, Port: s.port, MetricsPort: s.metricsPort, Restarts: s.restarts, Secrets: s.delivered}
}

// active reports whether the worker's process may be alive.
func (s *slot) active() bool {
	switch s.state {
	case cluster.WorkerStarting, cluster.WorkerRunning, cluster.WorkerStopping:
		return true
	}
	return false
}

// reconcile starts, stops and replaces workers to match the assignment. It never blocks:
// driver calls run in goroutines and come back as events, after which it runs again. It
// acts only as the gate allows (see gate): on an assignment stamped with the keeper's
// session, and starting workers only while their leases are kept.
func (r *run) reconcile() {
	now := time.Now()
	g := r.gate()
	if !g.current {
		r.armRetry(r.blocked())
		r.updateMetrics()
		return
	}
	for id, s := range r.workers {
		if s.busy {
			continue
		}
		want, ok := r.desired[id]
		if !ok {
			r.stop(s, true)
			continue
		}
		if !s.known || s.mode != isolationOf(want) || !s.assign.SameRun(want) {
			if s.state == cluster.WorkerRunning {
				r.log.Info("assignment changed, replacing worker", "worker", id,
					"generation", s.assign.Generation, "new_generation", want.Generation)
				r.stop(s, false)
				continue
			}
			// Not running: the next start takes the new assignment, without delay. Its
			// crash-loop record starts afresh: the master judges a replacement by its own.
			s.assign, s.known, s.mode = want, true, isolationOf(want)
			s.failures, s.retryAt, s.state, s.recent, s.quick = 0, time.Time{}, "", nil, 0
		} else if !equalAssignment(s.assign, want) {
			r.liveChange(s, want)
		}
		if s.state == cluster.WorkerRunning && !s.busy && !s.secretsBusy {
			switch {
			case !behind(s.delivered, s.assign.Secrets):
				s.secretsFailures, s.secretsRetry = 0, time.Time{}
			case !now.Before(s.secretsRetry):
				r.refreshSecrets(s)
			}
		}
	}
	if g.canRun {
		// Starts run concurrently, each in a goroutine of its own, at most as many as the
		// node has slots; one that ends makes room for the next (started reconciles).
		room := max(r.a.cfg.Node.Slots, 1) - r.inStart()
		for id, want := range r.desired {
			s := r.workers[id]
			if s == nil {
				s = &slot{id: id, assign: want, known: true, mode: isolationOf(want), files: &workerFiles{}}
				r.workers[id] = s
			}
			if s.busy || s.evicted || s.state == cluster.WorkerRunning || now.Before(s.retryAt) || room <= 0 {
				continue
			}
			r.start(s)
			if s.busy {
				room--
			}
		}
	}
	r.armRetry(!g.canRun && r.blocked())
	r.updateMetrics()
}

// blockedPoll is how often a reconcile that the gate kept from starting workers runs again.
// What opens the gate is not always an event the loop hears of: a lease renewed by the
// keeper after a lapse (a keeper paused, then resumed) changes neither its state nor its
// session, only the lease file, and the workers would wait for the next assignment.
const blockedPoll = 250 * time.Millisecond

// blocked reports whether a desired worker waits for the gate: not started, not starting.
func (r *run) blocked() bool {
	for id := range r.desired {
		if s := r.workers[id]; s == nil || !s.busy && s.state != cluster.WorkerRunning && !s.evicted {
			return true
		}
	}
	return false
}

// inStart counts the workers being started: the driver's start, or the image pull before it.
func (r *run) inStart() int {
	n := 0
	for _, s := range r.workers {
		if s.busy && (s.state == cluster.WorkerStarting || s.state == cluster.WorkerPulling) {
			n++
		}
	}
	return n
}

// armRetry sets the retry timer to the earliest pending restart.
func (r *run) armRetry(blocked bool) {
	var next time.Time
	if blocked {
		poll := blockedPoll
		if ttl := r.a.leaseTTL() / 8; ttl > 0 && ttl < poll {
			poll = ttl
		}
		next = time.Now().Add(poll)
	}
	for _, s := range r.workers {
		if !s.busy && !s.retryAt.IsZero() && (next.IsZero() || s.retryAt.Before(next)) {
			next = s.retryAt
		}
		if s.state == cluster.WorkerRunning && !s.busy && !s.secretsBusy && !s.secretsRetry.IsZero() && (next.IsZero() || s.secretsRetry.Before(next)) {
			next = s.secretsRetry
		}
	}
	if next.IsZero() || next.Equal(r.retryAt) {
		return
	}
	r.retryAt = next
	r.retry.Reset(max(time.Until(next), 0))
}

// allocPort returns the lowest port of the node's range that no worker uses (its own other
// port included): a worker's STORMDOCK_PORT and STORMDOCK_METRICS_PORT come from one range.
func (r *run) allocPort() int {
	used := map[int]bool{}
	for _, s := range r.workers {
		for _, p := range []int{s.port, s.metricsPort} {
			if p != 0 {
				used[p] = true
			}
		}
	}
	p := r.a.cfg.PortBase
	for tries := 0; used[p] || tries < maxPortProbes && !portFree(r.a.cfg.Node.Addr, p); tries++ {
		p++
	}
	return p
}

// maxPortProbes bounds how many ports in use by others allocPort passes over: past them it
// gives the next port its workers do not use, and the worker reports what it cannot bind.
const maxPortProbes = 256

// portFree reports whether nothing on the host listens on addr:port, by binding it for a
// moment. The range is the agent's, but not the host's alone: another program (or an agent
// of another cluster on the same host) may hold a port of it, and a worker given that port
// cannot serve there (seen: a word count's metrics port taken, its job's autoscaling held
// for good, "1 of 2 running workers report input_backlog"). Only "in use" counts: an address
// the agent cannot bind for another reason (advertised, not local) says nothing.
func portFree(addr string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		return !errors.Is(err, syscall.EADDRINUSE)
	}
	ln.Close()
	return true
}

// backoff is the delay before the n-th restart within the crash-loop window (n >= 1).
// engineRetry is how often a start the docker engine did not answer is tried again: not the
// doubling backoff, whose ceiling a dockerd restart made workers wait out after the engine
// was back (the chaos run saw a minute).
const engineRetry = time.Second

// retryIn is when a start that failed with err, the n-th failure in a row, is tried again.
func (r *run) retryIn(n int, err error) time.Duration {
	if docker.Unreachable(err) {
		return min(r.backoff(n), engineRetry)
	}
	return r.backoff(n)
}

func (r *run) backoff(n int) time.Duration {
	d := r.a.cfg.RestartBackoff
	for i := 1; i < n && d < r.a.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.a.cfg.MaxBackoff)
}

// pruneRecent drops restarts that left the crash-loop window.
func (r *run) pruneRecent(s *slot, now time.Time) {
	cut := now.Add(-r.a.cfg.CrashLoopWindow)
	i := 0
	for i < len(s.recent) && !s.recent[i].After(cut) {
		i++
	}
	s.recent = s.recent[i:]
}

// start launches a worker in the background; started takes the result.
func (r *run) start(s *slot) {
	drv := r.a.driver(s.mode)
	if drv == nil {
		r.startFailed(s, fmt.Errorf("%w: worker %s needs isolation %q", errNoDriver, s.assign.Key, s.mode))
		return
	}
	if s.port == 0 {
		s.port = r.allocPort()
	}
	if s.metricsPort == 0 && r.a.cfg.MetricsInterval > 0 && !s.assign.System {
		s.metricsPort = r.allocPort()
	}
	// Who it runs as is decided first: a worker that must not run (no uid, root, the
	// agent's own, an agent that cannot switch) gets no file either.
	u, err := workerUser(s.assign, s.mode, r.a.cfg.RunAs, r.a.me)
	if err != nil {
		r.startFailed(s, err)
		return
	}
	if imageCommand(s.assign, s.mode) && !r.a.cfg.NoLease && r.a.dockerLauncher == "" {
		// Never unfenced: without the launcher to put in front of it, the image's own
		// command does not run.
		r.startFailed(s, r.a.noDockerLauncher)
		return
	}
	spec := r.a.spec(s.id, s.assign, s.mode, s.port, u)
	if s.metricsPort != 0 {
		spec.Env[EnvMetricsPort] = strconv.Itoa(s.metricsPort)
	}
	if err := r.a.prepareLeaseDir(s.id, u); err != nil {
		r.startFailed(s, err)
		return
	}
	if err := r.a.writeConfig(s.id, s.assign, u); err != nil {
		r.startFailed(s, err)
		return
	}
	if err := r.a.writeRecord(s.id, s.record()); err != nil {
		r.startFailed(s, err)
		return
	}
	if !r.a.cfg.NoLease {
		if err := r.a.linkLease(s.id); err != nil {
			r.startFailed(s, err)
			return
		}
	}
	if _, err := r.a.writeOutputToken(s.id, s.assign, s.mode, u); err != nil {
		r.startFailed(s, err)
		return
	}
	if _, err := r.a.writeRouterCredentials(s.id, s.assign, s.mode, u); err != nil {
		r.startFailed(s, err)
		return
	}
	if err := r.a.prepareSinkDir(s.assign, s.mode); err != nil {
		r.startFailed(s, err)
		return
	}
	if err := r.a.prepareRouterTLS(r.ctx, s.id, s.assign, s.mode, u); err != nil {
		r.startFailed(s, err)
		return
	}
	s.busy, s.state, s.since = true, cluster.WorkerStarting, time.Now()
	s.seq++
	seq, held, ctx := s.seq, s.held, r.ctx
	pull := s.mode == cluster.IsolationDocker && r.a.images() != nil && spec.Image != ""
	// A worker restarted with the secrets it has (a crash, the agent's restart) starts
	// without asking the master: only missing or older ones are fetched.
	fetch := len(s.assign.Secrets) > 0 && (behind(s.delivered, s.assign.Secrets) || !r.a.secretsPresent(s.id))
	files, assign := s.files, s.assign
	r.goOp(func() {
		if held {
			if _, err := drv.Stop(ctx, s.id, 0); err != nil && !errors.Is(err, isolation.ErrNotFound) {
				r.log.Warn("release ended worker", "worker", s.id, "err", err)
			}
		}
		if fetch {
			refs, err := r.a.deliverSecrets(ctx, files, s.id, assign, u)
			if err != nil {
				r.post(func() { r.secretsFailed(s, seq, err) })
				return
			}
			r.post(func() {
				if s.seq == seq {
					s.delivered = refs
				}
			})
		}
		if pull {
			if err := r.fetch(ctx, s, seq, s.assign.Tenant, spec.Image); err != nil {
				r.post(func() { r.pullFailed(s, seq, err) })
				return
			}
		}
		w, err := drv.Start(ctx, spec)
		r.post(func() { r.started(s, seq, w, err) })
	})
}

func (r *run) started(s *slot, seq int, w isolation.Worker, err error) {
	s.busy = false
	if seq != s.seq {
		return
	}
	if err != nil {
		if errors.Is(err, isolation.ErrExists) {
			s.held = true // a stale instance the driver still holds: release, then retry
		}
		r.startFailed(s, err)
		r.reconcile()
		return
	}
	s.held, s.failures, s.retryAt = false, 0, time.Time{}
	s.state, s.pid, s.containerID, s.since = cluster.WorkerRunning, w.PID, w.ContainerID, w.Started
	s.leaseGen = r.a.currentLeaseGen()
	r.a.metrics.starts.Inc()
	r.log.Info("worker started", "worker", s.id, "key", s.assign.Key.String(), "generation", s.assign.Generation,
		"pid", w.PID, "container", w.ContainerID, "port", s.port)
	r.watch(s, r.a.driver(s.mode))
	r.reconcile()
}

// startFailed records a start that did not happen and schedules another attempt.
func (r *run) startFailed(s *slot, err error) {
	s.failures++
	s.state, s.since = cluster.WorkerFailed, time.Now()
	s.lastExit = "start failed: " + err.Error()
	retry := r.retryIn(s.failures, err)
	s.retryAt = time.Now().Add(retry)
	r.log.Warn("worker start failed", "worker", s.id, "attempt", s.failures, "retry_in", retry, "err", err)
	r.publishSoon()
}

// watch waits for the worker's end in the background; exited takes it.
func (r *run) watch(s *slot, drv isolation.Driver) {
	ctx, cancel := context.WithCancel(r.ctx)
	s.cancelWait = cancel
	seq := s.seq
	r.goOp(func() {
		ex, err := drv.Wait(ctx, s.id)
		if ctx.Err() != nil {
			return
		}
		r.post(func() { r.exited(s, seq, ex, err) })
	})
}

// exited handles a worker that ended unasked: it is restarted after a backoff that grows with
// the restarts in the crash-loop window, which the node record reports for the master.
func (r *run) exited(s *slot, seq int, ex isolation.Exit, err error) {
	if seq != s.seq || s.state != cluster.WorkerRunning {
		return
	}
	now := time.Now()
	s.cancelWait()
	s.held = true
	delay := r.countExit(s, r.a.exitReason(ex, err, grace(s.assign), r.keeper.Status(), s.leaseGen), ex, err, now)
	if s.exitReason == cluster.ExitLeaseLapsed {
		// Not the worker's failure: no crash counted, no backoff; it starts again once the
		// keeper keeps the leases again (the gate), here or wherever the master puts it.
		r.log.Info("worker stopped by its launcher for a lapsed lease; not counted as a crash", "worker", s.id, "lapses", s.lapses)
		r.reconcile()
		r.publishSoon()
		return
	}
	r.log.Warn("worker ended, restarting after backoff", "worker", s.id, "exit", s.lastExit,
		"restarts", s.restarts, "recent", len(s.recent), "backoff", delay)
	if ex.OOMKilled {
		s.oomKills++
		r.a.metrics.oomKills.WithLabelValues(s.assign.Key.Job).Inc()
	}
	r.a.metrics.restarts.WithLabelValues(s.assign.Key.Job).Inc()
	if err := r.a.writeRecord(s.id, s.record()); err != nil {
		r.log.Warn("write worker record", "worker", s.id, "err", err)
	}
	r.reconcile()
	r.publishSoon()
}

// stop stops a worker in the background with its grace period. remove drops the slot
// afterwards; otherwise it is started again (a replacement).
func (r *run) stop(s *slot, remove bool) {
	drv := r.a.driver(s.mode)
	needDriver := drv != nil && (s.active() || s.held)
	g := grace(s.assign)
	if s.cancelWait != nil {
		s.cancelWait()
	}
	s.busy, s.state, s.since = true, cluster.WorkerStopping, time.Now()
	s.seq++
	ctx := r.ctx
	r.goOp(func() {
		var ex isolation.Exit
		var err error
		if needDriver {
			ex, err = drv.Stop(ctx, s.id, g)
			if errors.Is(err, isolation.ErrNotFound) {
				err = nil
			}
		}
		r.post(func() { r.stopped(s, remove, ex, err) })
	})
}

func (r *run) stopped(s *slot, remove bool, ex isolation.Exit, err error) {
	s.busy = false
	if err != nil {
		r.log.Error("stop worker", "worker", s.id, "err", err)
		s.held = true
		s.state, s.since = cluster.WorkerFailed, time.Now()
		s.lastExit = "stop failed: " + err.Error()
		s.retryAt = time.Now().Add(r.backoff(1))
		r.reconcile()
		return
	}
	s.held, s.pid, s.containerID, s.memory = false, 0, "", 0
	r.log.Info("worker stopped", "worker", s.id, "exit", ex.String(), "remove", remove)
	if _, still := r.desired[s.id]; remove || !still {
		delete(r.workers, s.id)
		if err := r.a.removeRecord(s.id); err != nil {
			r.log.Warn("remove worker record", "worker", s.id, "err", err)
		}
		if err := s.files.remove(r.a, s.id); err != nil {
			r.log.Warn("remove secrets", "worker", s.id, "err", err)
		}
		if err := r.a.removeLease(s.id); err != nil {
			r.log.Warn("remove lease", "worker", s.id, "err", err)
		}
		if dd, ok := r.a.driver(s.mode).(isolation.Discarder); ok {
			id, ctx := s.id, r.ctx
			r.goOp(func() {
				if err := dd.Discard(ctx, id); err != nil {
					r.log.Warn("discard the previous run", "worker", id, "err", err)
				}
			})
		}
	} else if s.evicted {
		r.countExit(s, cluster.ExitEvicted, ex, nil, time.Now())
		r.publishSoon()
	} else {
		r.countExit(s, cluster.ExitStopped, ex, nil, time.Now())
	}
	r.reconcile()
}

// countExit records on its slot a worker's end for reason (a cluster.Exit* value) and
// returns the backoff before its restart. Only the worker's own failure (ExitCrashed) counts
// towards its crash loop (restarts, the crash-loop window the masters judge, a growing
// backoff); a stop for a lapsed lease is counted apart (lapses) and restarts as soon as the
// gate allows; the agent's own stops (ExitStopped: drain, move, rollout) and evictions count
// nowhere. Zero: no backoff.
func (r *run) countExit(s *slot, reason string, ex isolation.Exit, lost error, now time.Time) time.Duration {
	s.exitReason = reason
	s.pid, s.containerID, s.memory = 0, "", 0
	switch reason {
	case cluster.ExitLeaseLapsed:
		s.lapses++
		s.lastExit = lapsedStop
		s.state, s.since, s.retryAt = "", now, time.Time{}
		return 0
	case cluster.ExitEvicted:
		s.state, s.since, s.lastExit = cluster.WorkerEvicted, now, "evicted under memory pressure: "+ex.String()
		return 0
	case cluster.ExitStopped:
		s.state, s.since, s.retryAt = "", now, time.Time{}
		return 0
	}
	ran := time.Duration(-1) // unknown: not seen running
	if s.state == cluster.WorkerRunning && !s.since.IsZero() {
		ran = now.Sub(s.since)
	}
	s.restarts++
	r.pruneRecent(s, now)
	s.recent = append(s.recent, now)
	s.lastExit = ex.String()
	if lost != nil {
		s.lastExit = "lost: " + lost.Error()
	}
	if ran >= r.a.cfg.StableRun {
		s.quick = 0 // it ran well before this crash: no loop to slow down
	}
	s.quick++
	delay := r.backoff(min(s.quick, len(s.recent)))
	s.state, s.since = cluster.WorkerBackoff, now
	s.retryAt = now.Add(delay)
	return delay
}

// adoptOne takes over one worker a driver knows.
func (r *run) adoptOne(mode string, w isolation.Worker) error {
	id := w.Spec.ID
	rec, ok, err := r.a.readRecord(id)
	if err != nil {
		r.log.Warn("unreadable worker record: the worker will be replaced", "worker", id, "err", err)
		ok = false
	}
	s := &slot{id: id, mode: mode, known: ok, files: &workerFiles{}}
	if ok {
		s.assign, s.port, s.metricsPort, s.restarts, s.delivered = rec.Assignment, rec.Port, rec.MetricsPort, rec.Restarts, rec.Secrets
	} else {
		s.assign = cluster.WorkerAssignment{Key: cluster.WorkerKey{Job: w.Spec.Job, Worker: w.Spec.Worker}}
		s.port, _ = strconv.Atoi(w.Spec.Env[EnvPort])
		s.metricsPort, _ = strconv.Atoi(w.Spec.Env[EnvMetricsPort])
	}
	r.workers[id] = s
	if w.Running() {
		s.state, s.pid, s.containerID, s.since = cluster.WorkerRunning, w.PID, w.ContainerID, w.Started
		r.log.Info("worker adopted", "worker", id, "pid", w.PID, "container", w.ContainerID)
		r.watch(s, r.a.driver(mode))
		return nil
	}
	// It ended while no agent watched: count it as a crash and restart it at once, unless
	// its launcher stopped it for a lapsed lease (the agent gone too long, a store fault).
	now := time.Now()
	s.held = true
	if s.exitReason = r.a.exitReason(*w.Exit, nil, grace(s.assign), r.a.keeperFileStatus(), leaseGen{}); s.exitReason == cluster.ExitLeaseLapsed {
		s.lapses++
		s.lastExit = lapsedStop
		s.since = now
		r.log.Info("adopted a worker its launcher stopped for a lapsed lease; not counted as a crash", "worker", id)
		return nil
	}
	s.restarts++
	s.recent = append(s.recent, now)
	s.lastExit = w.Exit.String()
	s.state, s.since = cluster.WorkerBackoff, now
	r.log.Warn("adopted a worker that ended meanwhile", "worker", id, "exit", s.lastExit)
	return nil
}
