package coord_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
)

func probes(states ...coord.ServerState) []coord.ServerProbe {
	out := make([]coord.ServerProbe, len(states))
	for i, s := range states {
		out[i] = coord.ServerProbe{Addr: fmt.Sprintf("zk%d:2181", i+1), State: s}
	}
	return out
}

func TestJudge(t *testing.T) {
	const (
		serving    = coord.ServerServing
		notServing = coord.ServerNotServing
		refused    = coord.ServerRefused
		hung       = coord.ServerHung
		silent     = coord.ServerSilent
		unknown    = coord.ServerUnknown
	)
	tests := []struct {
		name   string
		states []coord.ServerState
		want   coord.StoreVerdict
	}{
		{"3 serving", []coord.ServerState{serving, serving, serving}, coord.StoreUp},
		{"2 serving, 1 refused", []coord.ServerState{serving, serving, refused}, coord.StoreUp},
		{"1 serving, 2 refused (quorum just lost or a stale answer)", []coord.ServerState{refused, serving, refused}, coord.StoreUp},
		{"1 serving, 2 silent", []coord.ServerState{silent, silent, serving}, coord.StoreUp},
		{"0 serving: 3 refused", []coord.ServerState{refused, refused, refused}, coord.StoreDown},
		{"0 serving: 2 refused, 1 not serving (2 of 3 killed)", []coord.ServerState{refused, notServing, refused}, coord.StoreDown},
		{"0 serving: 3 hung (all paused)", []coord.ServerState{hung, hung, hung}, coord.StoreDown},
		{"0 serving: refused, hung, not serving", []coord.ServerState{refused, hung, notServing}, coord.StoreDown},
		{"2 refused, 1 silent: the silent one alone has no quorum", []coord.ServerState{refused, silent, refused}, coord.StoreDown},
		{"1 refused, 2 silent: the silent two may serve others", []coord.ServerState{refused, silent, silent}, coord.StoreSilent},
		{"1 hung, 2 silent", []coord.ServerState{silent, hung, silent}, coord.StoreSilent},
		{"3 silent: our partition, or three dead hosts", []coord.ServerState{silent, silent, silent}, coord.StoreSilent},
		{"unknown counts as serving", []coord.ServerState{refused, refused, unknown}, coord.StoreUp},
		{"unknown beside silent ones", []coord.ServerState{unknown, silent, silent}, coord.StoreUp},
		{"an unrecognised state counts as serving", []coord.ServerState{refused, refused, 0}, coord.StoreUp},
		{"single server serving", []coord.ServerState{serving}, coord.StoreUp},
		{"single server refused", []coord.ServerState{refused}, coord.StoreDown},
		{"single server hung", []coord.ServerState{hung}, coord.StoreDown},
		{"single server silent", []coord.ServerState{silent}, coord.StoreSilent},
		{"two servers, one refused: Judge wants a strict majority", []coord.ServerState{refused, silent}, coord.StoreSilent},
		{"two servers, both refused", []coord.ServerState{refused, notServing}, coord.StoreDown},
		{"five servers, 3 down, 2 silent", []coord.ServerState{hung, silent, refused, silent, notServing}, coord.StoreDown},
		{"five servers, 2 down, 3 silent", []coord.ServerState{hung, silent, refused, silent, silent}, coord.StoreSilent},
		{"no probes", nil, coord.StoreSilent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := coord.Judge(probes(tc.states...)); got != tc.want {
				t.Fatalf("Judge(%v) = %s, want %s", tc.states, got, tc.want)
			}
		})
	}
}

