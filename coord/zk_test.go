package coord_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
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

// The shared server (scripts/test) runs with tickTime=500ms: 1s is its shortest session.
const (
	sharedTick    = 500 * time.Millisecond
	sharedTimeout = time.Second
)

type zkBackend struct {
	addrs   string // comma-separated host:port list: one server or an ensemble
	chroot  string
	tick    time.Duration
	timeout time.Duration

	// srv, for a TLS server: clients connect with zks:// and its CA, and its four-letter
	// words go over TLS.
	srv *zktest.Server
	// tlsCA, for a shared TLS-only server (scripts/test's STORMDOCK_ZK_TLS): clients connect
	// with zks:// and this CA; its four-letter words go over TLS.
	tlsCA string

	mu      sync.Mutex
	dialers map[coord.Store]*zktest.Partition
}

// uniqueChroot names a fresh chroot for a test under top.
func uniqueChroot(t testing.TB, top string) string {
	name := strings.NewReplacer("/", "_", " ", "_", "\"", "", "\\", "").Replace(t.Name())
	return fmt.Sprintf("/%s/%s-%x", top, name, rand.Uint64())
}

func newZKBackendFunc(addrs string, tick, timeout time.Duration) func(t *testing.T) coordtest.Backend {
	return func(t *testing.T) coordtest.Backend {
		b := &zkBackend{addrs: addrs, chroot: uniqueChroot(t, "stormdock-test"), tick: tick, timeout: timeout,
			dialers: map[coord.Store]*zktest.Partition{}}
		t.Cleanup(func() { cleanupZK(t, addrs, b.chroot) })
		return b
	}
}

// cleanupZK removes a test's chroot; entries of killed clients may linger until their
// session ends, so it tolerates leftovers. addrs is one host:port or a comma-separated list.
func cleanupZK(t testing.TB, addrs, chroot string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := coord.OpenZK(ctx, strings.Split(addrs, ","), "", coord.Options{SessionTimeout: sharedTimeout, Logger: quiet})
	if err != nil {
		t.Logf("cleanup %s: %v", chroot, err)
		return
	}
	defer s.Close()
	if err := coord.DeleteTree(ctx, s, chroot); err != nil {
		t.Logf("cleanup %s: %v", chroot, err)
	}
}

func (b *zkBackend) Client(t *testing.T) coord.Store {
	d := &zktest.Partition{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s coord.Store
	var err error
	switch {
	case b.srv != nil:
		s, err = coord.Open(ctx, b.srv.URL(b.chroot), coord.Options{SessionTimeout: b.timeout, Dialer: d.Dial, TLS: coord.TLSFiles{CA: b.srv.CAFile()}})
	case b.tlsCA != "":
		s, err = coord.Open(ctx, "zks://"+b.addrs+b.chroot, coord.Options{SessionTimeout: b.timeout, Dialer: d.Dial, TLS: coord.TLSFiles{CA: b.tlsCA}})
	default:
		s, err = coord.OpenZK(ctx, strings.Split(b.addrs, ","), b.chroot, coord.Options{SessionTimeout: b.timeout, Dialer: d.Dial})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	b.mu.Lock()
	b.dialers[s] = d
	b.mu.Unlock()
	return s
}

func (b *zkBackend) Expire(t *testing.T, s coord.Store) {
	b.mu.Lock()
	d := b.dialers[s]
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ev := s.SessionEvents(ctx)
	sid := s.SessionID()
	d.Cut()
	// The server expires a session within timeout + one tick of the last ping.
	if b.srv != nil || b.tlsCA != "" {
		testenv.EventuallyWith(t, fmt.Sprintf("the server to expire session 0x%x", uint64(sid)), b.timeout+b.tick+5*time.Second, func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var live bool
			var err error
			if b.srv != nil {
				live, err = b.srv.SessionLive(ctx, sid)
			} else {
				live, err = zktest.SessionLiveTLS(ctx, b.addrs, b.tlsCA, sid)
			}
			if err != nil {
				return false, err.Error()
			}
			return !live, "the server lists it"
		})
	} else {
		waitSessionGone(t, b.addrs, sid, b.timeout+b.tick+5*time.Second)
	}
	d.Heal()
	for e := range ev {
		switch e.Type {
		case coord.SessionNew:
			return
		case coord.SessionReconnected:
			t.Fatal("session survived the pause: it was not expired")
		}
	}
	t.Fatal("no new session after expiry")
}

func (b *zkBackend) StartLeader(t *testing.T, prefix, id string) func() {
	if b.srv != nil {
		return coordtest.StartChildLeaderTLS(t, b.srv.URL(b.chroot), b.srv.CAFile(), b.timeout, prefix, id)
	}
	if b.tlsCA != "" {
		return coordtest.StartChildLeaderTLS(t, "zks://"+b.addrs+b.chroot, b.tlsCA, b.timeout, prefix, id)
	}
	return coordtest.StartChildLeader(t, "zk://"+b.addrs+b.chroot, b.timeout, prefix, id)
}

func (b *zkBackend) SessionTimeout() time.Duration { return b.timeout }

// ExpiryGrace: the server expires sessions in tick buckets and must log (fsync) the
// session's end before watchers hear of it; fsync here takes up to ~0.5s at p99.
func (b *zkBackend) ExpiryGrace() time.Duration { return 2*b.tick + 2*time.Second }

// waitSessionGone waits until no server of addrs (comma-separated) lists session sid, every
// one of them answering: the evidence that the ensemble expired the session. Followers list
// sessions too (see zktest.SessionLive); one server's word is not enough, as a dump that
// timed out on a loaded machine must not pass for an expiry.
func waitSessionGone(t testing.TB, addrs string, sid int64, timeout time.Duration) {
	t.Helper()
	testenv.EventuallyWith(t, fmt.Sprintf("the server to expire session 0x%x", uint64(sid)), timeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, addr := range strings.Split(addrs, ",") {
			live, err := zktest.SessionLive(ctx, addr, sid)
			if err != nil {
				return false, err.Error()
			}
			if live {
				return false, addr + " lists it"
			}
		}
		return true, ""
	})
}

