package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/atomicfile"
)

// The keeper holds a node's liveness: the node's session-bound entry in the store and the
// stamp every worker's lease is renewed from. It outlives the agent (as containerd's shims
// and Nomad's executors outlive theirs), so that an agent restarted within the restart grace
// finds its workers running and the master never saw the node go; and it fences the node's
// workers only on evidence that someone else may now run them:
//
//   - the store's leader answers: the lease stamp is the send time of the last sync-then-read
//     the store answered (coord.Syncer), so a worker stops when the leader would expire the
//     session, and no later. A plain read is no such proof: a follower cut off from its
//     leader answers reads from its own copy for up to syncLimit ticks, while the leader
//     expires the sessions of the clients it no longer hears of;
//   - a majority of the store's servers refuse connections, answer that they are not
//     serving, or hang: no quorum exists, nobody can expire a session or move a worker, so
//     the stamp keeps up with the clock and workers run on;
//   - no server answers at all (a partition of this node, or dead hosts: it cannot tell):
//     the stamp is held back by StoreSilence, by default the session timeout, so that no
//     worker runs twice for longer than that;
//   - the agent has been gone for longer than the restart grace (the machine lives, the
//     agent does not come back): the keeper retires: it lets the leases lapse, waits for the
//     lease launchers to stop the workers, then removes the node's entry so the master
//     places them elsewhere;
//   - the keeper cannot record its status (keeper.json: a full disk): the agent would act on
//     a status that is no longer true (a session that is gone), so the stamp is held until
//     the status is recorded again, and the workers stop when their leases lapse.
//
// Suspicion ages out: the keeper judges the store from probes only while its requests fail,
// and what it concluded then (a server seen hung, when a leaderless store was first seen, the
// last time the store was down for everyone) holds for that fault alone: every answer that
// went through the store's leader ends it, so that the next fault, weeks later, is judged
// afresh.
//
// Every time the keeper keeps is on the machine's boot clock (package leasefile): the lease
// stamps it writes, the starts of its verdicts, the agent's last sign of life. A step of the
// wall clock changes none of them; a machine resumed from suspend finds them as old as they
// are.
//
// The agent and its keeper share files in the agent's state directory: the agent writes
// node.json (the node record) and touches agent.alive every heartbeat; the keeper writes
// keeper.json (KeeperStatus) and renews leases/.node, to which every worker's lease file is
// a hard link, so that one renewal renews them all.

// Files of the agent-keeper protocol, in the agent's state directory.
const (
	keeperLockFile   = "keeper.lock"
	keeperStatusFile = "keeper.json"
	nodeRecordFile   = "node.json"
	agentAliveFile   = "agent.alive"
	nodeLeaseName    = ".node"
)

// Keeper states, as KeeperStatus.State.
const (
	KeeperStarting     = "starting"     // no session yet
	KeeperLive         = "live"         // the store answers: leases follow the session
	KeeperDisconnected = "disconnected" // the store serves others but not us: leases lapse with the session
	KeeperStoreDown    = "store-down"   // no quorum anywhere: leases are kept
	KeeperSilent       = "silent"       // no server answers: leases are kept for StoreSilence
	KeeperRejoining    = "rejoining"    // back from a store outage, the session not yet: leases kept for RejoinGrace
	KeeperLeaderless   = "leaderless"   // the ensemble's leader lost, an election due: leases kept for twice the session timeout
	KeeperRetiring     = "retiring"     // the agent is gone for good: leases lapse, the node goes
)

