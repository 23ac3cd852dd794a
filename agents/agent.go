// Package agents is stormdock's node agent: it registers its node in the coordination store,
// runs the workers the master assigns to the node through isolation drivers, and reports them.
package agents

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents/scrape"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/shim"
)

// Sentinel errors callers branch on.
var (
	// ErrStateDirLocked: another agent holds the state directory. Two agents sharing one
	// would adopt, restart and stop each other's workers.
	ErrStateDirLocked = errors.New("agent state directory is in use by another agent")
	// ErrAlreadyRun: Run was called twice on one Agent.
	ErrAlreadyRun = errors.New("agent already ran")
)

// Defaults for Config.
const (
	DefaultHeartbeat       = time.Second
	DefaultPortBase        = 6700
	DefaultRestartBackoff  = time.Second
	DefaultMaxBackoff      = time.Minute
	DefaultCrashLoopWindow = 5 * time.Minute
	DefaultStableRun       = 10 * time.Second
	DefaultMetricsInterval = scrape.DefaultInterval
	// DefaultContainerSelf is where worker images built by stormdock keep the stormdock
	// binary (see package images).
	DefaultContainerSelf = "/stormdock"
	// SelfCommand is the command name the agent replaces by its own binary (or by
	// ContainerSelf inside containers), so a job can run `stormdock worker ...` on nodes
	// where stormdock is not on PATH.
	SelfCommand = "stormdock"
)

// Health is the node's health as the health checks see it. State says how many slots are
// withheld; Changed receives a value whenever State may have changed.
type Health interface {
	State() cluster.NodeHealth
	Changed() <-chan struct{}
}

// Driver pairs an isolation mode (cluster.IsolationProcess, cluster.IsolationDocker) with the
// driver that provides it.
type Driver struct {
	Isolation string
	Driver    isolation.Driver
}

