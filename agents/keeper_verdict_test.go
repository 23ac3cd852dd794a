package agents

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// These tests drive a keeper's renewals one by one on an injected boot clock, with the
// store's answers and the probes of its servers scripted, and judge the lease by its file.

// SyncCut is a store whose syncs fail while Cut is set: the keeper's renewals (a sync, then a
// read) fail, as when the store's leader cannot be reached, while other reads, writes and
// watches go on. Exported for the package's external tests too.
type SyncCut struct {
	coord.Store
	Cut atomic.Bool
}

func (s *SyncCut) Sync(ctx context.Context) error {
	if s.Cut.Load() {
		return fmt.Errorf("coord: sync: %w (cut by the test)", coord.ErrUnavailable)
	}
	return s.Store.Sync(ctx)
}

// GrantedSessionTimeout passes the store's own on: a wrapper must not hide it.
func (s *SyncCut) GrantedSessionTimeout() time.Duration {
	return coord.GrantedSessionTimeout(s.Store)
}

// fakeClock is a boot clock the test moves.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() time.Duration      { return time.Duration(c.now.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.now.Add(int64(d)) }
func newFakeClock(start time.Duration) *fakeClock {
	c := &fakeClock{}
	c.now.Store(int64(start))
	return c
}

// verdictFixture is a keeper whose renewals the test runs (no Run loop).
type verdictFixture struct {
	t      *testing.T
	k      *Keeper
	srv    *coord.Server
	store  *SyncCut
	clock  *fakeClock
	lease  string
	lastOK time.Duration

	mu     sync.Mutex
	probes map[string]coord.ServerState // what each server answers a probe
	modes  map[string]string            // the Mode line of serving ones
}

const (
	vTTL     = 2 * time.Second
	vServers = "zk://a:2181,b:2181,c:2181"
)

func newVerdictFixture(t *testing.T) *verdictFixture {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	inner, err := srv.Connect(coord.Options{SessionTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	f := &verdictFixture{t: t, srv: srv, store: &SyncCut{Store: inner}, clock: newFakeClock(time.Hour),
		probes: map[string]coord.ServerState{}, modes: map[string]string{}}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "leases"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := KeeperConfig{Node: "n1", Host: "h1", StateDir: dir, Store: vServers, SessionTimeout: vTTL,
		Clock: f.clock.Now, Logger: testenv.Logger(t, 0)}
	cfg.probe = func(ctx context.Context, addrs []string, _ time.Duration, _ func(context.Context, string, string) (net.Conn, error)) []coord.ServerProbe {
		f.mu.Lock()
		defer f.mu.Unlock()
		out := make([]coord.ServerProbe, len(addrs))
		for i, a := range addrs {
			out[i] = coord.ServerProbe{Addr: a, State: f.probes[a], Detail: f.modes[a]}
		}
		return out
	}
	if f.k, err = NewKeeper(cfg, f.store); err != nil {
		t.Fatal(err)
	}
	if f.lease, err = ensureNodeLease(dir); err != nil {
		t.Fatal(err)
	}
	if f.k.lease, err = leasefile.OpenWriter(f.lease); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.k.lease.Close() })
	return f
}

// answer makes the store answer (up) or not, and what each server says to a probe:
// "follower", "leader" (serving), "hung", "silent", "refused", "not-serving".
func (f *verdictFixture) answer(up bool, servers ...string) {
	f.store.Cut.Store(!up)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, a := range []string{"a:2181", "b:2181", "c:2181"} {
		if i >= len(servers) {
			break
		}
		f.modes[a] = ""
		switch servers[i] {
		case "leader", "follower":
			f.probes[a], f.modes[a] = coord.ServerServing, servers[i]
		case "hung":
			f.probes[a] = coord.ServerHung
		case "silent":
			f.probes[a] = coord.ServerSilent
		case "refused":
			f.probes[a] = coord.ServerRefused
		case "not-serving":
			f.probes[a] = coord.ServerNotServing
		default:
			f.t.Fatalf("unknown probe answer %q", servers[i])
		}
	}
}