// KeeperStatus is what the keeper tells its agent through keeper.json.
type KeeperStatus struct {
	PID            int              `json:"pid"`
	Node           string           `json:"node"`
	Store          string           `json:"store"`
	SessionTimeout cluster.Duration `json:"sessionTimeout"`
	// Granted is the session timeout the store granted the keeper's session, 0 when
	// unknown; the keeper's leases last no longer.
	Granted cluster.Duration `json:"granted,omitempty"`
	// Session is the store session owning the node's entry: the master stamps the node's
	// assignment with it, and the agent acts on an assignment only when they match.
	Session int64     `json:"session"`
	State   string    `json:"state"`
	Since   time.Time `json:"since"`
	Detail  string    `json:"detail,omitempty"`
	// Stamp is the lease stamp in wall-clock time, for people: leases run out at Stamp + the
	// ttl. What counts is StampBoot.
	Stamp time.Time `json:"stamp"`
	// StampBoot is the lease stamp on the boot clock (leasefile.Now, nanoseconds), Boot the
	// boot it belongs to and Gen the lease's generation: the lease file's record.
	StampBoot time.Duration `json:"stampBoot,omitempty"`
	Boot      string        `json:"boot,omitempty"`
	Gen       uint64        `json:"gen,omitempty"`
	// Writes counts the keeper's writes of the node's entry.
	Writes int64 `json:"writes"`
	// Lapsed is the last time the keeper knows the leases were lapsed: it renewed them
	// (or found them still) past Stamp + ttl. The agent trusts a worker's "lease lapsed"
	// exit (launcher.ExitLeaseLapsed) only near such a time: a worker cannot write here.
	// LapsedFrom is when that lapse began: the stamp it ran out from, plus the ttl.
	// LapsedBoot and LapsedFromBoot are the same on the boot clock, and count where given
	// (a keeper older than them writes only the wall-clock times).
	Lapsed         time.Time     `json:"lapsed,omitzero"`
	LapsedFrom     time.Time     `json:"lapsedFrom,omitzero"`
	LapsedBoot     time.Duration `json:"lapsedBoot,omitempty"`
	LapsedFromBoot time.Duration `json:"lapsedFromBoot,omitempty"`
}

// canRun reports whether workers may be started in this state at now (on the boot clock):
// not once their leases are lapsing.
func (s KeeperStatus) canRun(now time.Duration) bool {
	switch s.State {
	case KeeperLive, KeeperStoreDown, KeeperRejoining, KeeperLeaderless:
		return s.Session != 0
	case KeeperSilent:
		// A silent keeper holds the stamp at the last answer: past it the leases have lapsed
		// while the state stays silent, the master may run the workers elsewhere, and a worker
		// restarted here would run twice until its launcher stops it (seen across hosts: a
		// crashed worker's backoff ending during a partition).
		if s.StampBoot == 0 { // a keeper older than boot stamps
			return s.Session != 0 && time.Since(s.Stamp) < s.ttl()
		}
		return s.Session != 0 && now-s.StampBoot < s.ttl() && (s.Boot == "" || s.Boot == leasefile.BootID())
	}
	return false
}

// ttl is how long the leases last past Stamp: the session timeout, or the granted one when
// the store granted less.
func (s KeeperStatus) ttl() time.Duration {
	if g := s.Granted.Std(); g > 0 && g < s.SessionTimeout.Std() {
		return g
	}
	return s.SessionTimeout.Std()
}

// DefaultRejoinGrace is KeeperConfig.RejoinGrace's default: half the masters' default
// re-registration window (scheduler.DefaultReregisterGrace).
const DefaultRejoinGrace = 5 * time.Second

// KeeperConfig configures a Keeper.
type KeeperConfig struct {
	// Node is the node's id; Host tells this host's earlier entries from another agent's.
	Node string
	Host string
	// StateDir is the agent's state directory.
	StateDir string
	// Store is the store's URL (its servers are probed when it stops answering).
	Store string
	// SessionTimeout is the store session timeout and the leases' ttl.
	SessionTimeout time.Duration
	// RestartGrace is how long the node outlives its agent. 0: the keeper lives and dies
	// with the agent's process (it runs inside it).
	RestartGrace time.Duration
	// StoreSilence is how long workers keep running while no store server answers at all.
	// Default SessionTimeout.
	StoreSilence time.Duration
	// RejoinGrace is how long, once the store is back from an outage it had for everyone,
	// workers keep running while the node has not got its session back, counted from the
	// outage's last verdict (and never less than twice the session timeout, the outage's own
	// hold). It must not exceed the masters' --reregister-grace. Default DefaultRejoinGrace.
	RejoinGrace time.Duration
	// StoreTLS names a zks:// store's TLS files: the probes speak TLS too.
	StoreTLS coord.TLSFiles
	// Dial reaches the store's servers for probes; nil uses net.Dialer.
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Logger *slog.Logger
	// Clock is the boot clock every time the keeper keeps is on; nil: leasefile.Now.
	Clock leasefile.Clock

	// probe asks the store's servers; nil: coord.ProbeServers. Tests script it.
	probe func(ctx context.Context, addrs []string, timeout time.Duration,
		dial func(ctx context.Context, network, addr string) (net.Conn, error)) []coord.ServerProbe
}

