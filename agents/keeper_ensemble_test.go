package agents_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// A node's keeper against a real ZooKeeper ensemble of three servers, each on a host of a
// network lab, the keeper on a host of its own, and one worker under the real lease launcher
// on its lease. Faults are cut in the lab or sent to the servers; what counts is seen from
// the machine: the worker's process (/proc), the lease file, and the leader's own list of
// sessions (its four-letter word dump).

// ensembleSessionTimeout is what the keeper asks and gets (the servers grant 0.5s to 5s).
const ensembleSessionTimeout = 2 * time.Second

// labSyncLimit is the ensemble's syncLimit, in ticks of 250ms.
const labSyncLimit = 40

// keeperLab is the lab, the ensemble, and a case's keeper on the node host.
type keeperLab struct {
	t    *testing.T
	lab  *netlab.Lab
	node *netlab.Host
	ens  *zktest.Ensemble
	dir  string // the keeper's state directory
	k    *agents.Keeper
	kst  coord.Store
}

func newKeeperLab(t *testing.T) *keeperLab {
	t.Helper()
	lab := netlab.ForTest(t)
	hs := lab.AddHosts(t, "zk1", "zk2", "zk3", "node")
	// A follower gives up on a leader it no longer hears from after syncLimit ticks: 10s
	// here, far longer than the keeper's session, as with ZooKeeper's defaults (10 ticks of
	// 2s) against sessions of 10s or less.
	ens := zktest.StartEnsemble(t, 3, zktest.Options{Hosts: []zktest.Host{hs[0], hs[1], hs[2]}, Dial: lab.DialContext,
		TickTime: 250 * time.Millisecond, SyncLimit: labSyncLimit})
	return &keeperLab{t: t, lab: lab, node: hs[3], ens: ens}
}

// startKeeper runs a keeper for the case t on the node host, in a state directory of its
// own, whose store client first connects to server first (the others refuse it until then,
// as if unreachable), and waits until it is live. It stops when t ends.
func (kl *keeperLab) startKeeper(t *testing.T, first *zktest.Server) {
	t.Helper()
	kl.t, kl.dir = t, t.TempDir()
	pin := zktest.NewPin(first.Addr(), kl.node.Dialer())
	url := fmt.Sprintf("zk://%s/keeper-%d", kl.ens.Addrs(), time.Now().UnixNano())
	logger := testenv.Logger(t, slog.LevelWarn)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	st, err := coord.Open(ctx, url, coord.Options{SessionTimeout: ensembleSessionTimeout, Dialer: pin.Dial, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	t.Cleanup(func() { st.Close() })
	b, _ := json.Marshal(cluster.NodeRecord{Node: cluster.Node{ID: "n1", Host: "node", Slots: 1}})
	if err := atomicfile.WriteFile(filepath.Join(kl.dir, "node.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := agents.NewKeeper(agents.KeeperConfig{Node: "n1", Host: "node", StateDir: kl.dir, Store: url,
		SessionTimeout: ensembleSessionTimeout, Dial: kl.node.DialContext, Logger: logger}, st)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("keeper: %v", err)
		}
	})
	kl.k, kl.kst = k, st
	kl.waitLive(time.Time{})
}

// waitLive waits until the keeper is live with a session, its lease renewed after since.
func (kl *keeperLab) waitLive(since time.Time) {
	kl.t.Helper()
	testenv.EventuallyWith(kl.t, "keeper live", 60*time.Second, func() (bool, string) {
		st := kl.k.Status()
		return st.State == agents.KeeperLive && st.Session != 0 && st.Stamp.After(since), fmt.Sprintf("%+v", st)
	})
}

// lease is the node lease's record.
func (kl *keeperLab) lease() leasefile.Record {
	r, _ := leasefile.Read(filepath.Join(kl.dir, "leases", ".node"))
	return r
}