// renew runs one renewal after d on the clock.
func (f *verdictFixture) renew(d time.Duration) KeeperStatus {
	f.t.Helper()
	f.clock.advance(d)
	f.k.renew(context.Background(), &f.lastOK, true)
	return f.k.Status()
}

// record is the lease file's record.
func (f *verdictFixture) record() leasefile.Record {
	f.t.Helper()
	r, err := leasefile.Read(f.lease)
	if err != nil {
		f.t.Fatalf("lease record: %v", err)
	}
	return r
}

// lapsedAt reports whether the lease file lets a worker run at the fake clock's now.
func (f *verdictFixture) lapsed() bool {
	return f.record().Lapsed(f.clock.Now(), vTTL, leasefile.BootID())
}

func (f *verdictFixture) wantState(st KeeperStatus, state string) {
	f.t.Helper()
	if st.State != state {
		f.t.Fatalf("keeper state %q (%s), want %q", st.State, st.Detail, state)
	}
}

// A server seen hung during one fault is not presumed hung in the next: two of three servers
// paused (the store down for everyone: leases kept), resumed (the store answers), then the
// node cut off: every probe times out, which is silence, and the lease lapses after
// --store-silence. Were the old verdict kept, the two servers would count as hung, the store
// as down, and the lease kept for as long as the cut lasts.
func TestKeeperForgetsHungServersOnceTheStoreAnswers(t *testing.T) {
	f := newVerdictFixture(t)
	f.answer(true)
	f.wantState(f.renew(0), KeeperLive)

	f.answer(false, "hung", "hung", "not-serving")
	f.wantState(f.renew(vTTL/5), KeeperStoreDown)
	f.renew(10 * vTTL) // a long outage: the lease kept ahead
	if f.lapsed() {
		t.Fatal("lease lapsed while the store was down for everyone")
	}

	f.answer(true)
	f.wantState(f.renew(vTTL/5), KeeperLive)
	f.renew(time.Hour) // weeks later, in this test's time

	// The node cut off: connecting to any server times out.
	f.answer(false, "silent", "silent", "silent")
	cut := f.clock.Now()
	st := f.renew(vTTL / 5)
	f.wantState(st, KeeperSilent)
	for f.clock.Now()-cut <= vTTL {
		f.wantState(f.renew(vTTL/5), KeeperSilent)
	}
	if !f.lapsed() {
		t.Fatalf("lease held %s after the node was cut off (store-silence %s): %+v", f.clock.Now()-cut, vTTL, f.record())
	}
}

// Each leaderless fault has a hold of its own: a second loss of the store's leader, long
// after the first was over, keeps the workers for the hold again, rather than lapsing their
// leases at once from the first fault's start. Within one fault the hold is not started
// again by a verdict that comes and goes.
func TestKeeperLeaderlessHoldIsPerFault(t *testing.T) {
	f := newVerdictFixture(t)
	hold := f.k.cfg.leaderlessHold()
	f.answer(true)
	f.renew(0)

	f.answer(false, "follower", "follower", "silent")
	first := f.clock.Now() + vTTL/5
	f.wantState(f.renew(vTTL/5), KeeperLeaderless)
	if f.lapsed() {
		t.Fatal("lease lapsed at the first leaderless verdict")
	}
	// Within the fault: a silent verdict, then leaderless again, starts no new hold.
	f.answer(false, "silent", "silent", "silent")
	f.wantState(f.renew(vTTL/5), KeeperSilent)
	f.answer(false, "follower", "follower", "silent")
	for f.clock.Now()-first <= hold {
		f.wantState(f.renew(vTTL/5), KeeperLeaderless)
	}
	if !f.lapsed() {
		t.Fatalf("lease held %s after the first leaderless verdict; the hold is %s: %+v", f.clock.Now()-first, hold, f.record())
	}

	// The election over, the store answers; a day later its leader is lost again.
	f.answer(true)
	f.wantState(f.renew(vTTL/5), KeeperLive)
	f.renew(24 * time.Hour)
	f.wantState(f.renew(vTTL/5), KeeperLive)
	f.answer(false, "silent", "follower", "follower")
	second := f.clock.Now() + vTTL/5
	f.wantState(f.renew(vTTL/5), KeeperLeaderless)
	for f.clock.Now()-second < hold {
		if f.lapsed() {
			t.Fatalf("lease lapsed %s into the second leaderless fault; its hold is %s", f.clock.Now()-second, hold)
		}
		f.wantState(f.renew(vTTL/5), KeeperLeaderless)
	}
}