func (c *KeeperConfig) defaults() error {
	if c.Node == "" || c.StateDir == "" {
		return errors.New("keeper: a node id and a state directory are required")
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = coord.DefaultSessionTimeout
	}
	if c.StoreSilence < c.SessionTimeout {
		c.StoreSilence = c.SessionTimeout
	}
	if c.RejoinGrace <= 0 {
		c.RejoinGrace = DefaultRejoinGrace
	}
	if c.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("keeper: host name: %w", err)
		}
		c.Host = h
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = leasefile.Now
	}
	if c.probe == nil {
		c.probe = coord.ProbeServers
	}
	return nil
}

// renewInterval is how often the keeper asks the store and renews the stamp: a lease must
// never lapse for a late tick while the store answers.
func (c *KeeperConfig) renewInterval() time.Duration { return c.SessionTimeout / 5 }

// Keeper holds one node's liveness. Create it with NewKeeper, run it with Run.
type Keeper struct {
	cfg   KeeperConfig
	store coord.Store
	log   *slog.Logger
	addrs []string // the store's servers, for probes (none for an embedded store)
	key   string   // the node's entry

	notify   chan struct{}
	retireCh chan struct{} // closed by Retire
	clock    leasefile.Clock
	lease    *leasefile.Writer // the node lease, open while Run runs

	// Suspicion, the Run loop's alone; every answer through the leader clears it (forgive).
	lastProbe map[string]coord.ServerState // each server's last probe
	lastDown  time.Duration                // the last probe that found the store down (boot clock), if downSeen
	downSeen  bool
	// leaderless is when probes first found the store leaderless since the last answer
	// (boot clock), if leaderlessSeen.
	leaderless     time.Duration
	leaderlessSeen bool
	redialed       time.Duration // the last coord.Redial (boot clock)

	// removeTries counts failed removals of the node's entry while retiring, the Run loop's.
	removeTries int

	mu      sync.Mutex
	status  KeeperStatus
	retired sync.Once
	fileMu  sync.Mutex // serializes writes of keeper.json
	// stale: the last write of keeper.json failed, so the agent may be acting on a status
	// that is no longer true; leases are not renewed until a write succeeds (under mu).
	stale bool
}

// NewKeeper returns a keeper for the node, holding its entry in store (whose session timeout
// must be cfg.SessionTimeout). The caller closes store after Run returned.
func NewKeeper(cfg KeeperConfig, store coord.Store) (*Keeper, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	key, err := cluster.NodeKey(cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	k := &Keeper{cfg: cfg, store: store, key: key, log: cfg.Logger.With("node", cfg.Node, "component", "keeper"),
		notify: make(chan struct{}, 1), retireCh: make(chan struct{}), clock: cfg.Clock}
	storeName := ""
	if t, err := coord.ParseURL(cfg.Store); err == nil {
		k.addrs, storeName = t.Servers, t.String()
		if t.TLS {
			if k.cfg.Dial, err = cfg.StoreTLS.ProbeDialer(cfg.Dial); err != nil {
				return nil, fmt.Errorf("keeper: store %s: %w", t, err)
			}
		}
	}
	k.status = KeeperStatus{PID: os.Getpid(), Node: cfg.Node, Store: storeName,
		SessionTimeout: cluster.Duration(cfg.SessionTimeout), State: KeeperStarting, Since: time.Now()}
	// The session lasts what the store granted, which may be less than asked (ZooKeeper's
	// maxSessionTimeout): the leases, which stand for the session, last no longer. The
	// status keeps the timeout asked for, which names the keeper's settings (startKeeper).
	if g := coord.GrantedSessionTimeout(store); g > 0 {
		k.status.Granted = cluster.Duration(g)
		if g < k.cfg.SessionTimeout {
			k.log.Warn("the store granted a shorter session than asked: leases last the granted timeout",
				"asked", k.cfg.SessionTimeout, "granted", g)
			k.cfg.SessionTimeout = g
		}
	}
	return k, nil
}

// Status is the keeper's state now.
func (k *Keeper) Status() KeeperStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.status
}

// Notify tells the keeper that node.json changed.
func (k *Keeper) Notify() {
	select {
	case k.notify <- struct{}{}:
	default:
	}
}

// Retire makes the keeper retire the node now, as when the agent stays away for longer than
// the restart grace: the workers stop, then the node's entry goes and the master moves them.
// A keeper process does this on SIGTERM (a machine shutting down, a node decommissioned).
func (k *Keeper) Retire() { k.retired.Do(func() { close(k.retireCh) }) }

// ErrKeeperRunning: another keeper holds the node's state directory.
var ErrKeeperRunning = errors.New("a keeper already runs for this state directory")

