package daemon

// A local cluster is a whole stormdock cluster in one process: a master and many agents on
// one store, with simulated data centers and racks and real worker processes.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/client"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/healthcheck"
	"github.com/stormdock/stormdock/internal/await"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// SecretsKeyFile is the masters' keyring in a data directory (`up` makes it; see
// internal/keyring).
const SecretsKeyFile = "secrets.key"

// RootSinkDir is where a local cluster started as root keeps mirrored jobs' file sinks
// unless told otherwise: outside its data directory, which the routers' uids cannot enter.
const RootSinkDir = "/var/lib/stormdock/sinks"

// LocalConfig shapes a local cluster.
type LocalConfig struct {
	Nodes int
	// PortBase is the first node's first STORMDOCK_PORT; each next node's range starts 100
	// above (0: agents.DefaultPortBase). Clusters that run side by side on one host give
	// each its own: agents skip a port in use, but not one another cluster's worker is
	// about to take.
	PortBase   int
	DCs        []string
	RacksPerDC int
	Slots      int
	// NodeMemory and NodeCPU are each simulated node's capacity.
	NodeMemory cluster.Bytes
	NodeCPU    cluster.CPU
	// DataDir holds the store file, the admin token and the agents' state.
	DataDir string
	// Store overrides the embedded store persisted under DataDir (a zk:// URL joins a real
	// ZooKeeper, with digest ACLs: credentials are made in DataDir/store.credentials at the
	// first start, unless the URL carries some).
	Store string
	// StoreTLS names a zks:// store's TLS files (for the master, the agents and the
	// processes they start).
	StoreTLS coord.TLSFiles
	// API is the master's listen address; port 0 picks a free one.
	API string
	// TLS serves the API over TLS with a CA and certificate made in DataDir (ca.crt,
	// master.crt, master.key) at the first start.
	TLS            bool
	SessionTimeout time.Duration
	Heartbeat      time.Duration
	// Isolation lists the drivers every node offers: process (always) and docker.
	Isolation []string
	// RegistryAuth is Docker's config.json with registry credentials, for the master's
	// image pinning and the agents' pulls.
	RegistryAuth string
	// RunAs, when set, is who every tenant's process workers run as, on every node (the
	// single-tenant opt-out, see agents.Config.RunAs); nil: each tenant's own uid.
	RunAs *isolation.User
	// SinkDir is where mirrored jobs' file sinks lie, SinkDir/<tenant>/... (default
	// RootSinkDir as root, else DataDir/sinks; "off" turns file sinks off).
	SinkDir string
	// TenantUIDs is the range tenants' uids are given from; zero: the default.
	TenantUIDs cluster.UIDRange
	// Health is every node's health-check configuration (its cgroup parent is the node's
	// own); the zero value means healthcheck.DefaultConfig.
	Health *healthcheck.Config
	// CgroupParent is the cgroup below which each node's workers go, one cgroup per node
	// (CgroupParent/NODE); default /stormdock-local/<DataDir's name>. The cluster removes
	// only what it made: a given parent (say, a subtree delegated to an unprivileged user,
	// whose workers then run in cgroups too) stays.
	CgroupParent string
	// Self is the stormdock binary every node runs workers with (AgentConfig.Self).
	Self string
	// SecretsKey is the masters' keyring file (MasterConfig.SecretsKey); default
	// DataDir/secrets.key, made at the first start; "off" turns secrets off.
	SecretsKey string
	// Events bounds the cluster's events (eventlog.Config).
	Events eventlog.Config
	// Metrics shapes the master's job metrics; its Interval is also the agents' scrape
	// interval.
	Metrics jobmetrics.Config
	Logger  *slog.Logger
}