// TestJudgeLeaderless: serving servers' modes tell a lost leader from a partition of ours.
func TestJudgeLeaderless(t *testing.T) {
	p := func(state coord.ServerState, mode string) coord.ServerProbe {
		return coord.ServerProbe{Addr: "zk:2181", State: state, Detail: mode}
	}
	serving, silent, hung, refused := coord.ServerServing, coord.ServerSilent, coord.ServerHung, coord.ServerRefused
	tests := []struct {
		name   string
		probes []coord.ServerProbe
		want   coord.StoreVerdict
	}{
		{"leader's host cut: two followers, one silent", []coord.ServerProbe{p(serving, "follower"), p(silent, ""), p(serving, "follower")}, coord.StoreLeaderless},
		{"leader stopped: two followers, one hung", []coord.ServerProbe{p(hung, ""), p(serving, "follower"), p(serving, "follower")}, coord.StoreLeaderless},
		{"five servers, leader and a follower cut", []coord.ServerProbe{p(serving, "follower"), p(silent, ""), p(serving, "follower"), p(silent, ""), p(serving, "follower")}, coord.StoreLeaderless},
		{"a follower cut: the leader answers", []coord.ServerProbe{p(serving, "leader"), p(silent, ""), p(serving, "follower")}, coord.StoreUp},
		{"followers only, nobody unreached: the leader is elsewhere", []coord.ServerProbe{p(serving, "follower"), p(serving, "follower")}, coord.StoreUp},
		{"leader killed: a follower that has not noticed, the leader refusing", []coord.ServerProbe{p(serving, "follower"), p(refused, ""), p(serving, "follower")}, coord.StoreLeaderless},
		{"a follower, a server not serving: that one follows nobody", []coord.ServerProbe{p(serving, "follower"), p(coord.ServerNotServing, ""), p(silent, "")}, coord.StoreUp},
		{"a standalone server", []coord.ServerProbe{p(serving, "standalone")}, coord.StoreUp},
		{"a serving server of unknown mode", []coord.ServerProbe{p(serving, ""), p(silent, ""), p(serving, "follower")}, coord.StoreUp},
		{"an unknown answer", []coord.ServerProbe{p(coord.ServerUnknown, ""), p(silent, ""), p(serving, "follower")}, coord.StoreUp},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := coord.Judge(tc.probes); got != tc.want {
				t.Fatalf("Judge(%v) = %s, want %s", tc.probes, got, tc.want)
			}
		})
	}
}

func TestProbeStrings(t *testing.T) {
	tests := []struct{ got, want string }{
		{coord.ServerServing.String(), "serving"},
		{coord.ServerNotServing.String(), "not-serving"},
		{coord.ServerRefused.String(), "refused"},
		{coord.ServerHung.String(), "hung"},
		{coord.ServerSilent.String(), "silent"},
		{coord.ServerUnknown.String(), "unknown"},
		{coord.ServerState(0).String(), "ServerState(0)"},
		{coord.StoreUp.String(), "up"},
		{coord.StoreDown.String(), "down"},
		{coord.StoreSilent.String(), "silent"},
		{coord.StoreLeaderless.String(), "leaderless"},
		{coord.StoreVerdict(9).String(), "StoreVerdict(9)"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("String() = %q, want %q", tc.got, tc.want)
		}
	}
}

// fakeServer listens on loopback and answers every connection with handle.
func fakeServer(t *testing.T, handle func(c net.Conn)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				handle(c)
			}()
		}
	}()
	return l.Addr().String()
}

