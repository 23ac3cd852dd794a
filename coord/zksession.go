package coord

import (
	"context"
	"maps"

	"github.com/go-zookeeper/zk"
)

// onEvent is the zk event callback. It must not block: it queues the event for
// sessionLoop.
func (s *ZK) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	s.evMu.Lock()
	s.evQ = append(s.evQ, ev)
	s.evMu.Unlock()
	select {
	case s.evWake <- struct{}{}:
	default:
	}
}

// sessionLoop turns zk connection states into SessionEvents, opens the gate for requests
// while a session is usable and re-creates this client's ephemeral entries after expiry.
func (s *ZK) sessionLoop() {
	defer s.wg.Done()
	var (
		sid          int64 // the session we last had
		disconnected bool  // SessionDisconnected published since
		expired      bool  // SessionExpired published for sid
	)
	for {
		s.evMu.Lock()
		q := s.evQ
		s.evQ = nil
		s.evMu.Unlock()
		if len(q) == 0 {
			select {
			case <-s.evWake:
				continue
			case <-s.closed:
				return
			}
		}
		for _, ev := range q {
			switch ev.State {
			case zk.StateHasSession:
				cur := s.conn.SessionID()
				s.mu.Lock()
				s.sids[cur] = true
				s.mu.Unlock()
				switch {
				case sid == 0:
					s.log.Info("coord: zookeeper session established", "session", sessionHex(cur), "server", ev.Server)
					sid = cur
					s.gate.set(true)
				case cur == sid:
					s.gate.set(true)
					if disconnected {
						s.log.Info("coord: zookeeper reconnected", "session", sessionHex(cur), "server", ev.Server)
						s.hub.publish(SessionEvent{Type: SessionReconnected, SessionID: cur})
					}
				default:
					if !expired {
						s.hub.publish(SessionEvent{Type: SessionExpired, SessionID: sid})
					}
					old := sid
					sid = cur
					s.gate.set(true)
					restored, lost := s.restore(old, cur)
					s.log.Warn("coord: new zookeeper session after expiry", "old", sessionHex(old),
						"session", sessionHex(cur), "restored", restored, "lost", lost)
					s.hub.publish(SessionEvent{Type: SessionNew, SessionID: cur, Restored: restored, Lost: lost})
				}
				disconnected, expired = false, false
			case zk.StateDisconnected:
				s.gate.set(false)
				if sid != 0 && !disconnected && !expired {
					s.log.Warn("coord: zookeeper disconnected", "session", sessionHex(sid))
					disconnected = true
					s.hub.publish(SessionEvent{Type: SessionDisconnected, SessionID: sid})
				}
			case zk.StateExpired:
				s.gate.set(false)
				if sid != 0 && !expired {
					s.log.Warn("coord: zookeeper session expired", "session", sessionHex(sid))
					expired = true
					s.hub.publish(SessionEvent{Type: SessionExpired, SessionID: sid})
				}
			case zk.StateAuthFailed:
				s.log.Error("coord: zookeeper authentication failed", "server", ev.Server)
			}
		}
	}
}

// restore re-creates the ephemeral entries this client owns under the new session cur.
func (s *ZK) restore(old, cur int64) (restored, lost []string) {
	s.mu.Lock()
	owned := maps.Clone(s.owned)
	s.mu.Unlock()
	restored, lost = restoreOwned(s.life, zkRaw{s}, owned, cur, s.opts.SessionTimeout, func(id int64) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.sids[id]
	})
	s.mu.Lock()
	for _, k := range lost {
		delete(s.owned, k)
	}
	s.mu.Unlock()
	for _, k := range lost {
		s.log.Warn("coord: could not re-create ephemeral entry", "key", k, "old", sessionHex(old))
	}
	return restored, lost
}

type zkRaw struct{ s *ZK }

func (r zkRaw) createEphemeral(ctx context.Context, key string, value []byte) error {
	_, err := r.s.create(ctx, key, value, Ephemeral)
	return err
}

func (r zkRaw) get(ctx context.Context, key string) (Entry, error) { return r.s.Get(ctx, key) }

func (r zkRaw) delete(ctx context.Context, key string, version int64) error {
	return r.s.delete(ctx, key, int32(version))
}

func sessionHex(id int64) string {
	const digits = "0123456789abcdef"
	u := uint64(id)
	b := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		b[i] = digits[u&0xf]
		u >>= 4
	}
	return "0x" + string(b)
}