// Config configures an Agent. Node.ID, Node.DC, Node.Rack, Node.Slots and StateDir are
// required.
type Config struct {
	// Node is the node as registered. Labels isolation/<mode>=true are added for every
	// driver the agent is given.
	Node cluster.Node
	// StateDir holds the agent's per-worker records and lease files, and its lock.
	StateDir string
	// SessionTimeout is the store session timeout of the node's keeper, and the default
	// lease ttl. Default coord.DefaultSessionTimeout.
	SessionTimeout time.Duration
	// StoreURL is the store's URL: the keeper probes its servers when it stops answering, and
	// a keeper process opens it.
	StoreURL string
	// StoreCredentialsFile holds user:pass for the store, for a keeper process.
	StoreCredentialsFile string
	// StoreTLS names the store's TLS files (zks://), for a keeper process and output
	// routers: they run as the agent's user and read them as it does.
	StoreTLS coord.TLSFiles
	// RestartGrace is how long the node's workers outlive the agent's process: the keeper
	// then runs as a process of its own (`stormdock keeper`), started by the agent, and the
	// node stays registered while the agent restarts. 0 runs the keeper inside the agent:
	// the node is lost with the agent's process.
	RestartGrace time.Duration
	// StoreSilence is how long workers keep running while no store server answers at all
	// (see Keeper). Default SessionTimeout.
	StoreSilence time.Duration
	// RejoinGrace is how long, once the store is back from an outage it had for everyone,
	// workers keep running while the node has not got its session back (see Keeper). It,
	// and twice the session timeout, must not exceed the masters' --reregister-grace.
	// Default DefaultRejoinGrace.
	RejoinGrace time.Duration
	// Heartbeat bounds how long a change of the node record waits for a burst of starts to
	// end (see flush), and paces the memory samples (every sampleEvery beats). Default 1s.
	Heartbeat time.Duration
	// PortBase is the first STORMDOCK_PORT; a worker gets PortBase + its slot index.
	PortBase int
	// Self is the stormdock binary: it replaces a command named "stormdock" and runs the
	// keeper. Default os.Executable().
	Self string
	// Launcher is the binary that runs the lease launcher (`BIN launch ...`) of process
	// workers. Default: stormdock-shim beside Self, whose start costs a fraction of the
	// whole binary's, else Self. The process driver's shim should be the same binary, so
	// that it runs the launcher in place (see daemon.Launchers).
	Launcher string
	// ContainerSelf is the stormdock binary's path inside worker images. Default /stormdock.
	ContainerSelf string
	// LeaseTTL is how long a worker outlives its agent's last lease renewal. Default
	// SessionTimeout. Either way the lease ttl is at most the session timeout the store
	// granted (ZooKeeper caps sessions at its maxSessionTimeout): see leaseTTL.
	LeaseTTL time.Duration
	// NoLease runs workers without the lease launcher: they then outlive a dead agent.
	NoLease bool
	// RunAs, when set, is who every tenant's process workers run as (with no new
	// privileges), instead of each tenant's own uid: a single-tenant node's opt-out, whose
	// tenants are not apart. Never root. Output routers keep their tenant's router uid where
	// the agent can switch users. Docker workers always run as their tenant's uid.
	RunAs *isolation.User
	// SinkDir is where mirrored jobs' file sinks live, as SinkDir/<tenant>/... (--sink-dir):
	// the agent makes SinkDir/<tenant> (0750, owned by the router's user) before it starts a
	// router and names SinkDir in the router's environment (STORMDOCK_SINK_DIR). "" leaves
	// routers without one: they refuse file sinks.
	SinkDir string
	// RestartBackoff is the first delay before restarting a crashed worker; it doubles with
	// every restart within CrashLoopWindow that came within StableRun of the worker's start,
	// up to MaxBackoff. A crash after a run of StableRun or longer restarts after
	// RestartBackoff again (it still counts towards the crash loop the masters judge): a
	// worker killed now and then is restarted at once, one that dies as it starts waits.
	RestartBackoff  time.Duration
	MaxBackoff      time.Duration
	CrashLoopWindow time.Duration
	StableRun       time.Duration
	// Health reports throttling; nil means always healthy.
	Health Health
	// Images pulls docker workers' images the node lacks, and the assignment's pre-pull
	// list; nil means images must be on the node already.
	Images Images
	// LateIsolation lists the isolation modes the node is meant to offer whose engine did
	// not answer when the agent started: the node offers them once AddDriver brings them,
	// and keeps their workers' records meanwhile.
	LateIsolation []string
	// Logs is where the agent serves its workers' logs (LogsHandler), published in the node
	// record for the masters; nil when it serves none.
	Logs *cluster.LogsEndpoint
	// MetricsInterval is how often the agent scrapes its workers' metrics (each gets a
	// STORMDOCK_METRICS_PORT) and measures their cpu and memory, for the masters to pull
	// (jobmetrics.go). Default DefaultMetricsInterval; negative turns job metrics off.
	MetricsInterval time.Duration
	// Scrape bounds each worker's scrape (timeout, bytes, series, labels).
	Scrape scrape.Config
	// Registerer receives the agent's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (c *Config) defaults() error {
	if c.Node.ID == "" || c.Node.DC == "" || c.Node.Rack == "" {
		return errors.New("agent: node id, dc and rack are required")
	}
	if c.Node.Slots < 0 {
		return fmt.Errorf("agent: slots %d must not be negative", c.Node.Slots)
	}
	if c.StateDir == "" {
		return errors.New("agent: a state directory is required")
	}
	// Absolute: lease paths go into worker command lines and docker bind mounts.
	dir, err := filepath.Abs(c.StateDir)
	if err != nil {
		return fmt.Errorf("agent: state dir: %w", err)
	}
	c.StateDir = dir
	if c.Node.Host == "" {
		// The host tells this agent's own stale node entry from another agent's.
		if c.Node.Host, err = os.Hostname(); err != nil {
			return fmt.Errorf("agent: host name: %w", err)
		}
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = coord.DefaultSessionTimeout
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.PortBase == 0 {
		c.PortBase = DefaultPortBase
	}
	if c.PortBase < 1 || c.PortBase > 65535 {
		return fmt.Errorf("agent: port base %d out of range", c.PortBase)
	}
	if c.Self == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("agent: find own binary: %w", err)
		}
		c.Self = exe
	}
	if c.Launcher == "" {
		c.Launcher = c.Self
		if p, ok := shim.Beside(c.Self); ok {
			c.Launcher = p
		}
	}
	if c.ContainerSelf == "" {
		c.ContainerSelf = DefaultContainerSelf
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = c.SessionTimeout
	}
	if c.StoreSilence < c.SessionTimeout {
		c.StoreSilence = c.SessionTimeout
	}
	if c.RestartGrace < 0 {
		return fmt.Errorf("agent: restart grace %v must not be negative", c.RestartGrace)
	}
	if c.RejoinGrace < 0 {
		return fmt.Errorf("agent: rejoin grace %v must not be negative", c.RejoinGrace)
	}
	if c.RestartBackoff <= 0 {
		c.RestartBackoff = DefaultRestartBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.MaxBackoff < c.RestartBackoff {
		c.MaxBackoff = c.RestartBackoff
	}
	if c.CrashLoopWindow <= 0 {
		c.CrashLoopWindow = DefaultCrashLoopWindow
	}
	if c.StableRun <= 0 {
		c.StableRun = DefaultStableRun
	}
	if c.MetricsInterval == 0 {
		c.MetricsInterval = DefaultMetricsInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Agent runs one node's workers. Create it with New and run it with Run.
type Agent struct {
	cfg      Config
	store    coord.Store
	rca      routerCA // the router CA, once read
	drivers  map[string]isolation.Driver
	modes    []string
	log      *slog.Logger
	metrics  *metrics
	instance string
	me       self   // the agent's own uid and whether it can switch users
	leases   string // the lease directory (prepareStateDir)
	// dockerLauncher is the launcher's copy docker workers run under (bind-mounted), ""
	// without one, and then noDockerLauncher says why (prepareDockerLauncher).
	dockerLauncher   string
	noDockerLauncher error

	// drivers and modes grow when an isolation the agent started without comes (AddDriver),
	// imgs with them: they are read through driver, modesNow and images.
	drvMu sync.RWMutex
	imgs  Images
	// id is the node's identity (identity.go), loaded by Run.
	id *identity

	imageMetrics *imageMetrics
	// scraper holds the workers' metrics between rounds and the node's answer to the
	// masters (jobmetrics.go); nil when job metrics are off.
	scraper *scrape.Node

	// granted is the shortest session timeout the store granted (the agent's session or
	// the keeper's), 0 while unknown; shortOnce logs a grant shorter than asked, once.
	granted   atomic.Int64
	shortOnce sync.Once

	mu     sync.Mutex
	ran    bool
	cur    *run     // the running loop, for Victims and Evict
	wanted []string // images the assignment needs (WantedImages)
	// accessChecks holds when tenants' access checks of cached images passed (images.go).
	accessChecks map[string]time.Time
	// lastAccess holds what the store last said of shared images and tenants' registry
	// credentials, for starts while it does not answer (images.go).
	lastAccess map[string][]byte
	// masterHTTP reaches the leading master for secrets, as advertised by masterHTTPID
	// (its URL and certificate).
	masterHTTP   *http.Client
	masterHTTPID string
	// regAuth holds tenants' sealed registry credentials as the master opened them.
	regAuth map[string]openedAuth
}

// New returns an agent for the node in cfg that runs workers through drivers and keeps its
// node record in store. The caller keeps ownership of store and drivers and closes them
// after Run returned.
func New(cfg Config, store coord.Store, drivers ...Driver) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, errors.New("agent: no store")
	}
	if len(drivers) == 0 && len(cfg.LateIsolation) == 0 {
		return nil, errors.New("agent: no isolation driver")
	}
	if cfg.RunAs != nil && cfg.RunAs.UID == 0 {
		return nil, errors.New("agent: --run-as root: tenants' code never runs as root; give another user, or leave --run-as out so that each tenant runs as its own uid")
	}
	a := &Agent{cfg: cfg, store: store, drivers: map[string]isolation.Driver{}, imgs: cfg.Images, me: currentSelf()}
	a.leases = filepath.Join(cfg.StateDir, "leases")
	for _, d := range drivers {
		switch d.Isolation {
		case cluster.IsolationProcess, cluster.IsolationDocker:
		default:
			return nil, fmt.Errorf("agent: unknown isolation %q", d.Isolation)
		}
		if d.Driver == nil {
			return nil, fmt.Errorf("agent: isolation %s has no driver", d.Isolation)
		}
		if a.drivers[d.Isolation] != nil {
			return nil, fmt.Errorf("agent: isolation %s given twice", d.Isolation)
		}
		a.drivers[d.Isolation] = d.Driver
		a.modes = append(a.modes, d.Isolation)
	}
	slices.Sort(a.modes)
	var b [6]byte
	_, _ = rand.Read(b[:])
	a.instance = hex.EncodeToString(b[:])
	a.log = cfg.Logger.With("node", cfg.Node.ID, "agent", a.instance)
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	a.metrics = m
	if a.imageMetrics, err = newImageMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	a.noteGranted(coord.GrantedSessionTimeout(store), "agent")
	if cfg.MetricsInterval > 0 {
		sc := cfg.Scrape
		if sc.Timeout <= 0 {
			sc.Timeout = min(scrape.DefaultTimeout, cfg.MetricsInterval/2)
		}
		sc.Scraped = func(result string) { m.scrapes.WithLabelValues(result).Inc() }
		a.scraper = scrape.NewNode(cfg.Node.ID, sc)
	}
	return a, nil
}

