package coord_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/coordtest"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// The ensemble tests start three JVMs each: they do not run in parallel with each other or
// with the other tests of this package (top-level tests without t.Parallel run alone, before
// the parallel ones).
const ensembleTick = 250 * time.Millisecond

// The conformance suite's session tests against a 3-server ensemble: clients are spread over
// the servers, so a session's pings, its ephemeral entries' removal and the watches that see
// it go pass through followers and the leader.
func TestZKEnsembleSuite(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3, zktest.Options{TickTime: ensembleTick})
	coordtest.RunSessionSuite(t, newZKBackendFunc(ens.Addrs(), ensembleTick, 2*time.Second))
	// Redial moves a client to another server within its session.
	t.Run("Redial", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := startOn(t, ctx, ens, ens.Servers()[0], "redial", 2*time.Second)
		from := c.d.Last()
		coord.Redial(c.s)
		testenv.EventuallyWith(t, "the client on another server", 30*time.Second, func() (bool, string) {
			return c.d.Last() != from, "on " + c.d.Last()
		})
		c.settle(t, ctx, c.s)
		c.checkKept(t)
	})
}

// sessionLog records a client's session events with the time they arrived.
type sessionLog struct {
	start time.Time
	mu    sync.Mutex
	evs   []coord.SessionEvent
	at    []time.Duration
	wake  chan struct{}
}

