// Package ctxtime waits for a while or until a context ends, whichever comes first: the pause
// between retries of every loop that a cancelled context must stop at once.
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
