package coord

import (
	"context"
	"errors"
	"fmt"

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

// WatchFunc implements FuncWatcher.
func (s *ZK) WatchFunc(ctx context.Context, key string, fn func(Event), done func()) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("coord: watch %s: %w", key, err)
	}
	wctx, end := s.goroutineContext(ctx)
	go func() {
		defer end()
		if done != nil {
			defer done()
		}
		watchDataFunc(wctx, s, key, func(ev Event) bool { fn(ev); return wctx.Err() == nil }, s.log)
	}()
	return nil
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
	p := s.path(key)
	for {
		r, err := read(ctx, s, func() (getWResult, error) {
			d, st, ch, err := s.conn.GetW(p)
			return getWResult{d, st, ch}, err
		})
		if err == nil {
			return entryFromStat(key, r.data, r.st), true, s.waiter(r.ch), nil
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
			return Entry{}, false, s.waiter(x.ch), nil
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
