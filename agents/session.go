package agents

import (
	"time"

	"github.com/stormdock/stormdock/coord"
)

// The node's entry lives as long as the agent's store session. When the session is lost the
// master treats the node as dead and re-places its workers, so the agent stops them at once:
// when it learns of the expiry, or, cut off from the store, once it has been disconnected for
// the session timeout (a partitioned ZooKeeper client only learns of its expiry when it gets
// back). It also stops renewing the leases, so a worker it fails to stop stops by itself.

func (r *run) onSession(ev coord.SessionEvent) {
	switch ev.Type {
	case coord.SessionDisconnected:
		r.log.Warn("store disconnected", "session", ev.SessionID)
		if r.disconnectedAt.IsZero() {
			r.disconnectedAt = time.Now()
			r.disconnect.Reset(r.a.cfg.SessionTimeout)
		}
	case coord.SessionReconnected:
		r.log.Info("store reconnected, session kept", "session", ev.SessionID)
		r.disconnectedAt = time.Time{}
		r.disconnect.Stop()
		if r.suspended == suspendPartition {
			r.resume()
		}
	case coord.SessionExpired:
		r.disconnectedAt = time.Time{}
		r.disconnect.Stop()
		r.suspend(suspendExpired)
	case coord.SessionNew:
		r.log.Info("new store session", "session", ev.SessionID, "restored", ev.Restored, "lost", ev.Lost)
		r.disconnectedAt = time.Time{}
		r.disconnect.Stop()
		r.resume()
	}
}

// checkDisconnected suspends the node once a disconnection has lasted the session timeout.
func (r *run) checkDisconnected() {
	if r.disconnectedAt.IsZero() || r.suspended != "" {
		return
	}
	if d := time.Since(r.disconnectedAt); d < r.a.cfg.SessionTimeout {
		r.disconnect.Reset(r.a.cfg.SessionTimeout - d)
		return
	}
	r.suspend(suspendPartition)
}

// suspend stops every worker and the lease renewals until the session is back.
func (r *run) suspend(reason string) {
	if r.suspended == "" {
		r.log.Warn("session lost: stopping all workers", "reason", reason, "workers", len(r.workers))
	}
	r.suspended = reason
	r.reconcile()
}

// resume reconciles against the assignment as it is now and rewrites the node record: the
// store re-created the entry with the last value written under the old session.
func (r *run) resume() {
	if r.suspended != "" {
		r.log.Info("session back: reconciling", "was", r.suspended)
	}
	r.suspended = ""
	r.reconcile()
	r.renewLeases()
	r.publish(true)
}
