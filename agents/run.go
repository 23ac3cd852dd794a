package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stormdock/stormdock/agents/pace"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// run is one execution of Agent.Run. Its fields belong to the loop goroutine: other goroutines
// (driver calls, waits, usage samples) hand their results back through events, as functions
// the loop runs. That keeps every decision about a worker in one place and lock-free.
type run struct {
	a   *Agent
	ctx context.Context
	log *slog.Logger

	events chan func()
	ops    sync.WaitGroup // driver calls and waits in flight

	workers map[string]*slot                    // by worker id: what runs or is being handled
	desired map[string]cluster.WorkerAssignment // by worker id: the node's assignment
	began   time.Time

	// keeper holds the node's liveness; assignSession is the keeper session the node's
	// assignment was stamped with (see gate).
	keeper        keeperLink
	keeperSeen    KeeperStatus
	keeperWrites  int64
	assignSession int64
	// faultSince is when the keeper last left the live state (zero while live): crashes
	// since are forgiven once it is back (faultHealed).
	faultSince time.Time

	health   cluster.NodeHealth
	lastSent []byte // the node record last written
	// writes paces the node record's writes (package pace).
	writes pace.Credit
	// pendingSince is when the node record first differed from lastSent (zero: it does
	// not); urgent says a health change is among the differences (see flush).
	pendingSince time.Time
	urgent       bool
	publishTimer *time.Timer // a flush that waits: for a burst's end, or for the write pace
	publishAt    time.Time   // when publishTimer fires; zero when stopped
	sampling     bool
	scraping     bool // a round of job metrics is under way (jobmetrics.go)
	beats        int  // heartbeats so far, to sample memory every sampleEvery

	retry   *time.Timer
	retryAt time.Time

	prepulls  map[string]*prepull // by reference: the assignment's pre-pull list (images.go)
	prepullAt time.Time           // when a retry of failed pre-pulls is due, if one is set
	// prepullTenants names whose credentials pull each pre-pulled image (images.go).
	prepullTenants map[string]string
}

func newRun(ctx context.Context, a *Agent) *run {
	r := &run{
		a:       a,
		ctx:     ctx,
		log:     a.log,
		events:  make(chan func()),
		workers: map[string]*slot{},
		desired: map[string]cluster.WorkerAssignment{},
		began:   time.Now().UTC().Truncate(time.Millisecond),
		health:  cluster.NodeHealth{State: cluster.HealthHealthy},
	}
	r.publishTimer = stoppedTimer()
	r.retry = stoppedTimer()
	return r
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// post hands fn to the loop; it is dropped once the agent is stopping.
func (r *run) post(fn func()) {
	select {
	case r.events <- fn:
	case <-r.ctx.Done():
	}
}

// goOp runs fn in a goroutine the run waits for before returning.
func (r *run) goOp(fn func()) {
	r.ops.Add(1)
	go func() {
		defer r.ops.Done()
		fn()
	}()
}

func (r *run) loop() error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	r.ctx = ctx
	var keeperDone sync.WaitGroup
	defer func() {
		cancel()
		r.ops.Wait()
		keeperDone.Wait()
		r.log.Info("agent stopped; workers keep running while their keeper renews their leases", "workers", len(r.workers))
	}()

	if err := r.adopt(); err != nil {
		return err
	}
	r.publish(true) // the node record the keeper registers
	if r.a.cfg.RestartGrace > 0 {
		k, err := r.a.startKeeper(ctx)
		if err != nil {
			return err
		}
		r.keeper = k
	} else {
		k, err := NewKeeper(KeeperConfig{Node: r.a.cfg.Node.ID, Host: r.a.cfg.Node.Host, StateDir: r.a.cfg.StateDir,
			Store: r.a.cfg.StoreURL, StoreTLS: r.a.cfg.StoreTLS, SessionTimeout: r.a.cfg.SessionTimeout, StoreSilence: r.a.cfg.StoreSilence,
			RejoinGrace: r.a.cfg.RejoinGrace, Logger: r.a.cfg.Logger}, r.a.store)
		if err != nil {
			return err
		}
		r.keeper = k
		keeperDone.Add(1)
		go func() {
			defer keeperDone.Done()
			if err := k.Run(ctx); err != nil && ctx.Err() == nil {
				r.log.Error("keeper stopped", "err", err)
			}
		}()
	}
	if err := r.linkLeases(); err != nil {
		return err
	}

	key, err := cluster.AssignmentKey(r.a.cfg.Node.ID)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	assignments, err := r.a.store.Watch(ctx, key)
	if err != nil {
		return fmt.Errorf("agent: watch assignment: %w", err)
	}
	sessions := r.a.store.SessionEvents(ctx)
	var healthChanged <-chan struct{}
	if h := r.a.cfg.Health; h != nil {
		healthChanged = h.Changed()
		r.health = normalHealth(h.State())
	}

	r.checkKeeper()
	r.log.Info("agent running", "isolation", r.a.modesNow(), "slots", r.a.cfg.Node.Slots, "adopted", len(r.workers))

	heartbeat := time.NewTicker(r.a.cfg.Heartbeat)
	defer heartbeat.Stop()
	keeperTick := time.NewTicker(min(r.a.cfg.Heartbeat, r.a.cfg.SessionTimeout/5))
	defer keeperTick.Stop()
	var scrapeTick <-chan time.Time
	if r.a.scraper != nil {
		t := time.NewTicker(r.a.cfg.MetricsInterval)
		defer t.Stop()
		scrapeTick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-assignments:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("agent: assignment watch ended: %w", coord.ErrClosed)
			}
			r.setAssignment(ev)
		case ev, ok := <-sessions:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("agent: session events ended: %w", coord.ErrClosed)
			}
			r.onSession(ev)
		case <-healthChanged:
			r.onHealth()
		case <-r.publishTimer.C:
			r.publishAt = time.Time{}
		case <-heartbeat.C:
			r.heartbeat()
		case <-keeperTick.C:
			r.checkKeeper()
		case <-scrapeTick:
			r.scrapeRound()
		case <-r.retry.C:
			r.retryAt = time.Time{}
			r.reconcile()
		case fn := <-r.events:
			fn()
		}
		// Whatever the event changed is reported now, or as soon as the burst it belongs
		// to is over.
		r.flush()
	}
}

