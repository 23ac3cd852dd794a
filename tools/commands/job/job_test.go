package job

import (
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
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

func TestLastExitSaysWhoseFault(t *testing.T) {
	for _, c := range []struct {
		w    api.WorkerView
		want string
	}{
		{api.WorkerView{LastExit: "exited with code 3", ExitReason: cluster.ExitCrashed}, "crashed: exited with code 3"},
		{api.WorkerView{LastExit: "stopped: lease lapsed (not counted as a crash)", ExitReason: cluster.ExitLeaseLapsed}, "stopped: lease lapsed (not counted as a crash)"},
		{api.WorkerView{LastExit: "exited with code 3"}, "exited with code 3"}, // an agent from before exit reasons
		{api.WorkerView{ExitReason: cluster.ExitStopped}, ""},
	} {
		if got := lastExit(c.w); got != c.want {
			t.Errorf("lastExit(%+v) = %q, want %q", c.w, got, c.want)
		}
	}
}
