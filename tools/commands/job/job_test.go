package job

import (
	"testing"
	"time"
)

// --wait polls every 20ms for its first second, then backs off to 200ms.
func TestPollInterval(t *testing.T) {
	var p pollInterval
	for range 50 {
		if d := p.next(); d != 20*time.Millisecond {
			t.Fatalf("poll %d: %s, want 20ms", p.n, d)
		}
	}
	last := time.Duration(0)
	for range 20 {
		d := p.next()
		if d < last || d > 200*time.Millisecond {
			t.Fatalf("poll %d: %s after %s: want a growing wait up to 200ms", p.n, d, last)
		}
		last = d
	}
	if last != 200*time.Millisecond {
		t.Fatalf("the wait settles at %s, want 200ms", last)
	}
}
