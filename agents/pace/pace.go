// Package pace is how often a node agent writes its node record: a worker's or the node's
// change goes out at once, but a flapping check or a crash-looping worker must not flood the
// store. The real agent and the simulated one (package agents/sim) keep the same pace.
package pace

import "time"

// After a quiet while Burst writes may follow each other at once (a worker's stop is two,
// stopping and gone, and a start may follow), then one per MinWrite.
const (
	MinWrite = 100 * time.Millisecond
	Burst    = 3
)

// Credit is how many writes may be made at once, in units of MinWrite: it grows with time
// up to Burst writes, and each write takes one. The zero Credit is full.
type Credit struct {
	credit time.Duration
	at     time.Time // when credit was counted; zero: never written
}

func (c *Credit) now(t time.Time) time.Duration {
	if c.at.IsZero() {
		return Burst * MinWrite
	}
	return min(c.credit+t.Sub(c.at), Burst*MinWrite)
}

// Next is when a write may be made: t, or once the credit is back.
func (c *Credit) Next(t time.Time) time.Time {
	if n := c.now(t); n < MinWrite {
		return t.Add(MinWrite - n)
	}
	return t
}

// Took spends the credit of a write made at t.
func (c *Credit) Took(t time.Time) { c.credit, c.at = max(c.now(t)-MinWrite, 0), t }