func TestZKConformance(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddr(t)
	coordtest.RunSuite(t, newZKBackendFunc(addr, sharedTick, sharedTimeout))
}

// A ZooKeeper server killed and restarted: the client reconnects to its session by itself,
// persistent data is all there, ephemeral entries and watches survive.
func TestZKServerRestart(t *testing.T) {
	t.Parallel()
	// tickTime 500ms allows sessions up to 10s: the server restart (a JVM start) fits well
	// within 8s even on a loaded machine, so the session must survive it.
	srv := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := coord.Options{SessionTimeout: 8 * time.Second, Logger: testenv.Logger(t, slog.LevelDebug)}
	s, err := coord.Open(ctx, srv.URL("/restart"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sess := s.SessionEvents(ctx)
	for i := 0; i < 20; i++ {
		if _, err := s.Put(ctx, fmt.Sprintf("/jobs/j%02d", i), []byte(fmt.Sprint(i)), coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx, "/nodes/me", []byte("up"), coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	watch, _ := s.Watch(ctx, "/jobs/j05")
	<-watch
	sid := s.SessionID()

	srv.Kill()
	if ev := <-sess; ev.Type != coord.SessionDisconnected {
		t.Fatalf("after kill: %+v", ev)
	}
	// A read while the server is down waits, bounded by its context.
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = s.Get(rctx, "/jobs/j00")
	rcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read while down: %v", err)
	}
	srv.Restart()
	select {
	case ev := <-sess:
		if ev.Type != coord.SessionReconnected || ev.SessionID != sid {
			t.Fatalf("after restart: %+v (session was %x)", ev, sid)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no reconnect after restart")
	}
	kids, err := s.Children(ctx, "/jobs")
	if err != nil || len(kids) != 20 {
		t.Fatalf("children after restart: %d, %v", len(kids), err)
	}
	for i := 0; i < 20; i++ {
		e, err := s.Get(ctx, fmt.Sprintf("/jobs/j%02d", i))
		if err != nil || string(e.Value) != fmt.Sprint(i) {
			t.Fatalf("j%02d after restart: %+v %v", i, e, err)
		}
	}
	if e, err := s.Get(ctx, "/nodes/me"); err != nil || e.Owner != sid {
		t.Fatalf("ephemeral after restart: %+v %v", e, err)
	}
	// The watch set before the restart still fires.
	other, err := coord.Open(ctx, srv.URL("/restart"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Put(ctx, "/jobs/j05", []byte("new"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-watch:
		if string(ev.Entry.Value) != "new" {
			t.Fatalf("watch after restart: %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not fire after restart")
	}
}

// A server restarted while the client stays away past the session timeout: the client finds
// its session expired, opens a new one and re-creates its ephemeral entries; persistent data
// written before the restart is there.
func TestZKServerRestartSessionExpired(t *testing.T) {
	t.Parallel()
	srv := zktest.Start(t, zktest.Options{TickTime: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const timeout = 800 * time.Millisecond
	d := &zktest.Partition{}
	s, err := coord.OpenZK(ctx, []string{srv.Addr()}, "/down", coord.Options{SessionTimeout: timeout, Dialer: d.Dial, Logger: testenv.Logger(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sess := s.SessionEvents(ctx)
	if _, err := s.Create(ctx, "/nodes/me", []byte("up"), coord.Ephemeral); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "/jobs/wc", []byte("spec"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	sid := s.SessionID()
	d.Cut()
	srv.Kill()
	srv.Restart()
	// The restarted server restores the session from its log with a fresh timeout: stay
	// away until that has expired it.
	waitSessionGone(t, srv.Addr(), sid, timeout+srv.TickTime()+10*time.Second)
	d.Heal()
	var types []coord.SessionEventType
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev := <-sess:
			types = append(types, ev.Type)
			switch ev.Type {
			case coord.SessionReconnected:
				t.Fatalf("events %v: session not expired", types)
			case coord.SessionNew:
				if len(ev.Restored) != 1 || ev.Restored[0] != "/nodes/me" {
					t.Fatalf("new session restored %v lost %v", ev.Restored, ev.Lost)
				}
				e, err := s.Get(ctx, "/nodes/me")
				if err != nil || e.Owner == sid || e.Owner != s.SessionID() {
					t.Fatalf("restored entry %+v %v (old session %x)", e, err, sid)
				}
				if e, err := s.Get(ctx, "/jobs/wc"); err != nil || string(e.Value) != "spec" {
					t.Fatalf("persistent entry after restart: %+v %v", e, err)
				}
				if types[0] != coord.SessionDisconnected || !slices.Contains(types, coord.SessionExpired) {
					t.Fatalf("session events %v", types)
				}
				return
			}
		case <-deadline:
			t.Fatalf("session events %v, no new session", types)
		}
	}
}

// A standalone server down for longer than the session timeout, for every client at once:
// the client keeps trying, and when the server is back its session is kept (the server
// restores sessions from its log and starts their timeouts afresh), whether the server was
// SIGKILLed or stopped with SIGTERM. Compare TestZKServerRestartSessionExpired, where the
// server comes back but the client stays away: there the session expires. While the server
// is down, the probe finds it refusing connections: the store is down for everyone.
func TestZKServerDownLongerThanSession(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		stop func(s *zktest.Server)
	}{
		{"SIGKILL", (*zktest.Server).Kill},
		{"SIGTERM", (*zktest.Server).Stop},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := zktest.Start(t, zktest.Options{TickTime: 200 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const timeout = 2 * time.Second
			s, err := coord.Open(ctx, srv.URL("/down-for-all"), coord.Options{SessionTimeout: timeout, Logger: testenv.Logger(t, slog.LevelDebug)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			log := recordSessions(ctx, s)
			if _, err := s.Create(ctx, "/nodes/me", []byte("up"), coord.Ephemeral); err != nil {
				t.Fatal(err)
			}
			sid := s.SessionID()

			down := time.Now()
			tc.stop(srv)
			log.waitSeen(t, 30*time.Second, coord.SessionDisconnected)
			p, err := coord.ProbeStore(ctx, srv.URL(""), time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			if v := coord.Judge(p); v != coord.StoreDown || p[0].State != coord.ServerRefused {
				t.Fatalf("stopped server probed %v, judged %s; want refused, down", p, v)
			}
			time.Sleep(time.Until(down.Add(timeout + 2*time.Second)))
			srv.Restart()
			log.waitSeen(t, 30*time.Second, coord.SessionReconnected)
			t.Logf("server down %s: events %s", time.Since(down).Round(time.Millisecond), log.since(down))
			if got := s.SessionID(); got != sid {
				t.Fatalf("session %x after the restart, want %x kept (events %v)", got, sid, log.types())
			}
			if e, err := s.Get(ctx, "/nodes/me"); err != nil || e.Owner != sid {
				t.Fatalf("ephemeral after the restart: %+v %v", e, err)
			}
			for _, ty := range log.types() {
				if ty == coord.SessionExpired || ty == coord.SessionNew {
					t.Fatalf("events %v: the session was lost", log.types())
				}
			}
		})
	}
}

func TestZKChrootIsolation(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	top := uniqueChroot(t, "stormdock-test")
	t.Cleanup(func() { cleanupZK(t, addr, top) })
	opts := coord.Options{SessionTimeout: sharedTimeout}
	a, err := coord.Open(ctx, "zk://"+addr+top+"/a", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := coord.Open(ctx, "zk://"+addr+top+"/b", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	root, err := coord.Open(ctx, "zk://"+addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	if _, err := a.Put(ctx, "/jobs/x", []byte("A"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, "/jobs/x"); !errors.Is(err, coord.ErrNotFound) {
		t.Fatalf("b sees a's key: %v", err)
	}
	if _, err := b.Put(ctx, "/jobs/x", []byte("B"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	if e, _ := a.Get(ctx, "/jobs/x"); string(e.Value) != "A" {
		t.Fatalf("a's key changed by b: %q", e.Value)
	}
	if e, err := root.Get(ctx, top+"/a/jobs/x"); err != nil || string(e.Value) != "A" {
		t.Fatalf("unchrooted view of a's key: %+v %v", e, err)
	}
	kids, _ := a.Children(ctx, "/")
	if len(kids) != 1 || kids[0] != "jobs" {
		t.Fatalf("children of a's root: %v", kids)
	}
	if kids, _ := root.Children(ctx, "/"); contains(kids, "zookeeper") {
		t.Fatalf("/zookeeper is not hidden at the root: %v", kids)
	}
	k, err := a.Create(ctx, "/seq/n-", nil, coord.EphemeralSequential)
	if err != nil || k != "/seq/n-0000000000" {
		t.Fatalf("sequential key in chroot = %q, %v", k, err)
	}
	ch, _ := a.WatchChildren(ctx, "/")
	if ev := <-ch; !ev.Exists || !contains(ev.Children, "seq") {
		t.Fatalf("watch of chroot root: %+v", ev)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// With credentials every created znode carries a creator-only digest ACL: a client without
// them (or with wrong ones) can neither read nor change stormdock's tree.
func TestZKACL(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	chroot := uniqueChroot(t, "stormdock-acl-test")
	opts := coord.Options{SessionTimeout: sharedTimeout}
	owner, err := coord.Open(ctx, "zk://stormdock:s3cret@"+addr+chroot, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	t.Cleanup(func() {
		s, err := coord.OpenZK(ctx, []string{addr}, "", coord.Options{SessionTimeout: sharedTimeout, Credentials: "stormdock:s3cret"})
		if err == nil {
			_ = coord.DeleteTree(ctx, s, chroot)
			_ = coord.DeleteTree(ctx, s, "/stormdock-acl-test")
			s.Close()
		}
	})
	if _, err := owner.Put(ctx, "/jobs/wc", []byte("spec"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}

	anon, err := coord.Open(ctx, "zk://"+addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	wrongOpts := opts
	wrongOpts.Credentials = "stormdock:wrong"
	wrong, err := coord.OpenZK(ctx, []string{addr}, "", wrongOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()

	key := chroot + "/jobs/wc"
	for name, c := range map[string]coord.Store{"no credentials": anon, "wrong credentials": wrong} {
		t.Run(name, func(t *testing.T) {
			steps := []struct {
				what string
				err  error
			}{
				{"put", func() error { _, err := c.Put(ctx, key, []byte("evil"), coord.AnyVersion); return err }()},
				{"delete", c.Delete(ctx, key, coord.AnyVersion)},
				{"create child", func() error { _, err := c.Create(ctx, chroot+"/jobs/evil", nil, coord.Persistent); return err }()},
				{"create in chroot", func() error { _, err := c.Create(ctx, chroot+"/evil", nil, coord.Persistent); return err }()},
				{"get", func() error { _, err := c.Get(ctx, key); return err }()},
				{"txn", func() error { _, err := c.Txn(ctx, coord.PutOp(key, nil, coord.AnyVersion)); return err }()},
			}
			for _, s := range steps {
				if !errors.Is(s.err, coord.ErrPermission) {
					t.Errorf("%s: %v, want ErrPermission", s.what, s.err)
				}
			}
		})
	}
	if e, err := owner.Get(ctx, "/jobs/wc"); err != nil || string(e.Value) != "spec" {
		t.Fatalf("owner's entry after attacks: %+v %v", e, err)
	}
	// Another client with the right credentials may change it.
	second, err := coord.Open(ctx, "zk://stormdock:s3cret@"+addr+chroot, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	if _, err := second.Put(ctx, "/jobs/wc", []byte("v2"), 0); err != nil {
		t.Fatal(err)
	}
}

func TestZKUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	start := time.Now()
	_, err = coord.Open(context.Background(), "zk://"+addr+"/x", coord.Options{ConnectTimeout: 700 * time.Millisecond})
	took := time.Since(start)
	if err == nil || !errors.Is(err, coord.ErrUnavailable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("open of unreachable server: %v", err)
	}
	if took > 700*time.Millisecond+2*time.Second { // no hang: the bound has room for a loaded machine
		t.Fatalf("open took %s with a 700ms connect timeout", took)
	}
	// A context ending first wins too.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := coord.Open(ctx, "zk://"+addr, coord.Options{ConnectTimeout: 10 * time.Second}); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("open with a short context: %v after %s", err, time.Since(start))
	}
}

// TestZKGrantedSessionTimeout: a server whose maxSessionTimeout is 2s grants a client
// asking for 8s a 2s session, and the client says so; one asking for less gets what it
// asked.
func TestZKGrantedSessionTimeout(t *testing.T) {
	srv := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond, MaxSessionTimeout: 2 * time.Second})
	for _, tc := range []struct {
		ask, want time.Duration
	}{
		{8 * time.Second, 2 * time.Second},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
	} {
		t.Run(tc.ask.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := coord.OpenZK(ctx, []string{srv.Addr()}, "", coord.Options{SessionTimeout: tc.ask, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := coord.GrantedSessionTimeout(s); got != tc.want {
				t.Fatalf("granted %v asking for %v, want %v", got, tc.ask, tc.want)
			}
		})
	}
}

// TestZKWatchFuncDeletionWithoutRead: a key's deletion reaches WatchFunc's function from
// the watch's firing, before the read that re-arms the watch: with every request of the
// client held back (as a loaded server's queue holds them), the deletion arrives in the same
// session. The re-armed watch still sees the key created again.
func TestZKWatchFuncDeletionWithoutRead(t *testing.T) {
	t.Parallel()
	addr := testenv.ZKAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(time.Minute))
	defer cancel()
	var held heldWrites
	opts := coord.Options{SessionTimeout: 10 * time.Second, Logger: testenv.Logger(t, slog.LevelInfo),
		Dialer: func(network, address string, timeout time.Duration) (net.Conn, error) {
			c, err := net.DialTimeout(network, address, timeout)
			if err != nil {
				return nil, err
			}
			return held.wrap(c), nil
		}}
	url := fmt.Sprintf("zk://%s/watchdel-%x", addr, rand.Uint64())
	s, err := coord.Open(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := coord.Open(ctx, url, coord.Options{SessionTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Put(ctx, "/nodes/n1", []byte("up"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		ev      coord.Event
		held    bool
		session int64
	}
	events := make(chan seen, 16)
	if err := s.(coord.FuncWatcher).WatchFunc(ctx, "/nodes/n1", func(ev coord.Event) {
		events <- seen{ev, held.holding(), s.SessionID()}
	}, nil); err != nil {
		t.Fatal(err)
	}
	if got := <-events; !got.ev.Exists {
		t.Fatalf("first event: %+v, want the key", got.ev)
	}
	sid := s.SessionID()
	held.hold()
	if err := other.Delete(ctx, "/nodes/n1", coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	var got seen
	select {
	case got = <-events:
	case <-ctx.Done():
		held.release()
		t.Fatal("no deletion while the client's requests were held")
	}
	held.release()
	if got.ev.Exists || !got.held || got.session != sid {
		t.Fatalf("deletion: %+v, requests held %v, session %x (was %x): want it while the requests were held, in the same session",
			got.ev, got.held, got.session, sid)
	}
	if _, err := other.Put(ctx, "/nodes/n1", []byte("again"), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	for got := range events {
		if got.ev.Exists {
			if string(got.ev.Entry.Value) != "again" {
				t.Fatalf("after re-creation: %+v", got.ev)
			}
			break
		}
	}
}

// heldWrites holds back what the client writes to its connections, from hold to release.
type heldWrites struct {
	mu   sync.Mutex
	gate chan struct{} // nil when not holding
}

func (h *heldWrites) wrap(c net.Conn) net.Conn { return &heldConn{Conn: c, h: h} }

func (h *heldWrites) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gate = make(chan struct{})
}

func (h *heldWrites) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gate != nil {
		close(h.gate)
		h.gate = nil
	}
}

func (h *heldWrites) holding() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gate != nil
}

type heldConn struct {
	net.Conn
	h *heldWrites
}

func (c *heldConn) Write(b []byte) (int, error) {
	c.h.mu.Lock()
	gate := c.h.gate
	c.h.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return c.Conn.Write(b)
}
