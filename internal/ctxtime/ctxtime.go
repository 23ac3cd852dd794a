// Package ctxtime ties time to a context: a pause that ends with it (Sleep, between retries of
// a loop a cancelled context must stop at once), and a grace that outlives it (Outlive, a drain).
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done. It returns nil after the whole d, and ctx's error
// when ctx ended first (at once when it already had, whatever d is).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Outlive returns a context that ends d after ctx does, or when cancel is called: the bound of
// a drain, which finishes what was under way at a stop (a request in flight, a last flush)
// without being cut off by the stop itself. It keeps ctx's values. Call cancel when done with
// it; the timer starts only once ctx ends.
func Outlive(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-c.Done():
		}
	})
	return c, func() {
		stop()
		cancel()
	}
}
