package agents

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/isolation"
)

// TestExitReason: only the worker's own failures count as crashes. The launcher's lapse
// status counts as a lapse only when the agent's own view of the lease agrees: a worker that
// exits with that status while its lease is fine is still a crash. (The agent's own stops,
// drains, moves, kills, rollouts and evictions, never reach exitReason: see
// TestAgentStopsAreNotCrashes, TestExitAccounting and e2e.TestLapsedLeasesDoNotAvoidNode.)
func TestExitReason(t *testing.T) {
	const ttl = 2 * time.Second
	const grace = time.Second
	now := time.Now()
	lapse := isolation.Exit{Code: launcher.ExitLeaseLapsed, At: now}
	for _, c := range []struct {
		name    string
		ex      isolation.Exit
		lost    error
		lease   time.Time    // the node lease's stamp (its mtime)
		st      KeeperStatus // the keeper's record of the last lapse
		noLease bool
		// gens: the lease is written as a record of generation gens[1], the worker having
		// begun under gens[0] (nil: an mtime-only lease, the worker's generation unknown).
		gens []uint64
		want string
	}{
		{name: "lease lapsed, still lapsed", ex: lapse, lease: now.Add(-2 * ttl), want: cluster.ExitLeaseLapsed},
		{name: "lease lapsed, renewed since", ex: lapse, lease: now.Add(time.Second),
			st: KeeperStatus{LapsedFrom: now.Add(-time.Second), Lapsed: now.Add(500 * time.Millisecond)}, want: cluster.ExitLeaseLapsed},
		{name: "lease lapsed, the worker took its grace", ex: lapse, lease: now,
			st: KeeperStatus{LapsedFrom: now.Add(-3 * time.Second), Lapsed: now.Add(-grace - time.Second)}, want: cluster.ExitLeaseLapsed},
		{name: "lease lapsed, older keeper without LapsedFrom", ex: lapse, lease: now,
			st: KeeperStatus{Lapsed: now.Add(-time.Second)}, want: cluster.ExitLeaseLapsed},
		{name: "lapse status while the lease is fine", ex: lapse, lease: now, want: cluster.ExitCrashed},
		{name: "lapse status long after the last lapse", ex: lapse, lease: now,
			st: KeeperStatus{LapsedFrom: now.Add(-time.Minute), Lapsed: now.Add(-50 * time.Second)}, want: cluster.ExitCrashed},
		{name: "lapse status before the next lapse began", ex: lapse, lease: now.Add(time.Second),
			st: KeeperStatus{LapsedFrom: now.Add(time.Second), Lapsed: now.Add(2 * time.Second)}, want: cluster.ExitCrashed},
		{name: "lapse status without leases", ex: lapse, lease: now.Add(-2 * ttl), noLease: true, want: cluster.ExitCrashed},
		{name: "exit 3", ex: isolation.Exit{Code: 3, At: now}, lease: now, want: cluster.ExitCrashed},
		{name: "exit 3 during a lapse", ex: isolation.Exit{Code: 3, At: now}, lease: now.Add(-2 * ttl), want: cluster.ExitCrashed},
		{name: "SIGSEGV", ex: isolation.Exit{Code: 128 + int(syscall.SIGSEGV), Signal: syscall.SIGSEGV, At: now}, lease: now, want: cluster.ExitCrashed},
		{name: "OOM kill", ex: isolation.Exit{Code: 137, Signal: syscall.SIGKILL, OOMKilled: true, At: now}, lease: now, want: cluster.ExitCrashed},
		{name: "OOM kill with the lapse status", ex: isolation.Exit{Code: launcher.ExitLeaseLapsed, OOMKilled: true, At: now},
			lease: now.Add(-2 * ttl), want: cluster.ExitCrashed},
		// The keeper renewed the lease after a lapse it recorded nowhere the agent looked (a
		// keeper begun anew): the new generation says the launcher's stop was a lapse.
		{name: "lapse status, renewed in a new generation", ex: lapse, lease: now, gens: []uint64{3, 4}, want: cluster.ExitLeaseLapsed},
		{name: "lapse status, the generation it began under", ex: lapse, lease: now, gens: []uint64{4, 4}, want: cluster.ExitCrashed},
		{name: "exit 3, renewed in a new generation", ex: isolation.Exit{Code: 3, At: now}, lease: now, gens: []uint64{3, 4}, want: cluster.ExitCrashed},
		{name: "lapse status, new generation, without leases", ex: lapse, lease: now, gens: []uint64{3, 4}, noLease: true, want: cluster.ExitCrashed},
		{name: "lost", ex: lapse, lost: errors.New("wait: gone"), lease: now.Add(-2 * ttl), want: cluster.ExitCrashed},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			a := &Agent{cfg: Config{StateDir: dir, LeaseTTL: ttl, NoLease: c.noLease}}
			p, err := ensureNodeLease(dir)
			if err != nil {
				if err := os.MkdirAll(filepath.Join(dir, "leases"), 0o755); err != nil {
					t.Fatal(err)
				}
				if p, err = ensureNodeLease(dir); err != nil {
					t.Fatal(err)
				}
			}
			a.leases = filepath.Dir(p) // as prepareStateDir leaves it
			var began leaseGen
			if c.gens != nil {
				w, err := leasefile.OpenWriter(p)
				if err != nil {
					t.Fatal(err)
				}
				stamp := leasefile.Now() - time.Since(c.lease)
				err = w.Write(leasefile.Record{Boot: leasefile.BootID(), Gen: c.gens[1], Stamp: stamp}, c.lease)
				w.Close()
				if err != nil {
					t.Fatal(err)
				}
				began = leaseGen{gen: c.gens[0], known: true}
			} else if err := os.Chtimes(p, c.lease, c.lease); err != nil {
				t.Fatal(err)
			}
			if got := a.exitReason(c.ex, c.lost, grace, c.st, began); got != c.want {
				t.Errorf("exitReason = %q, want %q", got, c.want)
			}
		})
	}
}