// answer reads the four-letter word and writes reply, as ZooKeeper does, then closes.
func answer(reply string) func(c net.Conn) {
	return func(c net.Conn) {
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "srvr" {
			return
		}
		_, _ = c.Write([]byte(reply))
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// fullBacklog returns the address of a listener whose accept queue is full: Linux drops the
// SYNs of further connections (whatever tcp_syncookies says), so they time out as they would
// against a partition that drops packets.
func fullBacklog(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the queue (of one: backlog 0) with a connection nobody accepts.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("fill the accept queue: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return addr
}

type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// ProbeServers against fake servers and dial functions: every way a server can answer or
// not, classified without a JVM.
func TestProbeServersClassifies(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	// blockingDial never connects: it waits for its context, as a dial into a partition
	// that drops SYNs does. It stands for "no TCP answer" deterministically; the full
	// accept queue below does the same with the kernel's real SYN drop, and partitions
	// between hosts are tested with network namespaces elsewhere.
	blockingDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	}
	unreachable := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.EHOSTUNREACH}
	}
	tests := []struct {
		name       string
		addr       func(t *testing.T) string
		dial       dialFunc
		want       coord.ServerState
		wantDetail string
	}{
		{"leader", func(t *testing.T) string {
			return fakeServer(t, answer("Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0.0/0\nMode: leader\nNode count: 5\n"))
		}, nil, coord.ServerServing, "leader"},
		{"standalone", func(t *testing.T) string {
			return fakeServer(t, answer("Zookeeper version: 3.8.0\nMode: standalone\n"))
		}, nil, coord.ServerServing, "standalone"},
		{"no quorum", func(t *testing.T) string {
			return fakeServer(t, answer("This ZooKeeper instance is not currently serving requests\n"))
		}, nil, coord.ServerNotServing, "not currently serving"},
		{"read-only server", func(t *testing.T) string {
			return fakeServer(t, answer("Zookeeper version: 3.8.0\nMode: read-only\n"))
		}, nil, coord.ServerNotServing, "read-only"},
		{"srvr not whitelisted", func(t *testing.T) string {
			return fakeServer(t, answer("srvr is not executed because it is not in the whitelist.\n"))
		}, nil, coord.ServerUnknown, "whitelist"},
		{"closes without answer", func(t *testing.T) string {
			return fakeServer(t, answer(""))
		}, nil, coord.ServerUnknown, "without an answer"},
		{"resets the connection", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) {
				_, _ = io.ReadFull(c, make([]byte, 4))
				_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
			})
		}, nil, coord.ServerUnknown, "reset"},
		{"accepts, never answers", func(t *testing.T) string {
			return fakeServer(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
		}, nil, coord.ServerHung, "no answer"},
		{"nothing listens", closedPort, nil, coord.ServerRefused, "refused"},
		{"accept queue full: SYNs dropped", fullBacklog, nil, coord.ServerSilent, "timeout"},
		{"dial blocks until the timeout", closedPort, blockingDial, coord.ServerSilent, "deadline"},
		{"host unreachable", closedPort, unreachable, coord.ServerSilent, "no route"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := tc.addr(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := coord.ProbeServers(ctx, []string{addr}, timeout, tc.dial)
			if len(got) != 1 {
				t.Fatalf("%d probes for one address", len(got))
			}
			p := got[0]
			t.Logf("%s", p)
			if p.Addr != addr || p.State != tc.want || !strings.Contains(p.Detail, tc.wantDetail) {
				t.Fatalf("probe = %s, want %s with detail containing %q", p, tc.want, tc.wantDetail)
			}
			if tc.want == coord.ServerHung || tc.want == coord.ServerSilent && tc.dial == nil {
				if p.Took < timeout*9/10 {
					t.Fatalf("%s after %s, before the %s timeout", p.State, p.Took, timeout)
				}
			}
		})
	}
}

// ProbeServers asks all servers at once and keeps the order of the addresses; the caller's
// context ending cuts every probe short, and those count as unknown (nothing learnt).
func TestProbeServersConcurrentAndCancelled(t *testing.T) {
	t.Parallel()
	addrs := []string{"a:1", "b:2", "c:3"}
	var inFlight, most atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if n == int32(len(addrs)) {
			once.Do(func() { close(all) })
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-all: // every dial is under way at once: now cut them short
		case <-time.After(30 * time.Second):
		}
		cancel()
	}()
	got := coord.ProbeServers(ctx, addrs, time.Minute, dial)
	if most.Load() != int32(len(addrs)) {
		t.Fatalf("at most %d probes at once, want %d", most.Load(), len(addrs))
	}
	for i, p := range got {
		if p.Addr != addrs[i] || p.State != coord.ServerUnknown || !strings.Contains(p.Detail, "cancelled") {
			t.Fatalf("probe %d = %s, want %s unknown (cancelled)", i, p, addrs[i])
		}
	}
	if v := coord.Judge(got); v != coord.StoreUp {
		t.Fatalf("cancelled probes judged %s, want up (nothing learnt)", v)
	}
}