// worker is a helper worker under the real lease launcher on the node lease; it returns the
// worker's pid once it runs.
func (kl *keeperLab) worker() int {
	t := kl.t
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(stormdockBin, "launch", "--lease", filepath.Join(kl.dir, "leases", ".node"),
		"--ttl", ensembleSessionTimeout.String(), "--grace", "1s", "--", stormdockBin, "helper")
	cmd.Env = append(os.Environ(), "HELPER_DIR="+dir, "HELPER_MODE=run", "STORMDOCK_JOB=fence", "STORMDOCK_WORKER=0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	var pid int
	testenv.Eventually(t, "worker started", 30*time.Second, func() bool {
		ms, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		if len(ms) == 0 {
			return false
		}
		var r helperReport
		b, _ := os.ReadFile(ms[0])
		if json.Unmarshal(b, &r) != nil {
			return false
		}
		pid = r.PID
		return true
	})
	return pid
}

// fault is what one case saw, from the machine: when the fault began, when the leader
// dropped the keeper's session, when the worker's process ended.
type fault struct {
	cut, expired, stopped time.Time
	absent                time.Time // the leader's dump first left the session out (not yet expired)
	// lapse is how long after the cut the lease's last record (as of the cut) ran out.
	lapse time.Duration
}

// begin marks the fault's start and the lease's record then.
func (kl *keeperLab) begin() *fault {
	r, now := kl.lease(), leasefile.Now()
	return &fault{cut: time.Now(), lapse: r.Stamp + ensembleSessionTimeout - now}
}

// poll notes whether the leader still holds the session and whether the worker's process
// runs. A session is gone once the leader's dump has left it out for more than a tick: a
// session its client moves between servers, touched meanwhile, may be missing from one dump
// (the leader's buckets of sessions by expiry change while dump lists them); an expired one
// stays out. It was gone from the first dump that left it out.
func (kl *keeperLab) poll(f *fault, leader *zktest.Server, sid int64, pid int) {
	if f.expired.IsZero() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		live, err := leader.SessionLive(ctx, sid)
		cancel()
		switch {
		case err != nil:
		case live:
			f.absent = time.Time{}
		case f.absent.IsZero():
			f.absent = time.Now()
		case time.Since(f.absent) > 2*kl.ens.TickTime():
			f.expired = f.absent
		}
	}
	if f.stopped.IsZero() && !alive(pid) {
		f.stopped = time.Now()
	}
}

// watch polls every 50ms until the leader dropped the session and the worker stopped, and
// fails the test if the worker still runs after timeout.
func (kl *keeperLab) watch(what string, f *fault, leader *zktest.Server, sid int64, pid int, timeout time.Duration) {
	kl.t.Helper()
	deadline := time.Now().Add(testenv.Timeout(timeout))
	for (f.expired.IsZero() || f.stopped.IsZero()) && time.Now().Before(deadline) {
		kl.poll(f, leader, sid, pid)
		time.Sleep(50 * time.Millisecond)
	}
	if f.stopped.IsZero() {
		kl.t.Fatalf("%s: the worker still runs %s after the fault (the leader dropped the session: %v); keeper %+v",
			what, time.Since(f.cut).Round(time.Millisecond), !f.expired.IsZero(), kl.k.Status())
	}
	kl.report(what, f)
}

// report logs the case's figure: how long the worker outlived the leader's copy of its
// session (the longest an index could run twice: the master moves it once the session is
// gone).
func (kl *keeperLab) report(what string, f *fault) {
	switch {
	case f.expired.IsZero() && f.stopped.IsZero():
		kl.t.Logf("figure: %s: the session lived on (the client moved to another server within it), the worker ran on: no double run", what)
	case f.expired.IsZero():
		kl.t.Logf("figure: %s: worker stopped %s after the fault began; the leader kept the session: no double run",
			what, f.stopped.Sub(f.cut).Round(time.Millisecond))
	default:
		kl.t.Logf("figure: %s: the lease as of the fault ran out %s after it began, the leader dropped the session %s after, the worker stopped %s after: ran twice for at most %s (session %s, launcher check 100ms, grace 1s)",
			what, f.lapse.Round(time.Millisecond), f.expired.Sub(f.cut).Round(time.Millisecond), f.stopped.Sub(f.cut).Round(time.Millisecond),
			max(0, f.stopped.Sub(f.expired)).Round(time.Millisecond), ensembleSessionTimeout)
	}
}

