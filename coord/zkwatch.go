package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-zookeeper/zk"
)

// Watch implements Watcher. ZooKeeper watches fire once: the loop re-arms them by re-reading
// after every fire, and after a session expiry (the watch is dropped with EventNotWatching)
// it re-arms on the next session.
func (s *ZK) Watch(ctx context.Context, key string) (<-chan Event, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: watch %s: %w", key, err)
	}
	out := make(chan Event)
	wctx, done := s.goroutineContext(ctx)
	go func() {
		defer done()
		watchData(wctx, s, key, out, s.log)
	}()
	return out, nil
}

// WatchFunc implements FuncWatcher. Between changes no goroutine waits for the key: the
// watch's firing (zk.Conn.OnWatch) starts one that reads and re-arms it, calls fn when the
// state changed, and ends (see funcWatch).
func (s *ZK) WatchFunc(ctx context.Context, key string, fn func(Event), done func()) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("coord: watch %s: %w", key, err)
	}
	wctx, end := s.goroutineContext(ctx)
	w := &funcWatch{s: s, key: key, ctx: wctx, fn: fn, done: done, end: end, first: true, running: true}
	w.stop = context.AfterFunc(wctx, w.stopped)
	go w.step()
	return nil
}

// funcWatch follows one key for WatchFunc. At most one goroutine runs it at a time (running),
// from the arming of the watch to the call of fn; none while the watch is armed. Its end (ctx
// done) calls done and end once, after fn's last call: from the goroutine running it, or from
// ctx's AfterFunc when none does.
type funcWatch struct {
	s        *ZK
	key      string
	ctx      context.Context
	fn       func(Event)
	done     func()
	end      func()
	stop     func() bool
	last     Event
	first    bool
	mu       sync.Mutex
	running  bool
	finished bool
}

// step reads and re-arms the key until the watch is armed (and returns: its firing starts the
// next step) or ctx ends.
func (w *funcWatch) step() {
	for {
		if w.ctx.Err() != nil {
			w.finish()
			return
		}
		e, exists, ch, err := w.s.armDataCh(w.ctx, w.key)
		if err != nil {
			if !pauseAfter(w.ctx, err, w.key, w.s.log) {
				w.finish()
				return
			}
			continue
		}
		ev := Event{Key: w.key, Exists: exists}
		if exists {
			ev.Entry = e
		}
		if w.first || !sameEvent(w.last, ev) {
			if w.ctx.Err() != nil {
				w.finish()
				return
			}
			w.fn(ev)
			w.last, w.first = revisions(ev), false
		}
		// Idle from here: the watch's firing starts the next step. Marked before it is
		// registered, as the firing may come at once, from the receive loop.
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
		if w.s.conn.OnWatch(ch, w.fired) {
			if w.ctx.Err() != nil {
				w.stopped() // ctx ended while this step ran: its AfterFunc found it running
			}
			return
		}
		// The watch fired already: go on here, as its firing would.
		if !w.claim() {
			return
		}
		fired := <-ch
		if !w.afterFire(fired) {
			w.finish()
			return
		}
		w.deleted(fired)
	}
}

// fired is the watch's OnWatch function, called from the connection's receive loop: it must
// not block.
func (w *funcWatch) fired(ev zk.Event) {
	if !w.claim() {
		return
	}
	go func() {
		if !w.afterFire(ev) {
			w.finish()
			return
		}
		w.deleted(ev)
		w.step()
	}()
}

// deleted tells fn of a deletion the watch's firing reported, before the read that re-arms
// the watch: a data center's records vanish together (2,500 of them at ten thousand nodes),
// and a read each, queued behind everything else the client sends, held the master's view
// of the loss back by seconds. The read that follows still sees a re-creation.
func (w *funcWatch) deleted(ev zk.Event) {
	if ev.Type != zk.EventNodeDeleted || w.ctx.Err() != nil {
		return
	}
	gone := Event{Key: w.key}
	if !w.first && !sameEvent(w.last, gone) {
		w.fn(gone)
		w.last = gone
	}
}

// afterFire waits, for a dropped watch, for the next session; it reports whether to go on.
func (w *funcWatch) afterFire(ev zk.Event) bool {
	if ev.Type == zk.EventNotWatching {
		return w.s.gate.wait(w.ctx) == nil
	}
	return w.ctx.Err() == nil
}

// claim marks the watch running for the goroutine about to step it; false when it has
// finished.
func (w *funcWatch) claim() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.finished {
		return false
	}
	w.running = true
	return true
}

