package coord

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// ErrContended is returned by Retry and Update when every attempt met a concurrent writer.
// Nothing was written; the caller may try again later (an API answers it with 503).
var ErrContended = errors.New("coord: too many concurrent writers")

// Bounds of Retry: a read-modify-write that conflicts this often is contended by more than
// a few writers, and a caller is better served by an answer than by a longer wait. The
// pauses between attempts grow from retryBase to retryMax (a quarter second in all at most),
// each a random fraction of that, so that writers that collided do not collide again in
// step.
const (
	retryAttempts = 8
	retryBase     = 2 * time.Millisecond
	retryMax      = 100 * time.Millisecond
)

// Retry runs attempt, a read-modify-write whose write is conditional on what it read
// (compare-and-set, a transaction of Check and versioned ops), until it returns nil or an
// error that does not wrap ErrConflict. An attempt signals that another writer got in
// between by returning an error wrapping ErrConflict; it must read afresh each time. After
// a bounded number of conflicts Retry returns an error wrapping ErrContended; when ctx ends
// between attempts it returns ctx's error. Other errors are returned as attempt gave them.
func Retry(ctx context.Context, attempt func() error) error {
	return retry(ctx, func() (bool, error) {
		err := attempt()
		return errors.Is(err, ErrConflict), err
	})
}

// Update is a read-modify-write of one key: it reads key, passes its value to change
// (exists false when the key is missing) and writes what change returns, with
// compare-and-set at the version read, or, for a missing key, by creating it (persistent,
// with missing parents). When another writer changed, created or deleted the key in
// between, it starts over from the read, as Retry does, so no concurrent update is lost.
// change may run several times and must not keep state across calls; an error from it
// ends Update and is returned as it is (wrap a sentinel there to tell "no such record"
// from store failures). Update returns the key's new version.
func Update(ctx context.Context, kv KV, key string, change func(cur []byte, exists bool) ([]byte, error)) (int64, error) {
	var version int64
	err := retry(ctx, func() (bool, error) {
		e, err := kv.Get(ctx, key)
		exists := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return false, fmt.Errorf("coord: update %s: %w", key, err)
		}
		next, err := change(e.Value, exists)
		if err != nil {
			return false, err
		}
		if exists {
			version, err = kv.Put(ctx, key, next, e.Version)
		} else {
			version = 0
			_, err = kv.Create(ctx, key, next, Persistent)
		}
		switch {
		case err == nil:
			return false, nil
		case errors.Is(err, ErrConflict), errors.Is(err, ErrExists), errors.Is(err, ErrNotFound):
			// Changed, created or deleted since the read: read again.
			return true, fmt.Errorf("coord: update %s: %w", key, err)
		}
		return false, fmt.Errorf("coord: update %s: %w", key, err)
	})
	if err != nil {
		return 0, err
	}
	return version, nil
}

// retry runs attempt until it reports no conflict, at most retryAttempts times, pausing a
// jittered, growing time in between.
func retry(ctx context.Context, attempt func() (conflict bool, err error)) error {
	var last error
	for i := range retryAttempts {
		if i > 0 {
			pause := rand.N(min(retryBase<<(i-1), retryMax)) + 1
			if err := ctxtime.Sleep(ctx, pause); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		conflict, err := attempt()
		if !conflict {
			return err
		}
		last = err
	}
	return fmt.Errorf("%w: %d attempts conflicted, the last with: %v", ErrContended, retryAttempts, last)
}
