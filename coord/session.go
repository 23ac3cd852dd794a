package coord

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// sessionHub fans session events out to subscribers without ever dropping one: each
// subscriber has an unbounded queue drained by its own goroutine, owned by the hub.
type sessionHub struct {
	mu     sync.Mutex
	subs   map[*sessionSub]struct{}
	done   chan struct{}
	closed bool
	wg     sync.WaitGroup
}

type sessionSub struct {
	queue []SessionEvent
	wake  chan struct{}
}

func newSessionHub() *sessionHub {
	return &sessionHub{subs: map[*sessionSub]struct{}{}, done: make(chan struct{})}
}

func (h *sessionHub) subscribe(ctx context.Context) <-chan SessionEvent {
	out := make(chan SessionEvent)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(out)
		return out
	}
	sub := &sessionSub{wake: make(chan struct{}, 1)}
	h.subs[sub] = struct{}{}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(out)
		defer func() {
			h.mu.Lock()
			delete(h.subs, sub)
			h.mu.Unlock()
		}()
		for {
			h.mu.Lock()
			var ev SessionEvent
			have := len(sub.queue) > 0
			if have {
				ev = sub.queue[0]
				sub.queue = sub.queue[1:]
			}
			h.mu.Unlock()
			if !have {
				select {
				case <-sub.wake:
					continue
				case <-ctx.Done():
					return
				case <-h.done:
					return
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			case <-h.done:
				return
			}
		}
	}()
	return out
}

func (h *sessionHub) publish(ev SessionEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for sub := range h.subs {
		sub.queue = append(sub.queue, ev)
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	}
}

func (h *sessionHub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// readyGate tracks whether a client has a usable session and lets callers wait for one.
type readyGate struct {
	mu     sync.Mutex
	ready  bool
	ch     chan struct{} // closed when ready becomes true
	closed chan struct{}
}

func newReadyGate(closed chan struct{}) *readyGate {
	return &readyGate{ch: make(chan struct{}), closed: closed}
}

func (g *readyGate) set(ready bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ready == g.ready {
		return
	}
	g.ready = ready
	if ready {
		close(g.ch)
	} else {
		g.ch = make(chan struct{})
	}
}

// isReady reports whether the gate is ready now.
func (g *readyGate) isReady() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ready
}

// wait blocks until the gate is ready, ctx is done (ctx.Err()) or the client closes
// (ErrClosed).
func (g *readyGate) wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	select {
	case <-g.closed:
		return ErrClosed
	default:
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-g.closed:
		return ErrClosed
	}
}

// rawEphemerals is what restoreOwned needs from a client: operations that do not touch the
// client's record of owned entries.
type rawEphemerals interface {
	createEphemeral(ctx context.Context, key string, value []byte) error
	get(ctx context.Context, key string) (Entry, error)
	delete(ctx context.Context, key string, version int64) error
}

// restoreOwned re-creates owned ephemeral entries under session cur. An entry still held by
// one of this client's earlier sessions (mine: the old node may linger until the server has
// finished expiring it) is deleted and re-created; one held by another client's session is
// reported lost.
func restoreOwned(life context.Context, r rawEphemerals, owned map[string][]byte, cur int64,
	timeout time.Duration, mine func(int64) bool) (restored, lost []string) {
	for _, key := range slices.Sorted(maps.Keys(owned)) {
		ctx, cancel := context.WithTimeout(life, timeout)
		err := recreate(ctx, r, key, owned[key], cur, mine)
		cancel()
		if err != nil {
			lost = append(lost, key)
			continue
		}
		restored = append(restored, key)
	}
	return restored, lost
}

var errOwnedElsewhere = errors.New("held by another client's session")

func recreate(ctx context.Context, r rawEphemerals, key string, value []byte, cur int64, mine func(int64) bool) error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = r.createEphemeral(ctx, key, value); err == nil {
			return nil
		}
		switch {
		case errors.Is(err, ErrExists):
			e, gerr := r.get(ctx, key)
			switch {
			case errors.Is(gerr, ErrNotFound):
				continue
			case gerr != nil:
				err = gerr
			case e.Owner == cur:
				return nil
			case !mine(e.Owner):
				return errOwnedElsewhere
			default:
				err = r.delete(ctx, key, e.Version)
				if err == nil || errors.Is(err, ErrNotFound) {
					continue
				}
			}
		case isUnavailable(err):
		default:
			return err
		}
		if err := ctxtime.Sleep(ctx, retryPause); err != nil {
			return err
		}
	}
	return err
}

// Redial makes s leave the server it talks to for another of the store's, within its
// session, where it has several (a ZooKeeper ensemble); otherwise it does nothing.
func Redial(s Store) {
	if r, ok := s.(interface{ Redial() }); ok {
		r.Redial()
	}
}

// redialApart is Redial for a server found apart from its ensemble: it showed key, which
// the ensemble's leader said a moment before was gone.
func redialApart(s Store, key string) {
	if r, ok := s.(interface{ redial(why, key string) }); ok {
		r.redial("the server shows an entry the ensemble's leader does not have", key)
	}
}

// GrantedSessionTimeout is the session timeout the store granted s's current session, 0
// when unknown (no session yet, or a Store that does not say). ZooKeeper may grant less
// than was asked (its maxSessionTimeout); whatever is bound to the session (worker leases)
// must last no longer than the granted value.
func GrantedSessionTimeout(s Store) time.Duration {
	if g, ok := s.(interface{ GrantedSessionTimeout() time.Duration }); ok {
		return g.GrantedSessionTimeout()
	}
	return 0
}
