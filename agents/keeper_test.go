package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/internal/testenv"
)

// keeperFixture is a keeper on an embedded store, with the files an agent would write.
type keeperFixture struct {
	t     *testing.T
	dir   string
	srv   *coord.Server
	store coord.Store // the keeper's
	admin coord.Store // the test's
	k     *Keeper
	done  chan error
}

func newKeeperFixture(t *testing.T, grace time.Duration) *keeperFixture {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	f := &keeperFixture{t: t, dir: t.TempDir(), srv: srv, done: make(chan error, 1)}
	if f.store, err = srv.Connect(coord.Options{SessionTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.store.Close() })
	if f.admin, err = srv.Connect(coord.Options{SessionTimeout: -1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.admin.Close() })
	f.writeRecord(cluster.NodeHealth{State: cluster.HealthHealthy})
	if grace > 0 {
		if err := touch(filepath.Join(f.dir, agentAliveFile), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	f.k, err = NewKeeper(KeeperConfig{Node: "n1", Host: "h1", StateDir: f.dir, Store: "mem://keeper",
		SessionTimeout: time.Second, RestartGrace: grace}, f.store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { f.done <- f.k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-f.done
	})
	return f
}

func (f *keeperFixture) writeRecord(h cluster.NodeHealth) {
	b, _ := json.Marshal(cluster.NodeRecord{Node: cluster.Node{ID: "n1", Host: "h1", DC: "dc-a", Rack: "r1", Slots: 4}, Health: h})
	if err := atomicfile.WriteFile(filepath.Join(f.dir, nodeRecordFile), b, 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *keeperFixture) entry() (cluster.NodeRecord, coord.Entry, bool) {
	e, err := f.admin.Get(context.Background(), cluster.NodesKey+"/n1")
	if err != nil {
		return cluster.NodeRecord{}, e, false
	}
	var r cluster.NodeRecord
	_ = json.Unmarshal(e.Value, &r)
	return r, e, true
}

func (f *keeperFixture) stamp() time.Time {
	fi, err := os.Stat(filepath.Join(f.dir, "leases", nodeLeaseName))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// The keeper registers the node under its own session, tells the agent that session through
// keeper.json, renews the lease stamp while the store answers, and pushes the records the
// agent writes.
func TestKeeperRegistersRenewsAndPublishes(t *testing.T) {
	f := newKeeperFixture(t, 0)
	testenv.Eventually(t, "node registered", 10*time.Second, func() bool {
		_, e, ok := f.entry()
		st := f.k.Status()
		return ok && st.Session != 0 && e.Owner == st.Session && st.State == KeeperLive
	})
	// The keeper writes keeper.json after it changes its status in memory (and syncs it).
	testenv.EventuallyWith(t, "keeper.json carries the session", 10*time.Second, func() (bool, string) {
		var onDisk KeeperStatus
		b, err := os.ReadFile(filepath.Join(f.dir, keeperStatusFile))
		if err != nil || json.Unmarshal(b, &onDisk) != nil || onDisk.Session != f.k.Status().Session {
			return false, fmt.Sprintf("keeper.json %s (%v), want the session %x", b, err, f.k.Status().Session)
		}
		return true, ""
	})
	first := f.stamp()
	testenv.Eventually(t, "lease stamp renewed", 10*time.Second, func() bool { return f.stamp().After(first) })
	if lag := time.Since(f.stamp()); lag > time.Second {
		t.Errorf("lease stamp %s old while the store answers; a lease would lapse", lag)
	}
	f.writeRecord(cluster.NodeHealth{State: cluster.HealthThrottled, Throttled: 2, Reason: "memory"})
	f.k.Notify()
	testenv.Eventually(t, "new record in the node's entry", 10*time.Second, func() bool {
		r, _, ok := f.entry()
		return ok && r.Health.State == cluster.HealthThrottled
	})
}

// A keeper whose agent stays away marks the node as such (no new workers go there) and, once
// the restart grace is over, retires it: it waits for every lease launcher to let go of the
// lease, then removes the node's entry, and ends.
func TestKeeperRetiresAfterRestartGrace(t *testing.T) {
	const grace = 3 * time.Second
	f := newKeeperFixture(t, grace)
	testenv.Eventually(t, "node registered", 10*time.Second, func() bool { _, _, ok := f.entry(); return ok })
	// A lease launcher: a shared lock on a worker's lease, a link of the node lease.
	lease := filepath.Join(f.dir, "leases", "w1", "lease")
	if err := os.MkdirAll(filepath.Dir(lease), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(f.dir, "leases", nodeLeaseName), lease); err != nil {
		t.Fatal(err)
	}
	release, err := flockFile(lease, unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "node marked: agent not running", 10*time.Second, func() bool {
		r, _, ok := f.entry()
		return ok && r.Health.State == cluster.HealthUnhealthy && strings.Contains(r.Health.Reason, "agent not running")
	})
	testenv.Eventually(t, "keeper retiring", 10*time.Second, func() bool { return f.k.Status().State == KeeperRetiring })
	// While a launcher holds its lease the node stays: its worker may still run.
	testenv.AssertUntil(t, "node entry kept while a worker holds its lease", time.Second, func() (bool, string) {
		_, _, ok := f.entry()
		return ok, "node entry removed while a launcher held its lease"
	})
	release()
	testenv.Eventually(t, "node entry removed", 10*time.Second, func() bool { _, _, ok := f.entry(); return !ok })
	select {
	case err := <-f.done:
		f.done <- err
		if err != nil {
			t.Fatalf("keeper ended with %v", err)
		}
	case <-time.After(testenv.Timeout(10 * time.Second)):
		t.Fatal("keeper did not end after retiring")
	}
}

// Two keepers never hold one state directory.
func TestKeeperLock(t *testing.T) {
	f := newKeeperFixture(t, 0)
	testenv.Eventually(t, "node registered", 10*time.Second, func() bool { return f.k.Status().Session != 0 })
	k2, err := NewKeeper(KeeperConfig{Node: "n1", StateDir: f.dir, Store: "mem://keeper", SessionTimeout: time.Second}, f.admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := k2.Run(context.Background()); !errors.Is(err, ErrKeeperRunning) {
		t.Fatalf("second keeper: %v, want ErrKeeperRunning", err)
	}
}
