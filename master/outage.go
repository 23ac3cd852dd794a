package master

import (
	"context"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// A store outage, or a change of leader, is not the loss of every node. When every ZooKeeper
// server was paused, the ensemble may expire every session at once as it resumes; a new
// leader may start before the agents' keepers have re-registered. So for ReregisterGrace
// after the master starts leading, and after its store connection comes back, the workers of
// a node whose entry is missing stay where they are (Nomad gives clients a longer heartbeat
// grace after a leader election for the same reason). Outside those windows a node whose
// entry vanished is lost at once.

// DefaultReregisterGrace is Config.ReregisterGrace's default.
const DefaultReregisterGrace = 10 * time.Second

// storeState is what the master knows of its store connection.
type storeState struct {
	down       time.Time // disconnected since; zero while connected
	graceUntil time.Time // nodes missing until then are waited for
}

// startGrace opens a re-registration window from now.
func (m *Master) startGrace(why string) {
	until := time.Now().Add(m.cfg.ReregisterGrace)
	m.mu.Lock()
	if until.After(m.conn.graceUntil) {
		m.conn.graceUntil = until
	}
	m.mu.Unlock()
	m.log.Info("nodes get time to re-register before their workers move", "why", why, "grace", m.cfg.ReregisterGrace)
	// Plan again once it is over: a node still missing then is lost.
	time.AfterFunc(m.cfg.ReregisterGrace+10*time.Millisecond, m.poke)
}

// inGrace reports whether missing nodes are still waited for.
func (m *Master) inGrace() (bool, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now().Before(m.conn.graceUntil), m.conn.graceUntil
}

// holdAbsent keeps the workers of nodes missing from the store where they are during a
// re-registration window.
func (m *Master) holdAbsent(v *View, keep []cluster.Placement) map[cluster.WorkerKey]string {
	in, until := m.inGrace()
	if !in {
		return nil
	}
	hold := map[cluster.WorkerKey]string{}
	for _, p := range keep {
		if _, alive := v.nodes[p.Node]; !alive {
			hold[p.Key()] = fmt.Sprintf("waiting: node %s has not re-registered since the store came back or the master started leading; its workers stay until %s",
				p.Node, until.UTC().Format(time.RFC3339))
		}
	}
	return hold
}

// watchStore follows the master's store session: it opens a re-registration window when the
// connection comes back, and tells the API whether the store can be reached.
func (m *Master) watchStore(ctx context.Context) {
	for ev := range m.store.SessionEvents(ctx) {
		switch ev.Type {
		case coord.SessionExpired:
			m.metrics.sessionsLost.Inc()
		case coord.SessionDisconnected:
			m.metrics.storeConnected.Set(0)
			m.mu.Lock()
			if m.conn.down.IsZero() {
				m.conn.down = time.Now()
			}
			m.mu.Unlock()
			m.log.Warn("store disconnected: placement stops until it is back; running workers are not affected")
		case coord.SessionReconnected, coord.SessionNew:
			m.metrics.storeConnected.Set(1)
			m.mu.Lock()
			was := m.conn.down
			m.conn.down = time.Time{}
			leader := m.leader
			m.mu.Unlock()
			if !was.IsZero() || ev.Type == coord.SessionNew {
				m.log.Info("store back", "after", time.Since(was).Round(time.Millisecond), "event", ev.Type.String())
				if leader {
					m.startGrace("store back")
				}
			}
		}
	}
}

// StoreUnavailable says why the API cannot serve, or "" when the store can be reached.
func (m *Master) StoreUnavailable() string {
	m.mu.Lock()
	down := m.conn.down
	m.mu.Unlock()
	if down.IsZero() {
		return ""
	}
	return fmt.Sprintf("store unavailable: master %s has not reached the coordination store for %s; running workers keep running, nothing new is placed until it is back",
		m.cfg.ID, time.Since(down).Round(100*time.Millisecond))
}