func recordSessions(ctx context.Context, s coord.Store) *sessionLog {
	l := &sessionLog{start: time.Now(), wake: make(chan struct{}, 1)}
	ch := s.SessionEvents(ctx)
	go func() {
		for ev := range ch {
			l.mu.Lock()
			l.evs = append(l.evs, ev)
			l.at = append(l.at, time.Since(l.start))
			l.mu.Unlock()
			select {
			case l.wake <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

func (l *sessionLog) types() []coord.SessionEventType {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []coord.SessionEventType
	for _, ev := range l.evs {
		out = append(out, ev.Type)
	}
	return out
}

// String lists the events with their times relative to mark.
func (l *sessionLog) since(mark time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, ev := range l.evs {
		fmt.Fprintf(&b, "%s@%+.1fs ", ev.Type, (l.at[i] - mark.Sub(l.start)).Seconds())
	}
	return strings.TrimSpace(b.String())
}

func (l *sessionLog) events() []coord.SessionEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]coord.SessionEvent(nil), l.evs...)
}

// waitSeen waits until an event of the given type has arrived (at any time since recording
// began).
func (l *sessionLog) waitSeen(t *testing.T, d time.Duration, ty coord.SessionEventType) {
	t.Helper()
	deadline := time.After(d)
	for {
		for _, ev := range l.events() {
			if ev.Type == ty {
				return
			}
		}
		select {
		case <-l.wake:
		case <-deadline:
			t.Fatalf("no %s session event within %s; events %v", ty, d, l.types())
		}
	}
}

// ensembleClient is a client started on a chosen server of an ensemble, holding one
// ephemeral entry.
type ensembleClient struct {
	name string
	s    *coord.ZK
	d    *zktest.Pin
	log  *sessionLog
	sid  int64 // the session the entry was created in
	key  string
}

func startOn(t *testing.T, ctx context.Context, ens *zktest.Ensemble, on *zktest.Server, name string, timeout time.Duration) *ensembleClient {
	t.Helper()
	d := zktest.NewPin(on.Addr(), nil)
	s, err := coord.OpenZK(ctx, strings.Split(ens.Addrs(), ","), "/ensemble",
		coord.Options{SessionTimeout: timeout, Dialer: d.Dial, Logger: testenv.Logger(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	d.Release()
	c := &ensembleClient{name: name, s: s, d: d, log: recordSessions(ctx, s), sid: s.SessionID(), key: "/nodes/" + name}
	if _, err := s.Create(ctx, c.key, []byte(name), coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	return c
}

// entryOwner reads key through s and returns its owner (0 if missing); the read waits while
// s has no session.
func entryOwner(t *testing.T, ctx context.Context, s coord.Store, key string) int64 {
	t.Helper()
	e, err := s.Get(ctx, key)
	switch {
	case errors.Is(err, coord.ErrNotFound):
		return 0
	case err != nil:
		t.Fatalf("get %s: %v", key, err)
	}
	return e.Owner
}

// settle waits until the client is back from an outage: its latest session event, if any,
// says it has a session (reconnected, or new after expiry) and its entry, read through
// reader, is owned by that session (re-created by the client if the session was new).
func (c *ensembleClient) settle(t *testing.T, ctx context.Context, reader coord.Store) {
	t.Helper()
	timeout := time.Minute
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	testenv.EventuallyWith(t, c.name+" settled", timeout, func() (bool, string) {
		evs := c.log.events()
		if n := len(evs); n == 0 || evs[n-1].Type == coord.SessionReconnected || evs[n-1].Type == coord.SessionNew {
			if owner := entryOwner(t, ctx, reader, c.key); owner != 0 && owner == c.s.SessionID() {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events %v, session %x", c.log.types(), c.s.SessionID())
	})
}

// checkKept fails unless the client kept its session through the outage.
func (c *ensembleClient) checkKept(t *testing.T) {
	t.Helper()
	if got := c.s.SessionID(); got != c.sid {
		t.Fatalf("%s: session %x, want %x kept (events %v)", c.name, got, c.sid, c.log.types())
	}
	for _, ev := range c.log.events() {
		if ev.Type == coord.SessionExpired || ev.Type == coord.SessionNew {
			t.Fatalf("%s: session events %v: the session was lost", c.name, c.log.types())
		}
	}
}

// countLog counts the lines containing what that the ensemble's servers logged since the
// given log sizes (logSizes): "Expiring session" for sessions the servers expired,
// "LEADING - LEADER ELECTION" for elections won.
func countLog(ens *zktest.Ensemble, since []int, what string) int {
	n := 0
	for i, s := range ens.Servers() {
		n += strings.Count(s.Log()[since[i]:], what)
	}
	return n
}

const (
	logExpired = "Expiring session"
	logElected = "LEADING - LEADER ELECTION"
)

func logSizes(ens *zktest.Ensemble) []int {
	var out []int
	for _, s := range ens.Servers() {
		out = append(out, len(s.Log()))
	}
	return out
}

// The leader of a 3-server ensemble is SIGKILLed while clients are connected to it and to a
// follower: the two survivors elect a new leader and every session survives, its ephemeral
// entry never gone. Observed on loopback: a quorum serves again within about 0.7s; the
// followers drop their clients too when they lose the leader (they stop serving until the
// new leader has synced them), so every client sees SessionDisconnected and then
// SessionReconnected with the same session about a second later (go-zookeeper waits a
// second each time it has tried every server); no session expires, because the new leader
// starts every session's timeout afresh.
func TestZKEnsembleLeaderKilled(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3, zktest.Options{TickTime: ensembleTick})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// 4s: a failover took about a second on loopback; the rest is room for a loaded machine.
	const timeout = 4 * time.Second
	leader := ens.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	var follower *zktest.Server
	for _, s := range ens.Servers() {
		if s != leader {
			follower = s
			break
		}
	}
	clients := []*ensembleClient{
		startOn(t, ctx, ens, leader, "on-leader", timeout),
		startOn(t, ctx, ens, follower, "on-follower", timeout),
	}
	before := logSizes(ens)

	kill := time.Now()
	leader.Kill()
	// The client on the killed server must lose its connection, and come back to its
	// session on another server.
	clients[0].log.waitSeen(t, 30*time.Second, coord.SessionDisconnected)
	if err := ens.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %s: a quorum served again after %s, new leader %v (%d elections)", leader,
		time.Since(kill).Round(time.Millisecond), ens.Leader(), countLog(ens, before, logElected))

	for _, c := range clients {
		c.settle(t, ctx, clients[1].s)
		t.Logf("%s: events %s; now on %s", c.name, c.log.since(kill), c.d.Last())
		c.checkKept(t)
	}
	if n := countLog(ens, before, logExpired); n != 0 {
		t.Fatalf("servers expired %d sessions during the failover", n)
	}
}

// boundedOps runs every kind of request with a short context against a client whose store
// has no quorum: each must give up with the context (or as unavailable), not hang.
func boundedOps(t *testing.T, s coord.Store) {
	t.Helper()
	const limit = 500 * time.Millisecond
	ops := []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"get", func(ctx context.Context) error { _, err := s.Get(ctx, "/nodes"); return err }},
		{"children", func(ctx context.Context) error { _, err := s.Children(ctx, "/nodes"); return err }},
		{"put", func(ctx context.Context) error { _, err := s.Put(ctx, "/x", []byte("x"), coord.AnyVersion); return err }},
		{"create", func(ctx context.Context) error { _, err := s.Create(ctx, "/y", nil, coord.Ephemeral); return err }},
		{"delete", func(ctx context.Context) error { return s.Delete(ctx, "/x", coord.AnyVersion) }},
		{"txn", func(ctx context.Context) error {
			_, err := s.Txn(ctx, coord.PutOp("/x", nil, coord.AnyVersion))
			return err
		}},
	}
	for _, op := range ops {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		start := time.Now()
		err := op.do(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, coord.ErrUnavailable) {
			t.Errorf("%s without quorum: %v, want deadline exceeded or unavailable", op.name, err)
		}
		// No hang: the bound proves the context is honoured, with room for a loaded machine.
		if took > limit+5*time.Second {
			t.Errorf("%s without quorum took %s with a %s context", op.name, took, limit)
		}
	}
}

// waitVerdict probes the ensemble until Judge gives want.
func waitVerdict(t *testing.T, ctx context.Context, ens *zktest.Ensemble, want coord.StoreVerdict) []coord.ServerProbe {
	t.Helper()
	for {
		p, err := coord.ProbeStore(ctx, ens.URL(""), 500*time.Millisecond, nil)
		if err != nil {
			t.Fatal(err)
		}
		if coord.Judge(p) == want {
			return p
		}
		if ctx.Err() != nil {
			t.Fatalf("store never judged %s: last probes %v", want, p)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Two of three servers are SIGKILLed and stay down longer than the session timeout; the
// survivor stops serving. Clients report disconnected, and requests give up with their
// context. When the two come back, every session is kept (SessionReconnected, same id,
// ephemeral entries never gone): without a quorum no server can expire a session, and the
// new leader starts every session's timeout afresh, so however long the store was down for
// everyone, a client that reconnects within the timeout keeps its session.
func TestZKEnsembleMajorityKilled(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3, zktest.Options{TickTime: ensembleTick})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const timeout = 3 * time.Second
	srv := ens.Servers()
	// Kill the leader and one follower; one client sits on the surviving follower, one on
	// the leader.
	leader := ens.Leader()
	var survivor, other *zktest.Server
	for _, s := range srv {
		switch {
		case s == leader:
		case survivor == nil:
			survivor = s
		default:
			other = s
		}
	}
	clients := []*ensembleClient{
		startOn(t, ctx, ens, survivor, "on-survivor", timeout),
		startOn(t, ctx, ens, leader, "on-killed", timeout),
	}
	before := logSizes(ens)

	down := time.Now()
	leader.Kill()
	other.Kill()
	for _, c := range clients {
		c.log.waitSeen(t, 30*time.Second, coord.SessionDisconnected)
	}
	t.Logf("2 of 3 killed: clients disconnected after %s", time.Since(down).Round(time.Millisecond))
	boundedOps(t, clients[0].s)
	p := waitVerdict(t, ctx, ens, coord.StoreDown)
	t.Logf("probes without quorum: %v", p)

	// Down for everyone for longer than the session timeout.
	time.Sleep(time.Until(down.Add(timeout + 2*time.Second)))
	up := time.Now()
	leader.Restart()
	other.Restart()
	if err := ens.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("down %s; a quorum served %s after the restarts began", up.Sub(down).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	for _, c := range clients {
		c.settle(t, ctx, clients[0].s)
		t.Logf("%s: events %s; now on %s", c.name, c.log.since(down), c.d.Last())
		c.checkKept(t)
	}
	if n := countLog(ens, before, logExpired); n != 0 {
		t.Fatalf("servers expired %d sessions", n)
	}
	waitVerdict(t, ctx, ens, coord.StoreUp)
}

// Every server is SIGSTOPped for longer than the session timeout, then continued. While
// stopped the store is down for everyone: clients report disconnected, requests give up with
// their context, every server probes hung. What happens on SIGCONT depends on which thread
// of the leader runs first: its session tracker finds every session overdue and may expire
// them all at once before the clients' reconnects arrive; or the followers' sync timeouts
// fire first and a new election starts every session's timeout afresh. Either way the
// invariant holds: each client ends up with a working session that owns its ephemeral entry
// (kept, or re-created by the client after SessionExpired and SessionNew). The test logs
// which happened.
func TestZKEnsembleAllPaused(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3, zktest.Options{TickTime: ensembleTick})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const timeout = 3 * time.Second
	leader := ens.Leader()
	var follower *zktest.Server
	for _, s := range ens.Servers() {
		if s != leader {
			follower = s
			break
		}
	}
	clients := []*ensembleClient{
		startOn(t, ctx, ens, leader, "on-leader", timeout),
		startOn(t, ctx, ens, follower, "on-follower", timeout),
	}
	before := logSizes(ens)

	paused := time.Now()
	for _, s := range ens.Servers() {
		s.Pause() // a failing test leaves them paused: Kill at cleanup ends stopped JVMs too
	}
	for _, c := range clients {
		c.log.waitSeen(t, 30*time.Second, coord.SessionDisconnected)
	}
	t.Logf("all paused: clients disconnected after %s", time.Since(paused).Round(time.Millisecond))
	boundedOps(t, clients[0].s)
	p := waitVerdict(t, ctx, ens, coord.StoreDown)
	for _, x := range p {
		if x.State != coord.ServerHung {
			t.Fatalf("paused server probed %s, want hung: %v", x.State, p)
		}
	}

	time.Sleep(time.Until(paused.Add(timeout + 2*time.Second)))
	resumed := time.Now()
	atResume := logSizes(ens)
	for _, s := range ens.Servers() {
		s.Resume()
	}
	if err := ens.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("paused %s; a quorum served %s after SIGCONT, leader %v", resumed.Sub(paused).Round(time.Millisecond),
		time.Since(resumed).Round(time.Millisecond), ens.Leader())
	// The invariant: every entry is there again, owned by its client's current session.
	kept := 0
	for _, c := range clients {
		c.settle(t, ctx, clients[1].s)
		t.Logf("%s: events %s; now on %s", c.name, c.log.since(paused), c.d.Last())
		if c.s.SessionID() == c.sid {
			c.checkKept(t)
			kept++
			continue
		}
		// Lost: the client was told, and the new session re-created the entry.
		var expired, restored bool
		for _, ev := range c.log.events() {
			expired = expired || ev.Type == coord.SessionExpired && ev.SessionID == c.sid
			restored = restored || ev.Type == coord.SessionNew && slices.Equal(ev.Restored, []string{c.key}) && len(ev.Lost) == 0
		}
		if !expired || !restored {
			t.Fatalf("%s: session %x replaced by %x, events %v: want expired then new with %s restored",
				c.name, c.sid, c.s.SessionID(), c.log.events(), c.key)
		}
	}
	t.Logf("after SIGCONT: %d of %d sessions kept; the servers expired %d sessions and held %d elections",
		kept, len(clients), countLog(ens, before, logExpired), countLog(ens, atResume, logElected))
}