// Run holds the node's entry and renews the lease stamp until ctx is done or the keeper
// retires (the agent gone for longer than RestartGrace). On ctx done it leaves the entry to
// its session and the leases to their stamp: a keeper inside an agent's process stops with
// it, and its node is then lost like a dead machine.
func (k *Keeper) Run(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(k.cfg.StateDir, "leases"), 0o750); err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	unlock, err := flockFile(filepath.Join(k.cfg.StateDir, keeperLockFile), unix.LOCK_EX)
	if err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("%w: %s", ErrKeeperRunning, k.cfg.StateDir)
		}
		return fmt.Errorf("keeper: %w", err)
	}
	defer unlock()
	lp, err := ensureNodeLease(k.cfg.StateDir)
	if err != nil {
		return err
	}
	if k.lease, err = leasefile.OpenWriter(lp); err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	defer k.lease.Close()
	k.loadLease(lp)
	w := &recordWriter{k: k, nw: &nodeWriter{store: k.store, key: k.key, host: k.cfg.Host, log: k.log, version: -1},
		wake: make(chan struct{}, 1)}
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		w.run(wctx)
	}()
	defer func() {
		stopWriter()
		<-writerDone
	}()
	sessions := k.store.SessionEvents(ctx)
	tick := time.NewTicker(k.cfg.renewInterval())
	defer tick.Stop()
	// Times on the boot clock; 0 is none (the clock is past 0 once anything runs).
	var (
		lastOK     time.Duration // send time of the last sync-then-read the store answered
		agentSeen  = k.clock()   // when the agent last touched agent.alive, as the keeper saw it
		aliveMod   = agentAliveMod(k.cfg.StateDir)
		retireFrom time.Duration
	)
	w.push(true)
	k.renew(ctx, &lastOK, false)
	retireCh := k.retireCh
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sessions:
			if !ok {
				return nil
			}
			k.log.Info("store session", "event", ev.Type.String(), "session", ev.SessionID)
			if ev.Type == coord.SessionNew {
				// The store client re-created the entry with the record this keeper last
				// wrote, under the new session: the master stamps the node's assignment anew.
				w.push(true)
			}
		case <-k.notify:
			w.push(false)
		case <-retireCh:
			if retireFrom == 0 {
				k.log.Warn("asked to retire the node")
				retireFrom = k.clock()
			}
			retireCh = nil
		case <-tick.C:
			if k.cfg.RestartGrace > 0 {
				// The agent's sign of life is a change of agent.alive's modification time,
				// timed on the keeper's own clock: the time the agent wrote there is of the
				// wall clock, which may step.
				now := k.clock()
				if mod := agentAliveMod(k.cfg.StateDir); !mod.Equal(aliveMod) {
					aliveMod, agentSeen = mod, now
				}
				away := now-agentSeen > 3*k.cfg.renewInterval()+time.Second
				if w.setAway(away, leasefile.Wall(agentSeen, k.clock)) {
					if away {
						k.log.Warn("agent not running: its workers keep running for the restart grace", "grace", k.cfg.RestartGrace,
							"last_seen", leasefile.Wall(agentSeen, k.clock))
					} else {
						k.log.Info("agent back")
					}
					w.push(false)
				}
				if now-agentSeen > k.cfg.RestartGrace && retireFrom == 0 {
					retireFrom = now
					k.log.Warn("agent gone for longer than the restart grace: retiring the node", "grace", k.cfg.RestartGrace)
				}
			}
			if retireFrom != 0 {
				// No record is written any more: one written after the entry's removal
				// would bring the node back.
				stopWriter()
				<-writerDone
				if k.retire(ctx, lp, w.nw, retireFrom) {
					return nil
				}
				continue
			}
			k.renew(ctx, &lastOK, true)
		}
	}
}

// recordWriter writes node.json into the node's entry from a goroutine of its own, so that a
// store that does not answer never holds up the lease renewals. Only the latest record is
// written.
type recordWriter struct {
	k    *Keeper
	nw   *nodeWriter // the writer goroutine's alone
	wake chan struct{}

	mu        sync.Mutex
	force     bool // write even if unchanged: the entry was re-created
	away      bool // the agent is not running: say so in the record
	awaySince time.Time
}