// driver is the driver of an isolation mode, nil when the node offers none (yet).
func (a *Agent) driver(mode string) isolation.Driver {
	a.drvMu.RLock()
	defer a.drvMu.RUnlock()
	return a.drivers[mode]
}

// modesNow lists the isolation modes the node offers now, sorted.
func (a *Agent) modesNow() []string {
	a.drvMu.RLock()
	defer a.drvMu.RUnlock()
	return slices.Clone(a.modes)
}

// images is what pulls docker workers' images, nil while the node has no docker.
func (a *Agent) images() Images {
	a.drvMu.RLock()
	defer a.drvMu.RUnlock()
	return a.imgs
}

// AddDriver offers an isolation of Config.LateIsolation that the agent runs without so far
// (its engine did not answer when the agent started): the agent adopts the workers the
// driver knows (ended ones were stopped with the engine: no crash of theirs), advertises the
// mode from now on, and pulls images through images (nil: none). The agent must be running.
func (a *Agent) AddDriver(ctx context.Context, d Driver, images Images) error {
	if !slices.Contains(a.cfg.LateIsolation, d.Isolation) || d.Driver == nil {
		return fmt.Errorf("agent: isolation %q cannot be added", d.Isolation)
	}
	if a.driver(d.Isolation) != nil {
		return fmt.Errorf("agent: isolation %s given twice", d.Isolation)
	}
	var err error
	if cerr := a.call(ctx, func(r *run) {
		a.drvMu.Lock()
		a.drivers[d.Isolation] = d.Driver
		a.modes = append(a.modes, d.Isolation)
		slices.Sort(a.modes)
		if images != nil {
			a.imgs = images
		}
		a.drvMu.Unlock()
		if err = r.adoptMode(d.Isolation, true); err != nil {
			return
		}
		r.log.Info("isolation offered again: its engine answers", "isolation", d.Isolation, "workers", len(r.workers))
		r.urgent = true
		r.reconcile()
	}); cerr != nil {
		return cerr
	}
	return err
}

