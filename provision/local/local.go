// Package local runs a whole stormdock cluster in one process: a master and many agents on
// one store, with simulated data centers and racks and real worker processes.
package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/isolation/process"
	"github.com/stormdock/stormdock/scheduler"
)

// Config shapes a local cluster.
type Config struct {
	Nodes      int
	DCs        []string
	RacksPerDC int
	Slots      int
	// NodeMemory and NodeCPU are each simulated node's capacity.
	NodeMemory cluster.Bytes
	NodeCPU    cluster.CPU
	// DataDir holds the store file, the admin token and the agents' state.
	DataDir string
	// Store overrides the embedded store persisted under DataDir (a zk:// URL joins a real
	// ZooKeeper).
	Store string
	// API is the master's listen address; port 0 picks a free one.
	API            string
	SessionTimeout time.Duration
	Heartbeat      time.Duration
	// Isolation lists the drivers every node offers: process (always) and docker.
	Isolation []string
	Logger    *slog.Logger
}

func (c *Config) defaults() error {
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
	return nil
}

// Cluster is a running local cluster.
type Cluster struct {
	cfg       Config
	apiURL    string
	tokenPath string
	registry  *prometheus.Registry
	confined  bool

	cancel context.CancelFunc
	wg     sync.WaitGroup
	http   *http.Server
	store  coord.Store

	docker *client.Client // shared by every node's docker driver, when docker is offered

	mu    sync.Mutex
	nodes map[string]*node
	order []string
}

// node is one simulated machine: an agent with its own store session and driver.
type node struct {
	spec    cluster.Node
	store   coord.Store
	drivers []isolation.Driver
	cancel  context.CancelFunc
	done    chan struct{}
	dead    bool
}

// Start runs the master and every agent; it returns once the API listens.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("make data directory: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.API)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another local cluster running? pick --api)", cfg.API, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{cfg: cfg, apiURL: "http://" + ln.Addr().String(), cancel: cancel, nodes: map[string]*node{},
		registry: prometheus.NewRegistry()}
	fail := func(err error) (*Cluster, error) {
		ln.Close()
		c.Close(context.Background())
		return nil, err
	}
	c.store, err = coord.Open(ctx, cfg.Store, coord.Options{SessionTimeout: cfg.SessionTimeout, Logger: cfg.Logger})
	if err != nil {
		return fail(fmt.Errorf("open store: %w", err))
	}
	if c.tokenPath, err = scheduler.EnsureAdminToken(ctx, c.store, cfg.DataDir); err != nil {
		return fail(err)
	}
	m, err := scheduler.New(c.store, scheduler.Config{ID: "local", API: c.apiURL, Logger: cfg.Logger, Registry: c.registry})
	if err != nil {
		return fail(err)
	}
	c.http = &http.Server{Handler: m.Handler(c.registry), ReadHeaderTimeout: 10 * time.Second}
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		_ = c.http.Serve(ln)
	}()
	go func() {
		defer c.wg.Done()
		if err := m.Run(rctx); err != nil {
			cfg.Logger.Error("master stopped", "err", err)
		}
	}()
	c.confined = os.Geteuid() == 0
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
		n := cluster.Node{ID: id, Host: "localhost", DC: dc, Rack: rack, Slots: cfg.Slots, Memory: cfg.NodeMemory, CPU: cfg.NodeCPU}
		if err := c.startNode(ctx, n); err != nil {
			return fail(err)
		}
	}
	return c, nil
}

// cgroupParent is where a node's worker cgroups go; one per data directory so that two
// local clusters do not adopt each other's workers.
func (c *Cluster) cgroupParent(id string) string {
	return "/stormdock-local/" + strings.ReplaceAll(filepath.Base(c.cfg.DataDir), ".", "_") + "/" + id
}

