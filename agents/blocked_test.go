package agents

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
)

// liveKeeper is a keeperLink that always reports the keeper live in one session: what an
// agent sees of a keeper that was paused and resumed (its state and session never changed,
// only the lease file did).
type liveKeeper struct{ session int64 }

func (k liveKeeper) Status() KeeperStatus {
	return KeeperStatus{State: KeeperLive, Session: k.session}
}
func (liveKeeper) Notify() {}

// TestBlockedReconcileRunsAgain: a reconcile that the gate kept from starting a worker
// arms its own retry, at most blockedPoll (and an eighth of the lease) away, so that a lease
// renewed after a lapse, which no event announces, is seen; a node with nothing waiting
// arms nothing. (Chaos found the stall this prevents: a keeper paused 5.8 s, its node's
// workers down for the 5 minutes the run allows.)
func TestBlockedReconcileRunsAgain(t *testing.T) {
	const session = 7
	for _, c := range []struct {
		name      string
		ttl       time.Duration
		assigned  int64               // the session the assignment was stamped with
		lapsed    bool                // the node lease has lapsed
		workers   map[string]*slot    // what the agent already has
		wantRetry time.Duration       // the longest the retry may be away; 0: none armed
		desired   map[string]struct{} // the node's assignment
	}{
		{name: "lease lapsed, worker waiting", ttl: 10 * time.Second, assigned: session, lapsed: true,
			desired: map[string]struct{}{"w1": {}}, wantRetry: blockedPoll},
		{name: "short lease: an eighth of it", ttl: time.Second, assigned: session, lapsed: true,
			desired: map[string]struct{}{"w1": {}}, wantRetry: time.Second / 8},
		{name: "assignment of another session", ttl: 10 * time.Second, assigned: session - 1,
			desired: map[string]struct{}{"w1": {}}, wantRetry: blockedPoll},
		{name: "lease lapsed, worker stopped by the lapse", ttl: 10 * time.Second, assigned: session, lapsed: true,
			desired: map[string]struct{}{"w1": {}}, workers: map[string]*slot{"w1": {id: "w1", known: true, mode: isolationOf(cluster.WorkerAssignment{})}},
			wantRetry: blockedPoll},
		{name: "lease lapsed, worker still running", ttl: 10 * time.Second, assigned: session, lapsed: true,
			desired: map[string]struct{}{"w1": {}}, workers: map[string]*slot{"w1": {id: "w1", known: true, mode: isolationOf(cluster.WorkerAssignment{}), state: cluster.WorkerRunning}}},
		{name: "lease lapsed, nothing assigned", ttl: 10 * time.Second, assigned: session, lapsed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "leases"), 0o755); err != nil {
				t.Fatal(err)
			}
			m, err := newMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			a := &Agent{cfg: Config{StateDir: dir, LeaseTTL: c.ttl, Node: cluster.Node{Slots: 2}}, metrics: m}
			a.leases = filepath.Join(dir, "leases")
			p, err := ensureNodeLease(dir)
			if err != nil {
				t.Fatal(err)
			}
			stamp := func(at time.Duration) {
				w, err := leasefile.OpenWriter(p)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				if err := w.Write(leasefile.Record{Boot: leasefile.BootID(), Gen: 1, Stamp: at}, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			if c.lapsed {
				stamp(leasefile.Now() - 2*c.ttl)
			} else {
				stamp(leasefile.Now())
			}
			workers := c.workers
			if workers == nil {
				workers = map[string]*slot{}
			}
			desired := map[string]cluster.WorkerAssignment{}
			for id := range c.desired {
				desired[id] = cluster.WorkerAssignment{}
			}
			r := &run{a: a, log: slog.New(slog.DiscardHandler), keeper: liveKeeper{session: session},
				assignSession: c.assigned, workers: workers, desired: desired, retry: time.NewTimer(time.Hour)}
			defer r.retry.Stop()

			r.reconcile()
			after := time.Now()
			if len(r.workers) != len(workers) || r.inStart() != 0 {
				t.Fatalf("the gate let a worker start: %d workers, %d starting", len(r.workers), r.inStart())
			}
			switch {
			case c.wantRetry == 0 && !r.retryAt.IsZero():
				t.Errorf("a retry is armed %s away with nothing waiting for the gate", r.retryAt.Sub(after))
			case c.wantRetry > 0 && r.retryAt.IsZero():
				t.Errorf("no retry armed: the waiting worker starts only on the next event")
			case c.wantRetry > 0 && r.retryAt.Sub(after) > c.wantRetry:
				t.Errorf("retry armed %s away, want at most %s", r.retryAt.Sub(after), c.wantRetry)
			}
			if c.lapsed && c.assigned == session {
				// The renewal that the retry is for: the gate opens on it, with no event.
				stamp(leasefile.Now())
				if g := r.gate(); !g.canRun {
					t.Error("the renewed lease does not open the gate")
				}
			}
		})
	}
}