// push asks for the current node.json to be written (always, with force).
func (w *recordWriter) push(force bool) {
	w.mu.Lock()
	w.force = w.force || force
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// setAway records whether the agent runs and reports whether that changed.
func (w *recordWriter) setAway(away bool, since time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := w.away != away
	w.away, w.awaySince = away, since
	return changed
}

func (w *recordWriter) run(ctx context.Context) {
	k := w.k
	var last []byte
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-retry.C:
		}
		rec, err := os.ReadFile(filepath.Join(k.cfg.StateDir, nodeRecordFile))
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				k.log.Warn("read node record", "err", err)
			}
			continue
		}
		w.mu.Lock()
		force, away, since := w.force, w.away, w.awaySince
		w.force = false
		w.mu.Unlock()
		if away {
			rec = markAgentAway(rec, since, k.cfg.RestartGrace)
		}
		if force {
			w.nw.version = -1
		} else if string(rec) == string(last) && w.nw.version >= 0 {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, k.cfg.SessionTimeout)
		err = w.nw.write(wctx, rec)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, ErrNodeTaken) {
				k.log.Error("node entry held by another agent", "err", err)
			} else {
				k.log.Warn("write node record", "err", err)
			}
			w.mu.Lock()
			w.force = w.force || force
			w.mu.Unlock()
			retry.Reset(250 * time.Millisecond)
			continue
		}
		last = rec
		k.mu.Lock()
		k.status.Writes++
		k.mu.Unlock()
		k.setSession(k.store.SessionID())
	}
}

// renew asks the store and sets the lease stamp from its answer (see the package comment at
// the top of this file). probe says whether to probe the servers when the store does not
// answer.
func (k *Keeper) renew(ctx context.Context, lastOK *time.Duration, probe bool) {
	iv := k.cfg.renewInterval()
	sent := k.clock()
	pctx, cancel := context.WithTimeout(ctx, iv)
	err := k.ask(pctx)
	cancel()
	if err == nil {
		k.forgive()
		k.dropLostSession()
		*lastOK = sent
		k.setState(KeeperLive, "", sent)
		return
	}
	if ctx.Err() != nil || *lastOK == 0 {
		return
	}
	if !probe || len(k.addrs) == 0 {
		k.setState(KeeperDisconnected, err.Error(), *lastOK)
		return
	}
	// The probe's own timeout must end first: a probe cut short by its context counts as
	// serving (unknown), and a wedged server would then look alive.
	pctx, cancel = context.WithTimeout(ctx, 2*iv)
	probes := k.cfg.probe(pctx, k.addrs, iv, k.cfg.Dial)
	cancel()
	k.stickHung(probes)
	detail := probeSummary(probes)
	verdict := coord.Judge(probes)
	now := k.clock()
	if (verdict == coord.StoreUp || verdict == coord.StoreLeaderless) && now-k.redialed > k.cfg.SessionTimeout/2 {
		// Servers serve, and the one this client talks to passed nothing to the leader in
		// time (a follower cut off from it answers pings, and the client would stay for two
		// thirds of the session): move to another while the session lasts.
		k.redialed = now
		coord.Redial(k.store)
	}
	if verdict == coord.StoreDown {
		k.lastDown, k.downSeen = now, true
	} else if k.downSeen && now-k.lastDown < k.cfg.RejoinGrace {
		// The store is back from an outage it had for everyone, and this node has not got
		// its session back yet (it may have expired as the ensemble resumed): the masters
		// wait --reregister-grace for nodes after an outage, so the workers run on while the
		// node rejoins, until RejoinGrace after the outage's last verdict at most (or twice
		// the session timeout, the stamp that verdict left): the masters move the workers of
		// a node still missing --reregister-grace after the store came back, and a hold
		// that outlasted that ran workers twice.
		stamp := min(k.aheadStamp(), k.lastDown+k.cfg.RejoinGrace-k.cfg.SessionTimeout)
		k.setState(KeeperRejoining, detail, stamp)
		return
	}
	switch verdict {
	case coord.StoreDown:
		k.setState(KeeperStoreDown, detail, k.aheadStamp())
	case coord.StoreLeaderless:
		// The leader's host is lost and its followers have not noticed yet: nobody's
		// session expires across the election that follows, so the workers run on, as
		// when the store is down. Should this node alone be cut off from a leader the
		// others still follow, its client reconnects through a follower within the
		// session, or learns that the session expired; the leases lapse LeaderlessHold
		// after the first such verdict of this fault in any case (the first since the
		// store last answered: a verdict that comes and goes within one fault does not
		// start the hold again).
		if !k.leaderlessSeen {
			k.leaderless, k.leaderlessSeen = now, true
		}
		stamp := min(k.aheadStamp(), k.leaderless+k.cfg.leaderlessHold()-k.cfg.SessionTimeout)
		k.setState(KeeperLeaderless, detail, stamp)
	case coord.StoreSilent:
		// Held back: run on for StoreSilence after the last answer, then lapse.
		stamp := min(*lastOK+k.cfg.StoreSilence-k.cfg.SessionTimeout, now)
		k.setState(KeeperSilent, detail, stamp)
	default:
		k.setState(KeeperDisconnected, detail, *lastOK)
	}
}