// Node returns the node as the agent registers it: with the isolation labels added.
func (a *Agent) Node() cluster.Node {
	n := a.cfg.Node
	labels := make(map[string]string, len(n.Labels)+2)
	for k, v := range n.Labels {
		labels[k] = v
	}
	for _, m := range a.modesNow() {
		labels["isolation/"+m] = "true"
	}
	n.Labels = labels
	return n
}

// Run adopts the workers an earlier agent left on this node, registers the node and keeps the
// node's workers in line with its assignment until ctx is done. Workers keep running when Run
// returns (a restarted agent adopts them); their leases lapse after LeaseTTL if no agent
// renews them.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.ran {
		a.mu.Unlock()
		return ErrAlreadyRun
	}
	a.ran = true
	a.mu.Unlock()

	for _, dir := range []string{a.cfg.StateDir, a.workersDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("agent: state dir: %w", err)
		}
	}
	if err := a.prepareStateDir(); err != nil {
		return err
	}
	if a.driver(cluster.IsolationProcess) != nil && !a.me.canSwitch && a.cfg.RunAs == nil {
		a.log.Warn("this agent cannot switch users: tenants' process workers are refused (docker workers still run as their tenants' uids): "+noSwitchHelp,
			"uid", a.me.euid)
	}
	unlock, err := lockDir(a.cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	a.prepareDockerLauncher()
	if a.id, err = loadIdentity(a.cfg.StateDir); err != nil {
		return err
	}
	if a.scraper != nil {
		defer a.scraper.Close()
	}

	r := newRun(ctx, a)
	a.mu.Lock()
	a.cur = r
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.cur = nil
		a.mu.Unlock()
	}()
	return r.loop()
}