// setAssignment takes a new version of the node's assignment.
func (r *run) setAssignment(ev coord.Event) {
	desired := map[string]cluster.WorkerAssignment{}
	var prepull []string
	r.assignSession = 0
	if ev.Exists && len(ev.Entry.Value) > 0 {
		var na cluster.NodeAssignment
		if err := json.Unmarshal(ev.Entry.Value, &na); err != nil {
			// Keep running what runs rather than stop everything on a bad write.
			r.log.Error("ignoring unreadable assignment", "err", err)
			return
		}
		r.assignSession = na.Session
		prepull = na.Prepull
		r.prepullTenants = na.PrepullTenants
		for _, wa := range na.Workers {
			id := workerID(r.a.cfg.Node.ID, wa.Key)
			if wa.Stop {
				// A killed job's worker: stop it with the grace the kill asked for.
				if s := r.workers[id]; s != nil && !s.busy {
					s.assign.Grace = wa.Grace
				}
				continue
			}
			desired[id] = wa
		}
	}
	r.log.Debug("assignment", "workers", len(desired), "version", ev.Entry.Version)
	r.desired = desired
	r.syncImages(prepull)
	r.reconcile()
}

// linkLeases makes every active worker's lease a link of the node lease the keeper renews;
// leases written by an agent of an earlier version are files of their own.
func (r *run) linkLeases() error {
	if r.a.cfg.NoLease {
		return nil
	}
	for id, s := range r.workers {
		if s.active() {
			if err := r.a.linkLease(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// adopt takes over the workers the drivers know: left by an earlier agent, or still known to
// a driver this process used before.
func (r *run) adopt() error {
	kept := map[string]bool{}
	for _, mode := range r.a.modesNow() {
		if err := r.adoptMode(mode, false); err != nil {
			return err
		}
	}
	for id := range r.workers {
		kept[id] = true
	}
	ids, err := r.a.recordIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		if kept[id] {
			continue
		}
		// A worker of an isolation whose engine does not answer yet is kept for when it
		// does (AddDriver adopts it then).
		if rec, ok, _ := r.a.readRecord(id); ok && slices.Contains(r.a.cfg.LateIsolation, rec.Isolation) && r.a.driver(rec.Isolation) == nil {
			kept[id] = true // and its secrets with it
			continue
		}
		_ = r.a.removeRecord(id)
		_ = r.a.removeLease(id)
	}
	r.a.sweepSecrets(kept)
	return nil
}

// adoptMode adopts the workers one driver knows. engineBack says the driver's engine was
// away until now (AddDriver): a worker that ended meanwhile was stopped with it, not by a
// crash of its own.
func (r *run) adoptMode(mode string, engineBack bool) error {
	drv := r.a.driver(mode)
	if _, err := drv.Adopt(r.ctx); err != nil {
		return fmt.Errorf("agent: adopt %s workers: %w", mode, err)
	}
	ws, err := drv.List(r.ctx)
	if err != nil {
		return fmt.Errorf("agent: list %s workers: %w", mode, err)
	}
	for _, w := range ws {
		if w.Spec.Node != r.a.cfg.Node.ID {
			continue // another agent's, on a shared docker engine
		}
		if s := r.workers[w.Spec.ID]; s != nil && (s.busy || s.active()) {
			continue // started meanwhile through this very driver
		}
		if err := r.adoptOne(mode, w); err != nil {
			return err
		}
		if s := r.workers[w.Spec.ID]; engineBack && s != nil && s.state == cluster.WorkerBackoff {
			s.restarts--
			s.recent = s.recent[:len(s.recent)-1]
			s.exitReason, s.state, s.lastExit = cluster.ExitStopped, "", "stopped while the "+mode+" engine was away (not counted as a crash)"
		}
	}
	return nil
}

func normalHealth(h cluster.NodeHealth) cluster.NodeHealth {
	if h.State == "" {
		h.State = cluster.HealthHealthy
	}
	return h
}

// onHealth takes a change of health, which flush publishes without waiting for starts.
func (r *run) onHealth() {
	h := normalHealth(r.a.cfg.Health.State())
	if h == r.health {
		return
	}
	r.log.Info("health changed", "state", h.State, "throttled", h.Throttled, "reason", h.Reason)
	r.health = h
	r.urgent = true
	r.updateMetrics()
}

var errNoDriver = errors.New("isolation not offered by this node")