func (c *Cluster) startNode(ctx context.Context, spec cluster.Node) error {
	stateDir := filepath.Join(c.cfg.DataDir, "nodes", spec.ID)
	log := c.cfg.Logger.With("node", spec.ID)
	pd, err := process.New(process.Config{
		CgroupParent: c.cgroupParent(spec.ID),
		StateDir:     filepath.Join(stateDir, "process"),
		Unconfined:   !c.confined,
		Logger:       log,
	})
	if err != nil {
		return fmt.Errorf("node %s: %w", spec.ID, err)
	}
	n := &node{spec: spec, drivers: []isolation.Driver{pd}, done: make(chan struct{})}
	drivers := []agents.Driver{{Isolation: cluster.IsolationProcess, Driver: pd}}
	if c.docker != nil {
		dd, err := docker.New(ctx, docker.Config{Client: c.docker, Node: spec.ID,
			Labels: map[string]string{"stormdock.local": filepath.Base(c.cfg.DataDir)}, Logger: log})
		if err != nil {
			n.close()
			return fmt.Errorf("node %s: %w", spec.ID, err)
		}
		n.drivers = append(n.drivers, dd)
		drivers = append(drivers, agents.Driver{Isolation: cluster.IsolationDocker, Driver: dd})
	}
	if n.store, err = coord.Open(ctx, c.cfg.Store, coord.Options{SessionTimeout: c.cfg.SessionTimeout, Logger: c.cfg.Logger}); err != nil {
		n.close()
		return fmt.Errorf("node %s: open store: %w", spec.ID, err)
	}
	a, err := agents.New(agents.Config{
		Node: spec, StateDir: stateDir, SessionTimeout: c.cfg.SessionTimeout, Heartbeat: c.cfg.Heartbeat,
		PortBase: 6700 + 100*len(c.order), Logger: c.cfg.Logger,
	}, n.store, drivers...)
	if err != nil {
		n.close()
		return fmt.Errorf("node %s: %w", spec.ID, err)
	}
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
func (c *Cluster) API() string { return c.apiURL }

// TokenPath is the admin token's file ("" when another master made the token).
func (c *Cluster) TokenPath() string { return c.tokenPath }

// Registry holds the master's metrics, served at API()/metrics.
func (c *Cluster) Registry() *prometheus.Registry { return c.registry }

// Confined reports whether workers run in cgroups.
func (c *Cluster) Confined() bool { return c.confined }

// Nodes lists the node ids in start order.
func (c *Cluster) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.order...)
}

// KillNode simulates the loss of a machine: its agent and workers die at once and its
// store session ends, so the master re-places the workers elsewhere.
func (c *Cluster) KillNode(ctx context.Context, id string) error {
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
	if e, ok := n.store.(interface{ Crash() }); ok {
		e.Crash()
	} else {
		n.store.Close()
	}
	return nil
}

// close releases the node's drivers and store client.
func (n *node) close() {
	for _, d := range n.drivers {
		d.Close()
		if p, ok := d.(interface{ RemoveParent() error }); ok {
			_ = p.RemoveParent()
		}
	}
	if n.store != nil {
		n.store.Close()
	}
}

// stopWorkers stops every worker the node's drivers know.
func (c *Cluster) stopWorkers(ctx context.Context, n *node, grace time.Duration) {
	var wg sync.WaitGroup
	for _, d := range n.drivers {
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
			}()
		}
	}
	wg.Wait()
}

// Close stops the agents, then every worker (each with its grace period), then the master,
// so that nothing is left running.
func (c *Cluster) Close(ctx context.Context) error {
	c.mu.Lock()
	nodes := make([]*node, 0, len(c.nodes))
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
			}
			n.close()
		}()
	}
	wg.Wait()
	if c.cancel != nil {
		c.cancel()
	}
	if c.http != nil {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = c.http.Shutdown(sctx)
		cancel()
	}
	c.wg.Wait()
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
func (c *Cluster) removeCgroupDirs() {
	dir := path.Dir(c.cgroupParent("x"))
	for _, d := range []string{dir, path.Dir(dir)} {
		mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
		for _, m := range append(mounts, "/sys/fs/cgroup") {
			_ = os.Remove(filepath.Join(m, d)) // fails, harmlessly, while anything is inside
		}
	}
}