func TestExitCounts(t *testing.T) {
	for reason, want := range map[string]bool{
		"": true, cluster.ExitCrashed: true,
		cluster.ExitLeaseLapsed: false, cluster.ExitStopped: false, cluster.ExitEvicted: false,
	} {
		if got := cluster.ExitCounts(reason); got != want {
			t.Errorf("ExitCounts(%q) = %v, want %v", reason, got, want)
		}
	}
}

// TestFaultHealedResetsBackoff: once the store answers again, crashes during the fault (and
// from a lease ttl before it) no longer count, and a worker waiting out its backoff starts
// at once; earlier crashes still count.
func TestFaultHealedResetsBackoff(t *testing.T) {
	const ttl = 2 * time.Second
	since := time.Now().Add(-30 * time.Second)
	r := &run{a: &Agent{cfg: Config{LeaseTTL: ttl}}, log: slog.New(slog.DiscardHandler), workers: map[string]*slot{
		"during": {id: "during", state: cluster.WorkerBackoff, retryAt: time.Now().Add(time.Minute),
			recent: []time.Time{since.Add(-time.Minute), since.Add(-time.Second), since.Add(5 * time.Second), since.Add(20 * time.Second)}},
		"before": {id: "before", state: cluster.WorkerBackoff, retryAt: time.Now().Add(time.Minute),
			recent: []time.Time{since.Add(-time.Minute)}},
		"running": {id: "running", state: cluster.WorkerRunning, recent: []time.Time{since.Add(time.Second)}},
	}}
	r.faultHealed(since)
	if s := r.workers["during"]; len(s.recent) != 1 || time.Until(s.retryAt) > 0 {
		t.Errorf("crashed during the fault: recent %v, retry in %s; want one crash left and a restart now", s.recent, time.Until(s.retryAt))
	}
	if s := r.workers["before"]; len(s.recent) != 1 || time.Until(s.retryAt) < 50*time.Second {
		t.Errorf("crashed before the fault: recent %v, retry in %s; want both kept", s.recent, time.Until(s.retryAt))
	}
	if s := r.workers["running"]; len(s.recent) != 0 || !s.retryAt.IsZero() {
		t.Errorf("running: recent %v, retry at %v; want the crash forgiven and no retry", s.recent, s.retryAt)
	}
	if !r.urgent {
		t.Error("the change is not published at once")
	}
}

