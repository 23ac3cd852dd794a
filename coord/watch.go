package coord

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// waitFunc blocks until an armed one-shot watch fires (nil) or ctx is done (ctx.Err()).
type waitFunc func(ctx context.Context) error

// armer is what an implementation provides for the shared watch loops: read the current
// state and arm a one-shot notification of the next change, atomically.
type armer interface {
	armData(ctx context.Context, key string) (Entry, bool, waitFunc, error)
	armChildren(ctx context.Context, key string) (ChildrenEvent, waitFunc, error)
}

// retryPause is how long the watch loops wait before re-reading after a failed read.
const retryPause = 50 * time.Millisecond

// watchData runs until ctx is done, sending the key's state after every change. It closes
// out when it returns.
func watchData(ctx context.Context, a armer, key string, out chan<- Event, log *slog.Logger) {
	defer close(out)
	watchDataFunc(ctx, a, key, func(ev Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}, log)
}

// watchDataFunc is watchData handing each state to emit, which returns false to stop.
func watchDataFunc(ctx context.Context, a armer, key string, emit func(Event) bool, log *slog.Logger) {
	var last Event
	first := true
	for {
		e, exists, wait, err := a.armData(ctx, key)
		if err != nil {
			if !pauseAfter(ctx, err, key, log) {
				return
			}
			continue
		}
		ev := Event{Key: key, Exists: exists}
		if exists {
			ev.Entry = e
		}
		if first || !sameEvent(last, ev) {
			if !emit(ev) {
				return
			}
			last, first = revisions(ev), false
		}
		if wait(ctx) != nil {
			return
		}
	}
}

// FuncWatcher is a Watcher that can also hand a key's states to a function: it spares the
// channel's reader a goroutine of its own, which counts for a master that watches every
// node's entry of a large cluster.
type FuncWatcher interface {
	// WatchFunc calls fn, one call at a time (not always from the same goroutine), with
	// the states Watch would send, until ctx is done or the store closes; then, once fn has
	// returned for the last time, done (which may be nil).
	WatchFunc(ctx context.Context, key string, fn func(Event), done func()) error
}

// watchChildren is watchData for a key's children.
func watchChildren(ctx context.Context, a armer, key string, out chan<- ChildrenEvent, log *slog.Logger) {
	defer close(out)
	var last ChildrenEvent
	first := true
	for {
		ev, wait, err := a.armChildren(ctx, key)
		if err != nil {
			if !pauseAfter(ctx, err, key, log) {
				return
			}
			continue
		}
		ev.Key = key
		if first || last.Exists != ev.Exists || last.Version != ev.Version || !slices.Equal(last.Children, ev.Children) {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
			last, first = ev, false
		}
		if wait(ctx) != nil {
			return
		}
	}
}

// pauseAfter logs a failed watch read and waits a little; false means stop watching.
func pauseAfter(ctx context.Context, err error, key string, log *slog.Logger) bool {
	if ctx.Err() != nil || errors.Is(err, ErrClosed) {
		return false
	}
	if !isUnavailable(err) {
		log.Warn("coord: watch read failed", "key", key, "err", err)
	}
	return ctxtime.Sleep(ctx, retryPause) == nil
}

// sameEvent reports whether two states of a key are one. A revision names one write, so
// equal revisions mean equal values: a watch compares revisions, and keeps those of the last
// state it handed out (revisions), never a copy of its value, which for a master watching
// every node was a second copy of every record.
func sameEvent(a, b Event) bool {
	if a.Exists != b.Exists {
		return false
	}
	if !a.Exists {
		return true
	}
	return a.Entry.CreateRev == b.Entry.CreateRev && a.Entry.ModRev == b.Entry.ModRev &&
		a.Entry.Version == b.Entry.Version
}

// revisions is ev without its value: what a watch keeps of the last state it handed out.
func revisions(ev Event) Event {
	ev.Entry.Value = nil
	return ev
}