// ask is the keeper's question to the store: a sync, then a read of the node's entry
// (missing is an answer too). Its answer proves that the store's leader heard from this
// client since it was sent (coord.Syncer), not just some server.
func (k *Keeper) ask(ctx context.Context) error {
	if err := k.store.Sync(ctx); err != nil {
		return err
	}
	if _, err := k.store.Get(ctx, k.key); err != nil && !errors.Is(err, coord.ErrNotFound) {
		return err
	}
	return nil
}

// forgive ends the suspicion of the last fault: the store's leader answered. A server seen
// hung is no longer presumed so, and the next fault's verdicts (leaderless, down) have starts
// of their own.
func (k *Keeper) forgive() {
	clear(k.lastProbe)
	k.downSeen, k.leaderlessSeen = false, false
}

// aheadStamp is the stamp while nobody can move the node's workers (the store is down for
// everyone, or back from that and the masters wait for nodes to re-register): a session
// timeout ahead of now, so that a keeper starved of cpu for a moment (everything resumes at
// once after an outage) does not let the leases lapse. At most twice the session timeout
// from its last renewal, which stays below the masters' re-registration window.
func (k *Keeper) aheadStamp() time.Duration { return k.clock() + k.cfg.SessionTimeout }

// stickHung keeps a server that was seen hung (it accepted a connection and never answered)
// hung while later probes time out connecting: a stopped or wedged process stops accepting,
// its accept queue fills up, and the kernel then drops new connections as a partition would.
// Any answer from it (serving, not serving, refused) ends that, and so does any answer of
// the store through its leader (forgive): being cut off from a server that was already
// wedged would take two faults at once, and a wedged server that answers again is no longer
// the fault it was.
func (k *Keeper) stickHung(probes []coord.ServerProbe) {
	if k.lastProbe == nil {
		k.lastProbe = map[string]coord.ServerState{}
	}
	for i, p := range probes {
		if p.State == coord.ServerSilent && k.lastProbe[p.Addr] == coord.ServerHung {
			probes[i].State = coord.ServerHung
			probes[i].Detail = "hung before; its accept queue is full"
			continue
		}
		k.lastProbe[p.Addr] = p.State
	}
}

// loadLease takes the node lease as a keeper before this one left it (or a new, empty one):
// its stamp holds until this keeper renews it, and whether it lapsed meanwhile decides its
// next generation.
func (k *Keeper) loadLease(path string) {
	r, err := leasefile.Stamp(path, k.clock)
	if err != nil {
		if !errors.Is(err, leasefile.ErrEmpty) {
			k.log.Warn("node lease unreadable: a new generation starts", "err", err)
		}
		return
	}
	k.mu.Lock()
	k.status.StampBoot, k.status.Boot, k.status.Gen = r.Stamp, r.Boot, r.Gen
	k.status.Stamp = leasefile.Wall(r.Stamp, k.clock)
	k.mu.Unlock()
}

