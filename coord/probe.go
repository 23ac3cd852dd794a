package coord

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A client that cannot reach ZooKeeper cannot tell from its own session whether the store is
// down for everyone (no quorum: no server can expire any session, nobody can re-place this
// node's workers) or whether it is cut off from a store that goes on serving others (its
// session may be expiring and its workers re-placed elsewhere). ProbeServers asks every
// server directly, outside the session, and Judge sums the answers up. The probe costs one
// TCP connection and one four-letter word per server: ZooKeeper answers srvr without a
// session and without touching the quorum.

// ServerState is what one store server answered to a probe.
type ServerState int

const (
	// ServerServing answers and serves clients (srvr shows a Mode line).
	ServerServing ServerState = iota + 1
	// ServerNotServing answers but is not serving: it has no quorum ("This ZooKeeper
	// instance is not currently serving requests"), or it serves reads only (Mode:
	// read-only), which a server does only when it cannot reach a quorum.
	ServerNotServing
	// ServerRefused: the connection was refused, no server process listens. A firewall
	// that rejects (iptables REJECT, either with a TCP reset or the default ICMP port
	// unreachable) instead of dropping looks the same: where such rules may cut a node
	// off, Refused is no proof of a dead server.
	ServerRefused
	// ServerHung: the TCP connection opened but nothing answered in time: the process is
	// stopped or wedged (the kernel completes handshakes for a stopped process). A TCP
	// proxy in front of the servers would also look like this.
	ServerHung
	// ServerSilent: no TCP answer at all (timeout, no route, unreachable): a partition of
	// ours, or a dead host.
	ServerSilent
	// ServerUnknown answered something else (srvr not in 4lw.commands.whitelist, a closed
	// connection), or the probe was cut short by its context: nothing was learnt, so it
	// counts as serving.
	ServerUnknown
)

func (s ServerState) String() string {
	switch s {
	case ServerServing:
		return "serving"
	case ServerNotServing:
		return "not-serving"
	case ServerRefused:
		return "refused"
	case ServerHung:
		return "hung"
	case ServerSilent:
		return "silent"
	case ServerUnknown:
		return "unknown"
	}
	return "ServerState(" + strconv.Itoa(int(s)) + ")"
}

// ServerProbe is the outcome of probing one server.
type ServerProbe struct {
	Addr   string        // the server's host:port
	State  ServerState   // what it answered
	Detail string        // its mode, its answer or the error, for logs
	Took   time.Duration // from dialling to the verdict
}

func (p ServerProbe) String() string {
	return fmt.Sprintf("%s %s (%s, %s)", p.Addr, p.State, p.Detail, p.Took.Round(time.Millisecond))
}

// DefaultProbeTimeout is ProbeServers' per-server bound when it is given none.
const DefaultProbeTimeout = 2 * time.Second

// ProbeServers asks every server of a zk:// store at once with the four-letter word srvr,
// each within timeout (DefaultProbeTimeout if <= 0), and returns one probe per address in
// the order given. dial opens the connections (nil: a net.Dialer); it must honour its
// context, or a server that never answers holds ProbeServers until the dial gives up.
//
// The timeout decides between Hung and serving: a server too slow to answer srvr within it
// counts as hung, so it must be much longer than a loaded server's answer (milliseconds) and
// short enough to decide before the session would expire.
func ProbeServers(ctx context.Context, addrs []string, timeout time.Duration,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) []ServerProbe {
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	out := make([]ServerProbe, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			state, detail := probeServer(ctx, pctx, addr, dial)
			out[i] = ServerProbe{Addr: addr, State: state, Detail: detail, Took: time.Since(start)}
		}()
	}
	wg.Wait()
	return out
}

// ProbeStore probes the servers of the zk:// store URL rawURL (see ProbeServers).
func ProbeStore(ctx context.Context, rawURL string, timeout time.Duration,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) ([]ServerProbe, error) {
	t, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if t.Scheme != "zk" {
		return nil, fmt.Errorf("coord: probe %s: %w: only ZooKeeper stores have servers to probe", t, ErrInvalid)
	}
	return ProbeServers(ctx, t.Servers, timeout, dial), nil
}