func TestProbeStore(t *testing.T) {
	t.Parallel()
	serving := fakeServer(t, answer("Mode: follower\n"))
	refused := closedPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := coord.ProbeStore(ctx, "zk://user:pw@"+serving+","+refused+"/chroot", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Addr != serving || got[0].State != coord.ServerServing ||
		got[1].Addr != refused || got[1].State != coord.ServerRefused {
		t.Fatalf("ProbeStore = %v", got)
	}
	for _, bad := range []string{"mem://x", "file:///tmp/x.json", "zk://", "nope"} {
		if _, err := coord.ProbeStore(ctx, bad, time.Second, nil); !errors.Is(err, coord.ErrInvalid) {
			t.Errorf("ProbeStore(%q): %v, want ErrInvalid", bad, err)
		}
	}
}

// ProbeServers against a real ensemble: serving servers, a paused one (hung), a killed one
// (refused) and the survivor of two lost servers (not serving), and the verdicts they make.
func TestProbeServersEnsemble(t *testing.T) {
	ens := zktest.StartEnsemble(t, 3, zktest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv := ens.Servers()
	addrs := strings.Split(ens.Addrs(), ",")
	const timeout = 500 * time.Millisecond
	probe := func() []coord.ServerProbe {
		p, err := coord.ProbeStore(ctx, ens.URL("/probe"), timeout, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// waitFor probes until check accepts the probes (servers change state on their own
	// time: a survivor notices the lost quorum after its peers' sockets close).
	waitFor := func(what string, check func(p []coord.ServerProbe) bool) []coord.ServerProbe {
		t.Helper()
		for {
			p := probe()
			if check(p) {
				t.Logf("%s: %v -> %s", what, p, coord.Judge(p))
				return p
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: never; last probes %v", what, p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	states := func(p []coord.ServerProbe) []coord.ServerState {
		var s []coord.ServerState
		for _, x := range p {
			s = append(s, x.State)
		}
		return s
	}
	eq := func(want ...coord.ServerState) func(p []coord.ServerProbe) bool {
		return func(p []coord.ServerProbe) bool { return fmt.Sprint(states(p)) == fmt.Sprint(want) }
	}

	p := waitFor("whole ensemble", eq(coord.ServerServing, coord.ServerServing, coord.ServerServing))
	modes := map[string]int{}
	for i, x := range p {
		if x.Addr != addrs[i] {
			t.Fatalf("probe %d is of %s, want %s", i, x.Addr, addrs[i])
		}
		modes[x.Detail]++
	}
	if modes["leader"] != 1 || modes["follower"] != 2 {
		t.Fatalf("modes %v, want one leader and two followers", modes)
	}
	if v := coord.Judge(p); v != coord.StoreUp {
		t.Fatalf("whole ensemble judged %s", v)
	}

	// Server 3 stopped (SIGSTOP): the kernel still completes the handshake, nothing answers.
	srv[2].Pause()
	t.Cleanup(srv[2].Resume)
	p = waitFor("server 3 paused", eq(coord.ServerServing, coord.ServerServing, coord.ServerHung))
	if p[2].Took < timeout*9/10 {
		t.Fatalf("hung after %s, before the %s timeout", p[2].Took, timeout)
	}
	// Two still serve; had the paused one led, the others answer "follower" until they
	// notice (syncLimit ticks) and elect another leader: leaderless until then.
	want := coord.StoreUp
	if p[0].Detail == "follower" && p[1].Detail == "follower" {
		want = coord.StoreLeaderless
	}
	if v := coord.Judge(p); v != want {
		t.Fatalf("one paused server (%v): judged %s, want %s", p, v, want)
	}

	// Server 1 killed too: server 2 alone has no quorum and says so.
	srv[0].Kill()
	p = waitFor("server 1 killed, 3 paused", eq(coord.ServerRefused, coord.ServerNotServing, coord.ServerHung))
	if v := coord.Judge(p); v != coord.StoreDown {
		t.Fatalf("no quorum: judged %s, want down", v)
	}

	// Both back: the ensemble serves again and the verdict follows.
	srv[2].Resume()
	srv[0].Restart()
	if err := ens.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("servers back", func(p []coord.ServerProbe) bool { return coord.Judge(p) == coord.StoreUp })
}
