package pace_test

import (
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/pace"
)

// After a quiet while Burst writes go at once, then one per MinWrite; quiet time earns the
// burst back, and never more than it.
func TestCredit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var c pace.Credit
	at := t0
	for i := range pace.Burst {
		if next := c.Next(at); !next.Equal(at) {
			t.Fatalf("write %d of a burst waits until %s; want at once", i, next.Sub(t0))
		}
		c.Took(at)
	}
	next := c.Next(at)
	if want := at.Add(pace.MinWrite); !next.Equal(want) {
		t.Fatalf("the write after a burst may go at %s; want %s", next.Sub(t0), want.Sub(t0))
	}
	c.Took(next)
	if n := c.Next(next); !n.Equal(next.Add(pace.MinWrite)) {
		t.Fatalf("a steady write may go %s after the last; want %s", n.Sub(next), pace.MinWrite)
	}
	// A long quiet while earns Burst writes back, not more.
	later := next.Add(time.Hour)
	for i := range pace.Burst {
		if n := c.Next(later); !n.Equal(later) {
			t.Fatalf("after an hour, write %d waits %s", i, n.Sub(later))
		}
		c.Took(later)
	}
	if n := c.Next(later); n.Equal(later) {
		t.Fatalf("after an hour, %d writes went at once; want at most %d", pace.Burst+1, pace.Burst)
	}
}
