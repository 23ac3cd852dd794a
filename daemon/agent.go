package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/healthcheck"
)

// AgentConfig is everything a node agent process is built from.
type AgentConfig struct {
	Node cluster.Node
	// Store is the coordination store's URL; every agent has a session of its own.
	Store        string
	StoreOptions coord.Options
	StateDir     string
	Drivers      DriverConfig
	Heartbeat    time.Duration
	PortBase     int
	LeaseTTL     time.Duration
	NoLease      bool
	// RestartGrace is how long the node's workers outlive the agent's process, held by a
	// keeper process (see agents.Keeper); 0 keeps the keeper inside the agent.
	RestartGrace time.Duration
	// StoreSilence is how long workers keep running while no store server answers at all.
	StoreSilence time.Duration
	// Health configures the node's health checks; its CgroupParent is the process driver's.
	Health healthcheck.Config
	// ProtectOOM asks the kernel to spare the agent when it kills for memory.
	ProtectOOM bool
	// Metrics is where /metrics is served ("" serves none).
	Metrics string
	Logger  *slog.Logger
}

// Agent is a built node agent: drivers, health monitor, store session and metrics.
type Agent struct {
	cfg      AgentConfig
	drivers  *Drivers
	store    coord.Store
	agent    *agents.Agent
	health   *agents.HealthMonitor
	registry *prometheus.Registry
	metrics  net.Listener
}

// NewAgent builds the node's drivers (with the cgroup fallback), its health monitor, its
// metrics and its store session. Nothing runs until Run.
func NewAgent(ctx context.Context, cfg AgentConfig) (a *Agent, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("node", cfg.Node.ID)
	if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	a = &Agent{cfg: cfg, registry: NewRegistry()}
	// Not a itself: a failed return sets the result to nil before this runs.
	built := a
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	dcfg := cfg.Drivers
	dcfg.Node, dcfg.Logger = cfg.Node.ID, log
	if dcfg.ProcessState == "" {
		dcfg.ProcessState = filepath.Join(cfg.StateDir, "process")
	}
	if dcfg.CgroupParent == "" {
		dcfg.CgroupParent = cfg.Health.CgroupParent
	}
	if a.drivers, err = NewDrivers(ctx, dcfg); err != nil {
		return nil, err
	}
	node := cfg.Node
	if a.drivers.Unconfined {
		node.Labels = maps.Clone(node.Labels)
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		node.Labels[LabelCgroups] = "false"
	}
	if cfg.Metrics != "" {
		if a.metrics, err = net.Listen("tcp", cfg.Metrics); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	hcfg := cfg.Health
	hcfg.CgroupParent = dcfg.CgroupParent
	if cfg.ProtectOOM {
		if err := healthcheck.ProtectAgent(""); err != nil {
			log.Warn("agent not protected from the kernel's OOM killer", "err", err)
		}
	}
	if a.health, err = agents.NewHealthMonitor(hcfg, node.Slots, a.registry, log); err != nil {
		return nil, err
	}
	opts := cfg.StoreOptions
	opts.Logger = cfg.Logger
	if a.store, err = coord.Open(ctx, cfg.Store, opts); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	ds := make([]agents.Driver, len(a.drivers.List))
	for i, d := range a.drivers.List {
		ds[i] = agents.Driver{Isolation: a.drivers.Modes[i], Driver: d}
	}
	a.agent, err = agents.New(agents.Config{
		Node:           node,
		StateDir:       cfg.StateDir,
		SessionTimeout: opts.SessionTimeout,
		Heartbeat:      cfg.Heartbeat,
		PortBase:       cfg.PortBase,
		LeaseTTL:       cfg.LeaseTTL,
		NoLease:        cfg.NoLease,
		StoreURL:       cfg.Store,
		RestartGrace:   cfg.RestartGrace,
		StoreSilence:   cfg.StoreSilence,
		Health:         a.health,
		Registerer:     a.registry,
		Logger:         cfg.Logger,
	}, a.store, ds...)
	if err != nil {
		return nil, err
	}
	a.health.Attach(a.agent)
	return a, nil
}

// Drivers are the node's isolation drivers.
func (a *Agent) Drivers() *Drivers { return a.drivers }

// Store is the agent's own store client.
func (a *Agent) Store() coord.Store { return a.store }

// Registry holds the agent's metrics.
func (a *Agent) Registry() *prometheus.Registry { return a.registry }

// Run runs the health checks, the metrics server and the agent until ctx is done. Workers
// keep running after it returns.
func (a *Agent) Run(ctx context.Context) error {
	log := a.cfg.Logger.With("node", a.cfg.Node.ID)
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.health.Run(hctx); err != nil && hctx.Err() == nil {
			log.Error("health checks stopped", "err", err)
		}
	}()
	defer func() {
		stop()
		<-done
	}()
	if a.metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{}))
		srv := NewHTTPServer(mux)
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(a.metrics); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		log.Info("serving metrics", "url", "http://"+a.metrics.Addr().String()+"/metrics")
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-served
		}()
	}
	return a.agent.Run(ctx)
}

// Close releases the store session, the drivers and the metrics listener. Workers keep
// running.
func (a *Agent) Close() {
	if a.metrics != nil {
		a.metrics.Close()
	}
	if a.store != nil {
		a.store.Close()
	}
	if a.drivers != nil {
		a.drivers.Close()
	}
}
