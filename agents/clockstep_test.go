package agents_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// EnvClockSteps, set to 1, says that this machine's wall clock is the tests' to step: the
// cgroup v2 virtual machine of scripts/vmtest sets it. Nowhere else may a test step the
// clock: every other process of the machine would see it.
const EnvClockSteps = "STORMDOCK_CLOCK_STEPS"

// stepClock steps the wall clock (CLOCK_REALTIME) by d.
func stepClock(t *testing.T, d time.Duration) {
	t.Helper()
	ts := unix.NsecToTimespec(time.Now().Add(d).UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		t.Fatalf("step the clock by %s: %v", d, err)
	}
	t.Logf("wall clock stepped by %s: now %s", d, time.Now().Format(time.RFC3339))
}

// Leases are immune to steps of the wall clock. Stepped an hour forward, no worker is killed
// (a lease judged by the wall clock would look an hour old at once, on every node that
// steps: a VM resumed and synced, NTP after a long drift). The keeper then cut off from the
// store's leader and the clock stepped an hour back, the workers stop when their lease lapses
// (judged by the wall clock, the lease would look an hour younger and last an hour more). It
// steps the machine's clock, so it runs only where that harms no one else: the cgroup v2
// virtual machine (scripts/vmtest).
func TestClockStepsNeitherKillNorExtend(t *testing.T) {
	if os.Getenv(EnvClockSteps) != "1" {
		t.Skipf("steps the wall clock: runs in the cgroup v2 virtual machine of scripts/vmtest (%s=1), where that harms no one", EnvClockSteps)
	}
	h := newHarness(t, "mem")
	stepped := time.Duration(0)
	t.Cleanup(func() {
		if stepped != 0 {
			stepClock(t, -stepped)
		}
	})
	store := &agents.SyncCut{Store: h.agentStore()}
	h.start(h.cfg, store)
	h.assign(h.wa("clk", 0, 1, "run"), h.wa("clk", 1, 1, "run"))
	before := states(h.waitRecord("workers running", 15*time.Second, allRunning("clk/0", "clk/1")))

	// Forward: nothing is killed. Two session timeouts are five renewals and twenty
	// launcher checks.
	stepClock(t, time.Hour)
	stepped += time.Hour
	testenv.AssertUntil(t, "workers run on across a forward step", 2*sessionTimeout, func() (bool, string) {
		for _, k := range []string{"clk/0", "clk/1"} {
			if !alive(before[k].PID) {
				return false, fmt.Sprintf("%s (pid %d) stopped after the wall clock stepped an hour forward", k, before[k].PID)
			}
		}
		return true, ""
	})

	// Backward, with the keeper cut off: the lease lapses a session timeout after its last
	// renewal, not an hour more.
	cut := time.Now()
	store.Cut.Store(true)
	stepClock(t, -time.Hour)
	stepped -= time.Hour
	testenv.EventuallyWith(t, "workers stopped with their lease", 30*time.Second, func() (bool, string) {
		for _, k := range []string{"clk/0", "clk/1"} {
			if alive(before[k].PID) {
				return false, fmt.Sprintf("%s (pid %d) runs %s after its keeper was cut off and the clock stepped an hour back",
					k, before[k].PID, time.Since(cut).Round(time.Millisecond))
			}
		}
		return true, ""
	})
	t.Logf("figure: workers stopped %s after their keeper was cut off and the wall clock stepped an hour back (lease ttl %s, grace 2s)",
		time.Since(cut).Round(time.Millisecond), sessionTimeout)

	// Healed: the keeper renews the lease (a new generation) and the agent runs them again.
	store.Cut.Store(false)
	h.waitRecord("workers running again", 30*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)
		return allRunning("clk/0", "clk/1")(rec) && st["clk/0"].PID != before["clk/0"].PID && st["clk/1"].PID != before["clk/1"].PID
	})
}