// probeServer asks one server; ctx is the caller's, pctx the same bounded by the timeout.
func probeServer(ctx, pctx context.Context, addr string,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) (ServerState, string) {
	c, err := dial(pctx, "tcp", addr)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return ServerUnknown, "probe cancelled: " + err.Error()
		case errors.Is(err, syscall.ECONNREFUSED):
			return ServerRefused, err.Error()
		default: // timeout, no route, host or network unreachable, a local firewall
			return ServerSilent, err.Error()
		}
	}
	defer c.Close()
	// The deadline bounds the exchange on real connections; closing on pctx's end also
	// covers connections that ignore deadlines, and the caller's ctx ending early.
	if dl, ok := pctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(pctx, func() { c.Close() })
	defer stop()
	if _, err := c.Write([]byte("srvr")); err != nil {
		if ctx.Err() != nil {
			return ServerUnknown, "probe cancelled: " + err.Error()
		}
		if pctx.Err() != nil || isTimeout(err) {
			return ServerHung, "connected, could not send srvr in time"
		}
		return ServerUnknown, "connection closed before srvr was sent: " + err.Error()
	}
	answer, err := io.ReadAll(io.LimitReader(c, 64<<10))
	if len(answer) > 0 {
		// ZooKeeper writes its whole answer and closes: whatever arrived decides.
		return classifySrvr(string(answer))
	}
	switch {
	case ctx.Err() != nil:
		return ServerUnknown, "probe cancelled"
	case pctx.Err() != nil || isTimeout(err):
		return ServerHung, "connected, no answer to srvr in time"
	case err == nil:
		return ServerUnknown, "connection closed without an answer"
	default:
		return ServerUnknown, "no answer: " + err.Error()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// classifySrvr reads a server's answer to srvr.
func classifySrvr(answer string) (ServerState, string) {
	for _, line := range strings.Split(answer, "\n") {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			mode = strings.TrimSpace(mode)
			if mode == "read-only" {
				return ServerNotServing, mode
			}
			return ServerServing, mode
		}
	}
	first, _, _ := strings.Cut(strings.TrimSpace(answer), "\n")
	if len(first) > 120 {
		first = first[:120] + "..."
	}
	if strings.Contains(answer, "not currently serving requests") {
		return ServerNotServing, first
	}
	return ServerUnknown, "unexpected answer: " + strconv.Quote(first)
}

// StoreVerdict sums the probes of a store's servers up.
type StoreVerdict int

const (
	// StoreUp: some server serves (or answered something unknown): the store may be
	// expiring our session.
	StoreUp StoreVerdict = iota + 1
	// StoreDown: a majority of servers refused, are not serving or hung: no quorum exists,
	// nobody's session can expire.
	StoreDown
	// StoreSilent: neither: some servers could not be reached at all, a partition of ours
	// or dead hosts; ambiguous.
	StoreSilent
	// StoreLeaderless: the servers that answer all say they follow, and the others cannot
	// be reached, hung or refuse connections: the leader is among those, and (unless this node alone is cut off
	// from it) the followers will find it gone within ZooKeeper's syncLimit and elect
	// another. A new leader starts every session's timeout afresh, so no session expires
	// across the election.
	StoreLeaderless
)

func (v StoreVerdict) String() string {
	switch v {
	case StoreUp:
		return "up"
	case StoreDown:
		return "down"
	case StoreSilent:
		return "silent"
	case StoreLeaderless:
		return "leaderless"
	}
	return "StoreVerdict(" + strconv.Itoa(int(v)) + ")"
}

// Judge sums the probes of every server of one store up.
//
// Any server that serves, or whose answer is not understood, makes the store Up: a quorum
// may exist, so the caller must assume its session can expire. A strict majority of servers
// seen refusing, not serving or hung makes it Down: the rest are too few to form a quorum
// wherever they are, so no leader exists to expire a session. For an even number of servers
// half down already leaves no quorum, but Judge still wants a strict majority: a wrong Down
// (workers kept running while the store re-places them) costs more than a wrong Silent.
// Everything else is Silent. No probes at all are Silent too.
//
// One case of Up is told apart: when every server that serves answers "Mode: follower"
// and the rest are silent, hung or refuse connections, the store is Leaderless (a leader's host lost: its
// followers go on answering as followers for up to syncLimit ticks, serving nobody's writes
// and expiring nobody's session).
//
// The verdict is only as good as the server list: it must name every voting member of the
// ensemble. A connect string listing some of them would let Judge call Down a store whose
// unlisted members still have a quorum.
func Judge(probes []ServerProbe) StoreVerdict {
	down, followers, lost := 0, 0, 0
	up := false
	for _, p := range probes {
		switch p.State {
		case ServerNotServing:
			down++
		case ServerRefused, ServerHung:
			down++
			lost++
		case ServerSilent:
			lost++
		case ServerServing:
			up = true
			if p.Detail == "follower" {
				followers++
			}
		default: // unknown, or a state Judge does not know: it may serve
			up = true
		}
	}
	switch {
	case up && followers > 0 && lost > 0 && followers+lost == len(probes):
		return StoreLeaderless
	case up:
		return StoreUp
	case 2*down > len(probes):
		return StoreDown
	}
	return StoreSilent
}