// TestExitAccounting: each exit reason's accounting on the worker's slot. Only the worker's
// own failure counts towards its crash loop (restarts, the window the masters judge, a
// backoff); a lapsed lease is counted apart and restarts at once; the agent's own stops and
// evictions count nowhere, however many there are.
func TestExitAccounting(t *testing.T) {
	crash := isolation.Exit{Code: 3}
	for _, c := range []struct {
		name                     string
		reason                   string
		ran                      time.Duration // how long each run lasted before it ended
		restarts, recent, lapses int
		state                    string
		backoffs                 []time.Duration
		lastExit                 string
	}{
		// Crashes as it starts: the backoff doubles with each, 1s, 2s, 4s, 8s, 16s.
		{name: "crashed at start", reason: cluster.ExitCrashed, ran: 100 * time.Millisecond, restarts: 5, recent: 5, state: cluster.WorkerBackoff,
			backoffs: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}, lastExit: crash.String()},
		// Crashes after running a while (killed now and then): each restarts after the first
		// backoff, and each still counts for the crash loop the masters judge.
		{name: "crashed after a stable run", reason: cluster.ExitCrashed, ran: 30 * time.Second, restarts: 5, recent: 5, state: cluster.WorkerBackoff,
			backoffs: []time.Duration{time.Second, time.Second, time.Second, time.Second, time.Second}, lastExit: crash.String()},
		{reason: cluster.ExitLeaseLapsed, lapses: 5, lastExit: lapsedStop},
		{reason: cluster.ExitStopped},
		{reason: cluster.ExitEvicted, state: cluster.WorkerEvicted, lastExit: "evicted under memory pressure: " + crash.String()},
	} {
		if c.name == "" {
			c.name = c.reason
		}
		if c.ran == 0 {
			c.ran = time.Second
		}
		t.Run(c.name, func(t *testing.T) {
			r := &run{a: &Agent{cfg: Config{RestartBackoff: time.Second, MaxBackoff: time.Minute, CrashLoopWindow: 5 * time.Minute, StableRun: 10 * time.Second}}}
			s := &slot{id: "w"}
			at := time.Now()
			var delays []time.Duration
			for range 5 {
				s.state, s.since, s.pid = cluster.WorkerRunning, at, 42
				at = at.Add(c.ran)
				delays = append(delays, r.countExit(s, c.reason, crash, nil, at))
			}
			if s.restarts != c.restarts || len(s.recent) != c.recent || s.lapses != c.lapses {
				t.Errorf("restarts %d, recent %d, lapses %d; want %d, %d, %d", s.restarts, len(s.recent), s.lapses, c.restarts, c.recent, c.lapses)
			}
			if s.state != c.state || s.exitReason != c.reason || s.pid != 0 || s.lastExit != c.lastExit {
				t.Errorf("state %q, reason %q, pid %d, last exit %q; want %q, %q, 0, %q", s.state, s.exitReason, s.pid, s.lastExit, c.state, c.reason, c.lastExit)
			}
			if c.backoffs != nil {
				if !slices.Equal(delays, c.backoffs) {
					t.Errorf("backoffs %v, want %v", delays, c.backoffs)
				}
			} else if slices.ContainsFunc(delays, func(d time.Duration) bool { return d != 0 }) || !s.retryAt.IsZero() {
				t.Errorf("backoffs %v, retry at %v: want none", delays, s.retryAt)
			}
		})
	}
}