func TestKeeperOnEnsemble(t *testing.T) {
	kl := newKeeperLab(t)
	ctx := context.Background()

	// A follower cut off from its leader, not from the node: it goes on answering its
	// clients' reads and pings for syncLimit ticks, while the leader, which no longer hears
	// of their sessions, expires them after their timeout. A keeper renewing on such reads
	// keeps the lease while the master moves the workers. Renewing only on syncs answered
	// through the leader, the keeper's requests stall at the follower (ZooKeeper answers a
	// session's requests in order: its pings wait behind the sync), so its client moves to
	// another server within the session, or the lease lapses with the session. Either way,
	// judged over the follower's whole window (until it gives up on its leader): if the
	// leader dropped the session, the worker had stopped by then.
	t.Run("follower-cut-from-leader", func(t *testing.T) {
		leader := kl.ens.Leader()
		if leader == nil {
			t.Fatal("no leader")
		}
		var follower *zktest.Server
		for _, s := range kl.ens.Servers() {
			if s != leader {
				follower = s
				break
			}
		}
		kl.startKeeper(t, follower)
		sid := kl.kst.SessionID()
		pid := kl.worker()
		kl.waitLive(time.Now())

		fh, lh := follower.Host().(*netlab.Host), leader.Host().(*netlab.Host)
		f := kl.begin()
		if err := fh.CutFrom(ctx, lh); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := fh.Heal(ctx); err != nil {
				t.Error(err)
			}
		}()
		var gaveUp time.Time
		deadline := time.Now().Add(testenv.Timeout(60 * time.Second))
		for gaveUp.IsZero() && time.Now().Before(deadline) {
			kl.poll(f, leader, sid, pid)
			mctx, cancel := context.WithTimeout(ctx, time.Second)
			if mode, err := follower.Mode(mctx); err != nil || mode != "follower" {
				gaveUp = time.Now()
			}
			cancel()
			time.Sleep(50 * time.Millisecond)
		}
		if gaveUp.IsZero() {
			t.Fatal("the follower cut from its leader still follows it after a minute")
		}
		switch {
		case !f.expired.IsZero() && f.stopped.IsZero():
			t.Fatalf("the leader dropped the keeper's session %s after the cut; the worker still ran when the follower gave up its leader, %s after the cut (keeper %+v)",
				f.expired.Sub(f.cut).Round(time.Millisecond), gaveUp.Sub(f.cut).Round(time.Millisecond), kl.k.Status())
		case !f.expired.IsZero() && f.stopped.After(gaveUp):
			t.Fatalf("the worker stopped %s after the follower gave up its leader; the leader had dropped the session %s after the cut",
				f.stopped.Sub(gaveUp).Round(time.Millisecond), f.expired.Sub(f.cut).Round(time.Millisecond))
		}
		kl.report("follower cut from the leader", f)
	})

	// Two of three servers paused, then resumed, then the node cut off. The keeper's client
	// starts on one of the two: its requests hang, and the keeper's probes find both servers
	// hung (they accept connections and never answer) while the third, the leader, serves;
	// the store answers the keeper through the leader, and the two resume before the leader
	// gives up on them. When the node is then cut off, every probe times out, which is silence:
	// the lease lapses after --store-silence (the session timeout).
	// Were the two servers still presumed hung from the first fault (only a probe that
	// reached them would clear that, and probes are made only while requests fail), they
	// would make a majority seen down, the store down for everyone, and the lease kept for
	// as long as the node stays cut off.
	t.Run("two-paused-then-node-cut", func(t *testing.T) {
		wctx, cancel := context.WithTimeout(ctx, testenv.Timeout(60*time.Second))
		err := kl.ens.WaitServing(wctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		leader := kl.ens.Leader()
		if leader == nil {
			t.Fatal("no leader")
		}
		var paused []*zktest.Server
		for _, s := range kl.ens.Servers() {
			if s != leader {
				paused = append(paused, s)
			}
		}
		kl.startKeeper(t, paused[0])
		for _, s := range paused {
			s.Pause()
		}
		resumed := false
		defer func() {
			if !resumed {
				for _, s := range paused {
					s.Resume()
				}
			}
		}()
		testenv.EventuallyWith(t, "the keeper's probes find two servers hung", 60*time.Second, func() (bool, string) {
			st := kl.k.Status()
			return strings.Count(st.Detail, "hung") == 2, st.State + ": " + st.Detail
		})
		// The store answers the keeper through the leader while the two are paused (the
		// leader serves until it gives up on them, after syncLimit ticks), so that nothing
		// probes them between their pause and the node's cut; on a machine too loaded for
		// that, the case goes on from the resume.
		since := time.Now()
		deadline := since.Add(kl.ens.TickTime() * labSyncLimit / 2)
		for time.Now().Before(deadline) {
			if st := kl.k.Status(); st.State == agents.KeeperLive && st.Stamp.After(since) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, s := range paused {
			s.Resume()
		}
		resumed = true
		kl.waitLive(time.Now())
		pid := kl.worker()
		sid := kl.kst.SessionID()

		f := kl.begin()
		if err := kl.node.Cut(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := kl.node.Heal(ctx); err != nil {
				t.Error(err)
			}
		}()
		kl.watch("node cut after two servers were paused and resumed", f, leader, sid, pid, 60*time.Second)
		if st := kl.k.Status(); st.State != agents.KeeperSilent {
			t.Errorf("keeper %q (%s) with the node cut off, want %q", st.State, st.Detail, agents.KeeperSilent)
		}
	})
}