// setState records the state and moves the lease stamp forward. It moves it back only to an
// answer of the store's leader (KeeperLive): a stamp held ahead of the answers while nobody
// could move the node's workers (the store down, leaderless, or back and the node
// rejoining) is void once the leader answers, for the leader expires the session a session
// timeout after that answer, not after the hold. Kept, it let a node cut off right after a
// leaderless moment run its workers up to two sessions after the leader had moved them (the
// hour-long chaos run: a router ran twice for 3.6 s). A lease renewed after it lapsed starts
// a new generation: its launchers stop their workers even if they did not look while it was
// lapsed. While the keeper's status cannot be recorded, the stamp stays where it is.
func (k *Keeper) setState(state, detail string, stamp time.Duration) {
	now := k.clock()
	boot := leasefile.BootID()
	k.mu.Lock()
	st := k.status
	if stamp < st.StampBoot && state != KeeperLive {
		stamp = st.StampBoot
	}
	changed := st.State != state
	if changed {
		st.Since = time.Now()
	}
	// The lease file held st's stamp until this write: past its ttl (or of another boot),
	// the launchers have seen it lapsed (and stopped their workers).
	had := st.StampBoot != 0
	rec := leasefile.Record{Boot: st.Boot, Gen: st.Gen, Stamp: st.StampBoot}
	lapsed := had && rec.Lapsed(now, st.ttl(), boot)
	if lapsed {
		from := st.StampBoot + st.ttl()
		if st.Boot != boot && boot != "" {
			from = 0 // all of this boot
		}
		st.LapsedBoot, st.LapsedFromBoot = now, from
		st.Lapsed, st.LapsedFrom = time.Now(), leasefile.Wall(from, k.clock)
	}
	renew := stamp != st.StampBoot || !had
	if renew {
		// A new generation when the renewal revives a lapsed lease (or makes the first).
		if (lapsed || !had) && now-stamp <= st.ttl() {
			st.Gen++
		}
		st.StampBoot, st.Boot = stamp, boot
		st.Stamp = leasefile.Wall(stamp, k.clock)
	}
	st.State, st.Detail = state, detail
	stale := k.stale
	held := k.status
	k.status = st
	k.mu.Unlock()
	if changed {
		k.log.Info("keeper state", "state", state, "detail", detail)
	}
	// The status is on record before the lease is renewed: an agent that finds the lease
	// renewed when its worker's launcher stopped it for a lapse then finds the lapse too, and
	// an agent never acts on a lease renewed for a status it cannot read. Outside the live
	// state the status is written every time (the agent reads the stamp).
	if lapsed || stale || changed || state != KeeperLive {
		if err := k.writeStatus(); err != nil {
			k.holdLease(held)
			return
		}
	}
	if renew {
		if err := k.lease.Write(leasefile.Record{Boot: st.Boot, Gen: st.Gen, Stamp: st.StampBoot}, st.Stamp); err != nil {
			k.log.Warn("renew leases", "err", err)
		}
	}
}

// holdLease puts the lease's last stamp back into the status after its renewal was refused:
// keeper.json could not be written.
func (k *Keeper) holdLease(held KeeperStatus) {
	k.mu.Lock()
	k.status.StampBoot, k.status.Boot, k.status.Gen, k.status.Stamp = held.StampBoot, held.Boot, held.Gen, held.Stamp
	k.status.Lapsed, k.status.LapsedFrom, k.status.LapsedBoot, k.status.LapsedFromBoot = held.Lapsed, held.LapsedFrom, held.LapsedBoot, held.LapsedFromBoot
	k.mu.Unlock()
}

// dropLostSession clears the status's session when the store answers in another one (a new
// session after expiry) than the node's entry was last written in: until the record writer
// has written the entry in the new session (setSession), the status names none. Otherwise
// the agent would read "live" with the lost session and act on an assignment the master
// stamped with it before moving the node's workers elsewhere: restart them, twice.
func (k *Keeper) dropLostSession() {
	sid := k.store.SessionID()
	k.mu.Lock()
	lost := sid != 0 && k.status.Session != 0 && k.status.Session != sid
	old := k.status.Session
	if lost {
		k.status.Session = 0
	}
	k.mu.Unlock()
	if lost {
		k.log.Info("node's session lost: registering in the new one", "lost", old, "session", sid)
		_ = k.writeStatus() // a failure holds the leases (setState)
	}
}

func (k *Keeper) setSession(id int64) {
	k.mu.Lock()
	changed := k.status.Session != id
	k.status.Session = id
	k.mu.Unlock()
	if changed {
		k.log.Info("node registered", "session", id)
		_ = k.writeStatus() // a failure holds the leases (setState)
	}
}

// writeStatus replaces keeper.json atomically. The Run loop and the record writer both call
// it: one at a time, so that an older status is never renamed over a newer one. A failure
// (a full disk) makes the status stale: the agent may act on what the file still says, so
// the leases are not renewed (setState) until a write succeeds again.
func (k *Keeper) writeStatus() error {
	k.fileMu.Lock()
	defer k.fileMu.Unlock()
	b, _ := json.Marshal(k.Status())
	err := atomicfile.WriteFile(filepath.Join(k.cfg.StateDir, keeperStatusFile), b, 0o600)
	k.mu.Lock()
	was := k.stale
	k.stale = err != nil
	k.mu.Unlock()
	switch {
	case err != nil && !was:
		k.log.Error("cannot record the keeper's status: leases are not renewed until it is; their workers stop when they lapse", "err", err)
	case err == nil && was:
		k.log.Info("keeper's status recorded again: leases renewed")
	}
	return err
}