// The keeper's stamps are its boot clock's readings: the lease file holds the send time of
// the last answered sync, whatever the wall clock says; a jump of the boot clock past the
// ttl (a machine resumed from suspend) is a lapse, and the renewal that follows starts a new
// generation, so that every launcher stops its worker even if it looked only afterwards.
func TestKeeperStampsOnTheBootClock(t *testing.T) {
	f := newVerdictFixture(t)
	f.answer(true)
	f.renew(0)
	sent := f.clock.Now()
	r := f.record()
	if r.Stamp != sent || r.Gen != 1 || r.Boot != leasefile.BootID() && leasefile.BootID() != "" {
		t.Fatalf("first record %+v, want stamp %s (the clock at the sync), generation 1", r, sent)
	}
	for range 5 {
		f.renew(vTTL / 5)
	}
	if r := f.record(); r.Stamp != f.clock.Now() || r.Gen != 1 {
		t.Fatalf("record %+v after renewals, want stamp %s in generation 1", r, f.clock.Now())
	}
	// Suspended for an hour, resumed: the first look is at a lease an hour old.
	f.clock.advance(time.Hour)
	if !f.lapsed() {
		t.Fatal("lease not lapsed after an hour of suspend")
	}
	st := f.renew(0)
	r = f.record()
	if r.Gen != 2 || r.Stamp != f.clock.Now() {
		t.Fatalf("record %+v after the resume, want generation 2 stamped now (%s)", r, f.clock.Now())
	}
	if st.LapsedBoot != f.clock.Now() || st.LapsedFromBoot != sent+5*(vTTL/5)+vTTL {
		t.Errorf("status records the lapse at %s from %s, want at %s from %s", st.LapsedBoot, st.LapsedFromBoot,
			f.clock.Now(), sent+5*(vTTL/5)+vTTL)
	}
	// Renewals in time keep the generation.
	f.renew(vTTL / 5)
	if r := f.record(); r.Gen != 2 {
		t.Fatalf("generation %d after a renewal in time, want 2", r.Gen)
	}
}