// stopped ends an idle watch once ctx is done; a running one ends at its next look at ctx.
func (w *funcWatch) stopped() {
	w.mu.Lock()
	idle := !w.running && !w.finished
	if idle {
		w.running = true // this call finishes it
	}
	w.mu.Unlock()
	if idle {
		w.finish()
	}
}

// finish ends the watch, once: done, then the client's count of running watches.
func (w *funcWatch) finish() {
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	w.finished, w.running = true, false
	w.mu.Unlock()
	w.stop()
	if w.done != nil {
		w.done()
	}
	w.end()
}

// WatchChildren implements Watcher.
func (s *ZK) WatchChildren(ctx context.Context, key string) (<-chan ChildrenEvent, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: watch children %s: %w", key, err)
	}
	out := make(chan ChildrenEvent)
	wctx, done := s.goroutineContext(ctx)
	go func() {
		defer done()
		watchChildren(wctx, s, key, out, s.log)
	}()
	return out, nil
}

// goroutineContext returns a context cancelled by ctx or Close, and registers a goroutine
// with the client's WaitGroup; the goroutine must call done when it ends.
func (s *ZK) goroutineContext(ctx context.Context) (context.Context, func()) {
	return s.gs.start(ctx, s.life)
}

// waiter waits for a zk watch channel. A dropped watch (session expired, client closing)
// also counts as a fire, after the next session is there, so the loop re-reads and re-arms.
func (s *ZK) waiter(ch <-chan zk.Event) waitFunc {
	return func(ctx context.Context) error {
		select {
		case ev := <-ch:
			if ev.Type == zk.EventNotWatching {
				return s.gate.wait(ctx)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type getWResult struct {
	data []byte
	st   *zk.Stat
	ch   <-chan zk.Event
}

type existsWResult struct {
	ok bool
	st *zk.Stat
	ch <-chan zk.Event
}

func (s *ZK) armData(ctx context.Context, key string) (Entry, bool, waitFunc, error) {
	e, ok, ch, err := s.armDataCh(ctx, key)
	if err != nil {
		return Entry{}, false, nil, err
	}
	return e, ok, s.waiter(ch), nil
}

// armDataCh reads key and sets a watch on it: on its data when it exists, on its creation
// otherwise; ch is the watch's channel.
func (s *ZK) armDataCh(ctx context.Context, key string) (Entry, bool, <-chan zk.Event, error) {
	p := s.path(key)
	for {
		r, err := read(ctx, s, func() (getWResult, error) {
			d, st, ch, err := s.conn.GetW(p)
			return getWResult{d, st, ch}, err
		})
		if err == nil {
			return entryFromStat(key, r.data, r.st), true, r.ch, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return Entry{}, false, nil, err
		}
		x, err := read(ctx, s, func() (existsWResult, error) {
			ok, st, ch, err := s.conn.ExistsW(p)
			return existsWResult{ok, st, ch}, err
		})
		if err != nil {
			return Entry{}, false, nil, err
		}
		if !x.ok {
			return Entry{}, false, x.ch, nil
		}
		// Created between the two reads: read it again. The exists watch stays registered
		// in zk until the key next changes, which is harmless.
	}
}

type childrenWResult struct {
	kids []string
	st   *zk.Stat
	ch   <-chan zk.Event
}

func (s *ZK) armChildren(ctx context.Context, key string) (ChildrenEvent, waitFunc, error) {
	p := s.path(key)
	for {
		r, err := read(ctx, s, func() (childrenWResult, error) {
			k, st, ch, err := s.conn.ChildrenW(p)
			return childrenWResult{k, st, ch}, err
		})
		if err == nil {
			ev := ChildrenEvent{Exists: true, Children: s.cleanChildren(key, r.kids)}
			if r.st != nil {
				ev.Version = int64(r.st.Cversion)
			}
			return ev, s.waiter(r.ch), nil
		}
		if !errors.Is(err, ErrNotFound) {
			return ChildrenEvent{}, nil, err
		}
		x, err := read(ctx, s, func() (existsWResult, error) {
			ok, st, ch, err := s.conn.ExistsW(p)
			return existsWResult{ok, st, ch}, err
		})
		if err != nil {
			return ChildrenEvent{}, nil, err
		}
		if !x.ok {
			return ChildrenEvent{Exists: false, Children: []string{}}, s.waiter(x.ch), nil
		}
	}
}