// retire lets the leases lapse, waits for the lease launchers to stop the workers, then
// removes the node's entry. It reports whether it is done.
func (k *Keeper) retire(ctx context.Context, lease string, w *nodeWriter, from time.Duration) bool {
	st := k.Status()
	if st.State != KeeperRetiring {
		k.mu.Lock()
		k.status.State, k.status.Since, k.status.Detail = KeeperRetiring, time.Now(), "agent gone for longer than the restart grace"
		k.mu.Unlock()
		_ = k.writeStatus()
	}
	// Every launcher holds a shared lock on its lease (a hard link of the node lease): none
	// left means every worker has stopped. A worker that ignores SIGTERM is killed by its
	// launcher after its grace; the bound covers launchers of workers started without one.
	idle := leaseIdle(lease)
	if !idle && k.clock()-from < k.cfg.SessionTimeout+2*time.Minute {
		return false
	}
	if !idle {
		k.log.Warn("workers still hold their leases; removing the node anyway")
	}
	dctx, cancel := context.WithTimeout(ctx, k.cfg.SessionTimeout)
	defer cancel()
	if err := w.remove(dctx); err != nil && ctx.Err() == nil {
		// The entry is bound to the keeper's session: once the keeper is gone the store
		// expires it by itself. A store that does not answer (gone, paused, cut off) must
		// not keep a keeper that was told to stop running for ever: past the bound it
		// leaves the entry to its session.
		if k.removeTries++; k.removeTries < retireRemoveTries {
			k.log.Warn("remove node entry", "err", err, "try", k.removeTries)
			return false
		}
		k.log.Warn("the store does not answer: the node's entry goes when its session expires", "err", err, "tries", k.removeTries)
		_ = os.Remove(filepath.Join(k.cfg.StateDir, keeperStatusFile))
		return true
	}
	k.log.Info("node retired: its workers stopped and the master moves them")
	_ = os.Remove(filepath.Join(k.cfg.StateDir, keeperStatusFile))
	return true
}

// retireRemoveTries bounds the removals of the node's entry a retiring keeper tries (each
// bounded by the session timeout) before it leaves the entry to its session and exits.
const retireRemoveTries = 3

// markAgentAway rewrites a node record to say the agent is not running: the node takes no new
// workers while its agent is away, and operators see why.
func markAgentAway(rec []byte, since time.Time, grace time.Duration) []byte {
	var r cluster.NodeRecord
	if json.Unmarshal(rec, &r) != nil {
		return rec
	}
	r.Health = cluster.NodeHealth{State: cluster.HealthUnhealthy, Throttled: r.Node.Slots,
		Reason: fmt.Sprintf("agent not running since %s; its workers keep running until %s (restart grace)",
			since.UTC().Format(time.RFC3339), since.Add(grace).UTC().Format(time.RFC3339))}
	b, err := json.Marshal(r)
	if err != nil {
		return rec
	}
	return b
}

// agentAliveMod is agent.alive's modification time (zero if missing): the agent touches it
// every heartbeat, and the keeper notes when it changes.
func agentAliveMod(stateDir string) time.Time {
	fi, err := os.Stat(filepath.Join(stateDir, agentAliveFile))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// ensureNodeLease creates the node lease if missing, already lapsed, and returns its path.
func ensureNodeLease(stateDir string) (string, error) {
	p := filepath.Join(stateDir, "leases", nodeLeaseName)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("node lease: %w", err)
	}
	f.Close()
	return p, nil
}

// leaseIdle reports whether no lease launcher holds the node lease.
func leaseIdle(lease string) bool {
	unlock, err := flockFile(lease, unix.LOCK_EX)
	if err != nil {
		return false
	}
	unlock()
	return true
}

// flockFile takes a non-blocking flock of the given kind on path (created if missing).
func flockFile(path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// probeSummary says in one line what each server answered.
func probeSummary(probes []coord.ServerProbe) string {
	parts := make([]string, len(probes))
	for i, p := range probes {
		parts[i] = p.Addr + " " + p.State.String()
	}
	return strings.Join(parts, ", ")
}

// leaderlessHold is how long after the first leaderless verdict the leases are kept: twice
// the session timeout, or StoreSilence when that is longer. ZooKeeper's followers notice a
// lost leader within syncLimit ticks (then they stop serving, and the store is down for
// everyone); a hold past that only matters to a node cut off from the leader alone.
func (c *KeeperConfig) leaderlessHold() time.Duration {
	return max(2*c.SessionTimeout, c.StoreSilence)
}
