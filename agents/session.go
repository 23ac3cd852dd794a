package agents

import (
	"slices"
	"time"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// The agent never fences on its own session: its keeper holds the node's liveness and the
// workers' leases (see Keeper), and a worker whose lease lapses is stopped by its launcher.
// What the agent decides is when it may act on its assignment:
//
//   - only on an assignment the master stamped with the keeper's current session, that is
//     one written after the master saw the node as it is registered now. After the node's
//     session was lost, the assignment the agent last read may list workers the master has
//     since placed elsewhere; acting on it would run them twice until the next write. Until
//     the master stamps the node's assignment anew, the agent starts and stops nothing;
//   - workers are (re)started only while the keeper keeps their leases: not once they lapse.

// gate says what the agent may do now.
type gate struct {
	current bool // the assignment is stamped with the keeper's session
	canRun  bool // the keeper renews leases: workers may be started
}

func (r *run) gate() gate {
	st := r.keeper.Status()
	g := gate{current: st.Session != 0 && r.assignSession == st.Session}
	if r.a.cfg.NoLease {
		g.canRun = st.Session != 0
		return g
	}
	// The keeper's word is not enough: after a pause of the node (its keeper stopped too)
	// its status still says live, with the session it had. The lease itself says whether a
	// worker started now may run.
	now := leasefile.Now()
	g.canRun = st.canRun(now) && r.a.leaseValid(now)
	return g
}

// onSession logs the agent's own store session: it holds nothing the node's liveness depends
// on, and its watches survive reconnects and expiry.
func (r *run) onSession(ev coord.SessionEvent) {
	switch ev.Type {
	case coord.SessionDisconnected:
		r.log.Warn("store disconnected: workers keep running", "session", ev.SessionID)
	case coord.SessionReconnected:
		r.log.Info("store reconnected", "session", ev.SessionID)
	case coord.SessionExpired:
		r.log.Warn("agent's store session expired: a new one follows", "session", ev.SessionID)
		r.a.metrics.sessionsLost.WithLabelValues("agent").Inc()
	case coord.SessionNew:
		r.log.Info("new store session", "session", ev.SessionID)
	}
}

// checkKeeper reconciles when the keeper's session or state changed (the loop then publishes
// what that changed), and touches agent.alive so that the keeper knows the agent runs.
func (r *run) checkKeeper() {
	if r.a.cfg.RestartGrace > 0 {
		now := time.Now()
		if err := touch(r.a.aliveFile(), now); err != nil {
			r.log.Warn("tell the keeper the agent runs", "err", err)
		}
	}
	st := r.keeper.Status()
	r.a.noteGranted(st.Granted.Std(), "keeper")
	if d := st.Writes - r.keeperWrites; d > 0 {
		r.a.metrics.storeWrites.Add(float64(d))
	}
	r.keeperWrites = st.Writes
	if st.Session == r.keeperSeen.Session && st.State == r.keeperSeen.State {
		return
	}
	if st.State != r.keeperSeen.State {
		r.log.Info("keeper state", "state", st.State, "session", st.Session, "detail", st.Detail)
	}
	if r.keeperSeen.Session != 0 && st.Session != r.keeperSeen.Session {
		// The node's session ended: the master saw the node lost (and back).
		r.a.metrics.sessionsLost.WithLabelValues("keeper").Inc()
	}
	if st.State != KeeperLive && r.keeperSeen.State == KeeperLive && r.faultSince.IsZero() {
		r.faultSince = time.Now()
	}
	if st.State == KeeperLive && !r.faultSince.IsZero() {
		r.faultHealed(r.faultSince)
		r.faultSince = time.Time{}
	}
	r.keeperSeen = st
	r.reconcile()
}

// faultHealed resets the crash-loop backoff of workers that crashed while the node was cut
// off from the store, now that it answers again: workers that need the store (routers, a
// job's own use of ZooKeeper) crash while it is gone, through no fault of their own, and
// would otherwise wait out backoffs of up to a minute, and be counted towards the masters'
// avoiding the node, after the fault healed. Crashes from a lease ttl before the fault on
// are forgiven: a worker notices a lost store before its keeper gives up on it.
func (r *run) faultHealed(since time.Time) {
	cut := since.Add(-r.a.leaseTTL())
	now := time.Now()
	n := 0
	for _, s := range r.workers {
		before := len(s.recent)
		s.recent = slices.DeleteFunc(s.recent, func(t time.Time) bool { return !t.Before(cut) })
		if len(s.recent) == before {
			continue
		}
		s.quick = min(s.quick, len(s.recent))
		n++
		if s.state == cluster.WorkerBackoff && !s.busy {
			s.retryAt = now
		}
	}
	if n > 0 {
		r.log.Info("store back: crash-loop backoff reset for workers that crashed during the fault", "workers", n,
			"fault", now.Sub(since).Round(time.Millisecond))
		r.urgent = true // the loop publishes it after this event
	}
}