// A keeper that cannot record its status does not renew the leases: after the node's
// session changed, keeper.json still names the old one, and an agent reading it would act
// on an assignment of the old session. Once the status is written again, renewals resume
// (in a new generation, the lease having lapsed meanwhile).
func TestKeeperHoldsLeasesWhileItsStatusCannotBeRecorded(t *testing.T) {
	f := newVerdictFixture(t)
	f.answer(true)
	f.k.setSession(f.store.SessionID())
	f.renew(0)
	// keeper.json cannot be replaced: a directory stands in its place (as a full disk, the
	// write fails; the e2e test fills a real tmpfs).
	status := filepath.Join(f.k.cfg.StateDir, keeperStatusFile)
	if err := os.Remove(status); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(status, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := f.store.SessionID()
	if err := f.srv.ExpireSession(old); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a new session", 10*time.Second, func() bool { return f.store.SessionID() != old })
	held := f.record()
	for range 2 * 5 {
		st := f.renew(vTTL / 5)
		f.wantState(st, KeeperLive)
	}
	if r := f.record(); r != held {
		t.Fatalf("lease renewed to %+v while keeper.json could not be written (held at %+v)", r, held)
	}
	if !f.lapsed() {
		t.Fatal("lease not lapsed two ttls after the status could no longer be recorded")
	}
	if err := os.RemoveAll(status); err != nil {
		t.Fatal(err)
	}
	f.renew(vTTL / 5)
	if r := f.record(); r.Stamp != f.clock.Now() || r.Gen != held.Gen+1 {
		t.Fatalf("record %+v once the status is written again, want stamp %s in generation %d", r, f.clock.Now(), held.Gen+1)
	}
	if _, err := os.ReadFile(status); err != nil {
		t.Fatalf("keeper.json not written again: %v", err)
	}
}

// Back from an outage the store had for everyone, a node whose session is not back keeps its
// leases until RejoinGrace after the outage's last verdict, or the outage's own hold (its
// last stamp, a session timeout ahead), whichever is later, and no longer: the masters move
// its workers --reregister-grace after the store came back. The chaos run's lab (3 s there,
// a 2 s session) ran workers twice for 3.7 s when the hold was the default 5 s plus two
// sessions.
func TestKeeperRejoinHoldEndsAtRejoinGrace(t *testing.T) {
	for _, grace := range []time.Duration{time.Second, 2 * vTTL, DefaultRejoinGrace} {
		t.Run(grace.String(), func(t *testing.T) {
			f := newVerdictFixture(t)
			f.k.cfg.RejoinGrace = grace
			f.answer(true)
			f.wantState(f.renew(0), KeeperLive)

			f.answer(false, "not-serving", "not-serving", "not-serving")
			f.wantState(f.renew(vTTL/5), KeeperStoreDown)
			down := f.clock.Now()
			hold := max(grace, 2*vTTL)

			// The ensemble serves again; this node's session is not back.
			f.answer(false, "leader", "follower", "follower")
			for f.clock.Now()+vTTL/5-down < grace {
				f.wantState(f.renew(vTTL/5), KeeperRejoining)
			}
			for f.clock.Now()-down+vTTL/5 <= hold {
				if f.lapsed() {
					t.Fatalf("lease lapsed %s after the outage's last verdict; the hold is %s", f.clock.Now()-down, hold)
				}
				f.renew(vTTL / 5)
			}
			f.renew(vTTL / 5)
			if !f.lapsed() {
				t.Fatalf("lease held %s after the outage's last verdict; the rejoin grace is %s and the ttl %s: %+v",
					f.clock.Now()-down, grace, vTTL, f.record())
			}
		})
	}
}

// A hold ends when the store's leader answers: the stamp a hold set ahead of the answers
// (the store down for everyone, leaderless, or back and the node rejoining) is void from the
// first answer, and a node cut off right after it has its leases lapse a session timeout
// after its last answer, as the leader expires its session then and moves its workers. Kept,
// the workers ran on until the hold's stamp ran out, up to two sessions after the leader had
// moved them (the hour-long chaos run: a router ran twice for 3.6 s after a leaderless
// moment).
func TestKeeperHoldEndsWhenTheLeaderAnswers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		servers []string
		state   string
	}{
		{"leaderless", []string{"follower", "follower", "silent"}, KeeperLeaderless},
		{"store-down", []string{"not-serving", "not-serving", "not-serving"}, KeeperStoreDown},
		{"rejoining", nil, KeeperRejoining},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newVerdictFixture(t)
			f.answer(true)
			f.wantState(f.renew(0), KeeperLive)
			if tc.state == KeeperRejoining {
				f.answer(false, "not-serving", "not-serving", "not-serving")
				f.wantState(f.renew(vTTL/5), KeeperStoreDown)
				f.answer(false, "leader", "follower", "follower")
			} else {
				f.answer(false, tc.servers...)
			}
			f.wantState(f.renew(vTTL/5), tc.state)
			if held := f.record().Stamp - f.clock.Now(); held <= 0 {
				t.Fatalf("the %s verdict held no stamp ahead (%s): the test proves nothing", tc.state, held)
			}

			f.answer(true)
			f.wantState(f.renew(vTTL/5), KeeperLive)
			last := f.clock.Now()
			if got := f.record().Stamp; got != last {
				t.Fatalf("lease stamp %s after the leader answered at %s: the hold outlived the answer", got, last)
			}
			// Cut off: no server answers; the leader expires the session vTTL after last.
			f.answer(false, "silent", "silent", "silent")
			for f.clock.Now()+vTTL/5-last <= vTTL {
				f.wantState(f.renew(vTTL/5), KeeperSilent)
				if f.lapsed() {
					t.Fatalf("lease lapsed %s after the last answer, within the session timeout %s", f.clock.Now()-last, vTTL)
				}
			}
			f.renew(vTTL / 5)
			if !f.lapsed() {
				t.Fatalf("lease held %s after the last answer, past the session timeout %s: %+v", f.clock.Now()-last, vTTL, f.record())
			}
		})
	}
}