func (a *Agent) workersDir() string { return filepath.Join(a.cfg.StateDir, "workers") }
func (a *Agent) leasesDir() string  { return a.leases }

// lockDir takes an exclusive lock on dir/agent.lock for the life of the agent. The kernel drops
// it when the process dies, so a crashed agent never blocks its successor.
func lockDir(dir string) (func(), error) {
	p := filepath.Join(dir, "agent.lock")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent: lock %s: %w", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrStateDirLocked, dir)
		}
		return nil, fmt.Errorf("agent: lock %s: %w", p, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// noteGranted takes a session timeout the store granted (to the agent's session or, by its
// status, to the keeper's; 0: unknown). A grant shorter than the one asked for is logged
// once: the leases then last only as long as the grant, since the session they stand for
// ends that long after the node goes silent.
func (a *Agent) noteGranted(g time.Duration, whose string) {
	if g <= 0 {
		return
	}
	for {
		cur := a.granted.Load()
		if cur != 0 && cur <= int64(g) {
			break
		}
		if a.granted.CompareAndSwap(cur, int64(g)) {
			break
		}
	}
	if g < a.cfg.SessionTimeout {
		a.shortOnce.Do(func() {
			a.log.Warn("the store granted a shorter session than asked: leases last the granted timeout",
				"session", whose, "asked", a.cfg.SessionTimeout, "granted", g, "lease_ttl", a.leaseTTL())
		})
	}
}

// leaseTTL is the workers' lease ttl: the configured one (the requested session timeout by
// default), but never longer than the session timeout the store granted.
func (a *Agent) leaseTTL() time.Duration {
	if g := time.Duration(a.granted.Load()); g > 0 && g < a.cfg.LeaseTTL {
		return g
	}
	return a.cfg.LeaseTTL
}

// sessionTimeouts are the session timeouts for the node record: the granted one, and the
// requested one only when the store granted less.
func (a *Agent) sessionTimeouts() (granted, requested cluster.Duration) {
	g := time.Duration(a.granted.Load())
	if g <= 0 {
		return 0, 0
	}
	if g < a.cfg.SessionTimeout {
		return cluster.Duration(g), cluster.Duration(a.cfg.SessionTimeout)
	}
	return cluster.Duration(g), 0
}