func (c *LocalConfig) defaults() error {
	if c.Nodes <= 0 {
		c.Nodes = 12
	}
	if len(c.DCs) == 0 {
		c.DCs = []string{"dc-a", "dc-b", "dc-c"}
	}
	for _, dc := range c.DCs {
		if err := cluster.CheckName(dc); err != nil {
			return fmt.Errorf("data center name: %w", err)
		}
	}
	if c.RacksPerDC <= 0 {
		c.RacksPerDC = 2
	}
	if c.Slots <= 0 {
		c.Slots = 4
	}
	if c.NodeMemory <= 0 {
		c.NodeMemory = 4 << 30
	}
	if c.NodeCPU <= 0 {
		c.NodeCPU = 4000
	}
	if c.DataDir == "" {
		return errors.New("a local cluster needs a data directory")
	}
	if c.Store == "" {
		c.Store = "file://" + filepath.Join(c.DataDir, "store.json")
	}
	switch c.SinkDir {
	case "off":
		c.SinkDir = ""
	case "":
		c.SinkDir = filepath.Join(c.DataDir, "sinks")
		if os.Geteuid() == 0 {
			// Routers run as their tenants' router uids, which cannot enter a data
			// directory that holds the admin token (0700, often below /root).
			c.SinkDir = RootSinkDir
		}
	}
	if c.SinkDir != "" {
		// Specs name sink files by absolute path: so is the directory they are checked
		// against.
		abs, err := filepath.Abs(c.SinkDir)
		if err != nil {
			return fmt.Errorf("sink dir: %w", err)
		}
		c.SinkDir = abs
	}
	if c.API == "" {
		c.API = "127.0.0.1:7070"
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 2 * time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	for _, m := range c.Isolation {
		if m != cluster.IsolationProcess && m != cluster.IsolationDocker {
			return fmt.Errorf("isolation must be process or docker, not %q", m)
		}
	}
	if c.Health == nil {
		d := healthcheck.DefaultConfig()
		c.Health = &d
	}
	if c.CgroupParent != "" {
		c.CgroupParent = path.Clean("/" + c.CgroupParent)
	}
	return c.Health.Validate()
}

// Local is a running local cluster.
type Local struct {
	cfg      LocalConfig
	creds    string // the store's credentials, when it has ACLs
	credFile string
	master   *Master
	store    coord.Store
	confined bool

	cancel context.CancelFunc
	wg     sync.WaitGroup

	docker *client.Client // shared by every node's docker driver, when docker is offered

	mu    sync.Mutex
	nodes map[string]*localNode
	order []string
}

// localNode is one simulated machine: an agent with its own store session and drivers.
type localNode struct {
	spec   cluster.Node
	agent  *Agent
	cancel context.CancelFunc
	done   chan struct{}
	dead   bool
}

// StartLocal runs the master and every agent; it returns once the API listens.
func StartLocal(ctx context.Context, cfg LocalConfig) (*Local, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("make data directory: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Local{cfg: cfg, cancel: cancel, nodes: map[string]*localNode{}}
	fail := func(err error) (*Local, error) {
		c.Close(context.Background())
		return nil, err
	}
	var err error
	opts := coord.Options{SessionTimeout: cfg.SessionTimeout, Logger: cfg.Logger, TLS: cfg.StoreTLS}
	if t, perr := coord.ParseURL(cfg.Store); perr == nil && t.Scheme == "zk" && t.Credentials == "" {
		// A ZooKeeper this cluster shares with others: its entries are for it alone.
		if c.credFile, c.creds, err = EnsureStoreCredentials(cfg.DataDir); err != nil {
			return fail(err)
		}
		opts.Credentials = c.creds
	}
	// A ZooKeeper that does not answer yet (started with the cluster, or without quorum) is
	// waited for, saying so, until ctx ends.
	if c.store, err = (await.Dep{Name: "the store", Log: cfg.Logger}).OpenStore(ctx, cfg.Store, opts); err != nil {
		return fail(fmt.Errorf("open store: %w", err))
	}
	// Its nodes start with the master, in this process: they need no longer than a session
	// to register, not a whole cluster's re-registration window (the demo loses a node
	// seconds after the start).
	switch cfg.SecretsKey {
	case "off":
		cfg.SecretsKey = ""
	case "":
		cfg.SecretsKey = filepath.Join(cfg.DataDir, SecretsKeyFile)
		if _, err := keyring.Ensure(cfg.SecretsKey); err != nil {
			return fail(err)
		}
	}
	mcfg := MasterConfig{Store: cfg.Store, OpenedStore: c.store, Listen: cfg.API, ID: "local", DataDir: cfg.DataDir, SinkDir: cfg.SinkDir, SecretsKey: cfg.SecretsKey,
		RegistryAuth: cfg.RegistryAuth, Events: cfg.Events, Metrics: cfg.Metrics, ReregisterGrace: cfg.SessionTimeout, TenantUIDs: cfg.TenantUIDs, Logger: cfg.Logger}
	if cfg.TLS {
		if mcfg.TLS, err = MasterTLS(cfg.DataDir, cfg.API); err != nil {
			return fail(err)
		}
	}
	c.master, err = NewMaster(ctx, mcfg)
	if err != nil {
		return fail(err)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		// Cancelled, by Close or a failed start, it only stopped.
		if err := c.master.Run(rctx); err != nil && rctx.Err() == nil {
			cfg.Logger.Error("master stopped", "err", err)
		}
	}()
	// An unprivileged user's cluster is confined only in a cgroup parent it was given (one
	// delegated to it): anywhere else it could not create cgroups.
	c.confined = os.Geteuid() == 0 || cfg.CgroupParent != ""
	if !c.confined {
		cfg.Logger.Warn("not root: workers run as plain processes, without cgroup limits")
	}
	if slices.Contains(cfg.Isolation, cluster.IsolationDocker) {
		if c.docker, err = docker.Connect(ctx, ""); err != nil {
			return fail(fmt.Errorf("docker isolation: %w", err))
		}
	}
	for i := range cfg.Nodes {
		dc := cfg.DCs[i%len(cfg.DCs)]
		rack := fmt.Sprintf("r%d", (i/len(cfg.DCs))%cfg.RacksPerDC+1)
		id := fmt.Sprintf("%s-%s-n%d", dc, rack, i/(len(cfg.DCs)*cfg.RacksPerDC)+1)
		// Every local node is this host.
		n := cluster.Node{ID: id, Host: "localhost", Addr: "127.0.0.1", DC: dc, Rack: rack, Slots: cfg.Slots, Memory: cfg.NodeMemory, CPU: cfg.NodeCPU}
		if err := c.startNode(ctx, n); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// CgroupParent is where a node's worker cgroups go; one per data directory so that two
// local clusters do not adopt each other's workers.
func (c *Local) CgroupParent(id string) string {
	if c.cfg.CgroupParent != "" {
		return path.Join(c.cfg.CgroupParent, id)
	}
	return "/stormdock-local/" + strings.ReplaceAll(filepath.Base(c.cfg.DataDir), ".", "_") + "/" + id
}

func (c *Local) startNode(ctx context.Context, spec cluster.Node) error {
	iso := []string{cluster.IsolationProcess}
	if c.docker != nil {
		iso = append(iso, cluster.IsolationDocker)
	}
	cgroups := CgroupsRequired
	if !c.confined {
		cgroups = CgroupsOff
	}
	c.mu.Lock()
	portBase := cmp.Or(c.cfg.PortBase, agents.DefaultPortBase) + 100*len(c.order)
	c.mu.Unlock()
	health := *c.cfg.Health
	health.CgroupParent = c.CgroupParent(spec.ID)
	a, err := NewAgent(ctx, AgentConfig{
		Node:                 spec,
		Store:                c.cfg.Store,
		StoreOptions:         coord.Options{SessionTimeout: c.cfg.SessionTimeout, Credentials: c.creds, TLS: c.cfg.StoreTLS},
		StoreCredentialsFile: c.credFile,
		RunAs:                c.cfg.RunAs,
		SinkDir:              c.cfg.SinkDir,
		StateDir:             filepath.Join(c.cfg.DataDir, "nodes", spec.ID),
		Drivers: DriverConfig{Isolation: iso, Cgroups: cgroups, Docker: c.docker,
			DockerLabels: map[string]string{"stormdock.local": filepath.Base(c.cfg.DataDir)}},
		Heartbeat: c.cfg.Heartbeat,
		PortBase:  portBase,
		// One interval for both: a master's round then finds each agent's last one fresh.
		MetricsInterval: c.cfg.Metrics.Interval,
		LogsTLS:         c.cfg.TLS,
		Health:          health,
		RegistryAuth:    c.cfg.RegistryAuth,
		Self:            c.cfg.Self,
		Logger:          c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", spec.ID, err)
	}
	n := &localNode{spec: spec, agent: a, done: make(chan struct{})}
	actx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	c.mu.Lock()
	c.nodes[spec.ID] = n
	c.order = append(c.order, spec.ID)
	c.mu.Unlock()
	go func() {
		defer close(n.done)
		if err := a.Run(actx); err != nil && actx.Err() == nil {
			c.cfg.Logger.Error("agent stopped", "node", spec.ID, "err", err)
		}
	}()
	return nil
}

// API is the master's URL.
func (c *Local) API() string { return c.master.URL() }

// TokenPath is the admin token's file ("" when another master made the token).
func (c *Local) TokenPath() string { return c.master.TokenPath() }

// MetricsTokenPath is the scrape token's file ("" when another master made the token):
// /metrics (the master's and the agents') answers to `Authorization: Bearer <its content>`.
func (c *Local) MetricsTokenPath() string { return c.master.MetricsTokenPath() }

// CAFile is the CA certificate that signs the API's certificate ("" without TLS).
func (c *Local) CAFile() string {
	if !c.cfg.TLS {
		return ""
	}
	return filepath.Join(c.cfg.DataDir, CACertFile)
}

// Registry holds the master's metrics, served at API()/metrics to the scrape token
// (MetricsTokenPath) or the admin token.
func (c *Local) Registry() *prometheus.Registry { return c.master.Registry() }

// Confined reports whether workers run in cgroups.
func (c *Local) Confined() bool { return c.confined }

// Nodes lists the node ids in start order.
func (c *Local) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.order...)
}

// KillNode simulates the loss of a machine: its agent and workers die at once and its
// store session ends, so the master re-places the workers elsewhere.
func (c *Local) KillNode(ctx context.Context, id string) error {
	c.mu.Lock()
	n, ok := c.nodes[id]
	if !ok || n.dead {
		c.mu.Unlock()
		return fmt.Errorf("no live node %q", id)
	}
	n.dead = true
	c.mu.Unlock()
	n.cancel()
	<-n.done
	c.stopWorkers(ctx, n, 0)
	// A dead machine does not say goodbye: its session lingers until the timeout.
	if e, ok := n.agent.Store().(interface{ Crash() }); ok {
		e.Crash()
	}
	n.close()
	return nil
}

// close releases the node's drivers and store client.
func (n *localNode) close() {
	n.agent.Close()
	n.agent.Drivers().RemoveParents()
}

// stopWorkers stops every worker the node's drivers know.
func (c *Local) stopWorkers(ctx context.Context, n *localNode, grace time.Duration) {
	var wg sync.WaitGroup
	for _, d := range n.agent.Drivers().List {
		ws, err := d.List(ctx)
		if err != nil {
			continue
		}
		for _, w := range ws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g := grace
				if g == 0 {
					g = time.Millisecond
				}
				if _, err := d.Stop(ctx, w.Spec.ID, g); err != nil && !errors.Is(err, isolation.ErrNotFound) {
					c.cfg.Logger.Warn("stop worker", "node", n.spec.ID, "worker", w.Spec.ID, "err", err)
				}
				// The cluster goes (or the node dies with it): no log of it is read again.
				if dd, ok := d.(isolation.Discarder); ok {
					_ = dd.Discard(ctx, w.Spec.ID)
				}
			}()
		}
	}
	wg.Wait()
}

// Close stops the agents, then every worker (each with its grace period), then the master,
// so that nothing is left running.
func (c *Local) Close(ctx context.Context) error {
	c.mu.Lock()
	nodes := make([]*localNode, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.cancel()
			<-n.done
			if !n.dead {
				c.stopWorkers(ctx, n, 5*time.Second)
				n.close()
			}
		}()
	}
	wg.Wait()
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	if c.master != nil {
		c.master.Close()
	}
	if c.store != nil {
		c.store.Close()
	}
	if c.docker != nil {
		c.docker.Close()
	}
	c.removeCgroupDirs()
	return nil
}

// removeCgroupDirs removes the cluster's own cgroup directories above the nodes' parents
// (the drivers remove those), in every mounted hierarchy, once they are empty.
func (c *Local) removeCgroupDirs() {
	if c.cfg.CgroupParent != "" {
		return // not ours
	}
	dir := path.Dir(c.CgroupParent("x"))
	for _, d := range []string{dir, path.Dir(dir)} {
		mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, m := range append(mounts, "/sys/fs/cgroup") {
			_ = os.Remove(filepath.Join(m, d)) // fails, harmlessly, while anything is inside
		}
	}
}
