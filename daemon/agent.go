package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/healthcheck"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/await"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/internal/metricsauth"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/profiling"
	"github.com/stormdock/stormdock/isolation"
)

// AgentConfig is everything a node agent process is built from.
type AgentConfig struct {
	Node cluster.Node
	// Store is the coordination store's URL; every agent has a session of its own.
	Store        string
	StoreOptions coord.Options
	// StoreCredentialsFile holds the store's credentials for the processes the agent
	// starts (its keeper, output routers). Credentials given another way (StoreOptions, the
	// URL) are written to StateDir/store.credentials for them.
	StoreCredentialsFile string
	StateDir             string
	Drivers              DriverConfig
	Heartbeat            time.Duration
	// RestartBackoff is the first delay before a crashed worker is restarted (it doubles
	// with every quick crash within the crash-loop window, see agents.Config); 0 means
	// agents.DefaultRestartBackoff.
	RestartBackoff time.Duration
	PortBase       int
	// MetricsInterval is how often the agent scrapes its workers' metrics
	// (agents.Config.MetricsInterval; negative: never).
	MetricsInterval time.Duration
	LeaseTTL        time.Duration
	NoLease         bool
	// RunAs, when set, is who every tenant's process workers run as (the single-tenant
	// opt-out, see agents.Config.RunAs); nil: each tenant's own uid.
	RunAs *isolation.User
	// SinkDir is where the node's routers' file sinks lie (agents.Config.SinkDir).
	SinkDir string
	// RestartGrace is how long the node's workers outlive the agent's process, held by a
	// keeper process (see agents.Keeper); 0 keeps the keeper inside the agent.
	RestartGrace time.Duration
	// StoreSilence is how long workers keep running while no store server answers at all.
	StoreSilence time.Duration
	// RejoinGrace is how long workers keep running after a store outage while the node has
	// not got its session back (agents.Config.RejoinGrace).
	RejoinGrace time.Duration
	// Health configures the node's health checks; its CgroupParent is the process driver's.
	Health healthcheck.Config
	// ProtectOOM asks the kernel to spare the agent when it kills for memory.
	ProtectOOM bool
	// Metrics is where /metrics is served ("" serves none), to the scrape token or the admin
	// token (package internal/metricsauth), and the agent's profiles (/debug/pprof/) and
	// runtime figures (/debug/runtime), to the admin token alone.
	Metrics string
	// LogsListen is where the agent serves its workers' logs to the masters (HOST:PORT; ""
	// means the node's advertised address, any free port); the port is published in the
	// node record. LogsOff serves none.
	LogsListen string
	LogsOff    bool
	// LogsTLS serves them over TLS, with a self-signed certificate kept in StateDir
	// (logs.crt, logs.key) that the masters trust by its hash, published with the port.
	LogsTLS bool
	// RegistryAuth is Docker's config.json with the credentials docker workers' images are
	// pulled with; "" pulls anonymously. Never from a job spec, never logged.
	RegistryAuth string
	// ImageGC caps the stormdock images kept on the node's engine (docker isolation only);
	// its zero value collects nothing.
	ImageGC images.GCConfig
	// Self is the stormdock binary that runs the workers' lease launcher and the jobs'
	// `stormdock ...` commands; default this process's own (a test process gives a built one).
	Self   string
	Logger *slog.Logger
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
	logs     net.Listener // nil when LogsOff
	logsTLS  *tls.Config
	gc       *images.GC
	auth     *images.Auth // the node's registry credentials, nil: anonymous
}

// imageManager is the node's images through a docker engine: the manager, and the puller the
// agent pulls through.
func (a *Agent) imageManager(cl *client.Client) (*images.Manager, agents.Images) {
	mgr := images.New(cl, images.WithAuth(a.auth), images.WithLogger(a.cfg.Logger.With("node", a.cfg.Node.ID)))
	return mgr, puller{m: mgr, res: &images.Resolver{Auth: a.auth}}
}

// awaitDocker waits for the docker engine of a node that started without it, then offers
// docker isolation (agents.Agent.AddDriver). The node runs its process workers meanwhile.
func (a *Agent) awaitDocker(ctx context.Context, waiting prometheus.Gauge) {
	log := a.cfg.Logger.With("node", a.cfg.Node.ID)
	dep := await.Dep{Name: "the docker engine", Log: log, Waiting: waiting, Max: 30 * time.Second,
		Transient: func(err error) bool { return errors.Is(err, isolation.ErrUnavailable) }}
	var drv isolation.Driver
	var cl *client.Client
	err := dep.Do(ctx, "offer docker isolation", func(ctx context.Context) (err error) {
		drv, cl, err = a.drivers.ConnectDocker(ctx)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Error("docker isolation stays off", "err", err)
		}
		return
	}
	mgr, pull := a.imageManager(cl)
	// The agent's loop may still be starting (adopting, its keeper): try until it takes it.
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := a.agent.AddDriver(cctx, agents.Driver{Isolation: cluster.IsolationDocker, Driver: drv}, pull)
		cancel()
		if err == nil {
			if a.cfg.ImageGC.Enabled() {
				gcfg := a.cfg.ImageGC
				gcfg.Wanted = a.agent.WantedImages
				_ = mgr.NewGC(gcfg).Run(ctx)
			}
			return
		}
		log.Debug("offer docker isolation", "err", err)
		if ctxtime.Sleep(ctx, 500*time.Millisecond) != nil {
			return
		}
	}
}

// puller adapts images.Manager to agents.Images.
// puller is the agent's images: pulls through the engine, access checks through the
// registry's HTTP API, both with the node's own credentials for shared images only.
type puller struct {
	m   *images.Manager
	res *images.Resolver
}

func (p puller) Has(ctx context.Context, ref string) (bool, error) { return p.m.Has(ctx, ref) }
func (p puller) Pull(ctx context.Context, ref string, acc images.Access) error {
	return p.m.PullAccess(ctx, ref, acc, images.Progress{})
}
func (p puller) Check(ctx context.Context, ref string, acc images.Access) error {
	return p.res.CheckAccess(ctx, ref, acc)
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
	built := a // a failing return sets the named result to nil before this runs
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
	self := cfg.Self
	if self == "" {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find own binary: %w", err)
		}
	}
	var launcher string
	dcfg.Shim, launcher = Launchers(self, cfg.RunAs, log)
	// An agent whose docker engine does not answer runs without docker isolation (saying
	// so) and offers it once the engine answers (Run); a local cluster's shared client was
	// dialled by the cluster.
	dcfg.DockerLate = dcfg.Docker == nil
	if a.drivers, err = NewDrivers(ctx, dcfg); err != nil {
		return nil, err
	}
	node := cfg.Node
	if node.Addr == "" {
		if node.Addr, err = AdvertiseAddr(cfg.Store); err != nil {
			return nil, err
		}
	}
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
	var logsEP *cluster.LogsEndpoint
	if !cfg.LogsOff {
		if logsEP, err = a.listenLogs(node.Addr); err != nil {
			return nil, err
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
	// An agent started while the store is unreachable or without quorum waits for it,
	// saying so, instead of exiting: its workers (adopted once it runs) have their own
	// keeper's verdicts meanwhile.
	dep := await.Dep{Name: "the store", Log: log, Waiting: await.StoreWaiting(a.registry)}
	if a.store, err = dep.OpenStore(ctx, cfg.Store, opts); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// What the agent's own processes get: the URL without credentials, and the credentials
	// in a file.
	plainStore, urlCreds, err := PlainStoreURL(cfg.Store)
	if err != nil {
		return nil, err
	}
	credFile, creds := cfg.StoreCredentialsFile, opts.Credentials
	if creds == "" {
		creds = urlCreds
	}
	if credFile == "" && creds != "" {
		if credFile, err = WriteStoreCredentials(cfg.StateDir, creds); err != nil {
			return nil, err
		}
	}
	var pull agents.Images
	var mgr *images.Manager
	if cfg.RegistryAuth != "" {
		if a.auth, err = images.LoadAuth(cfg.RegistryAuth); err != nil {
			return nil, err
		}
	}
	if a.drivers.Docker != nil {
		mgr, pull = a.imageManager(a.drivers.Docker)
	}
	ds := make([]agents.Driver, len(a.drivers.List))
	for i, d := range a.drivers.List {
		ds[i] = agents.Driver{Isolation: a.drivers.Modes[i], Driver: d}
	}
	var late []string
	if a.drivers.DockerLate {
		late = []string{cluster.IsolationDocker}
	}
	a.agent, err = agents.New(agents.Config{
		Node:                 node,
		StateDir:             cfg.StateDir,
		SessionTimeout:       opts.SessionTimeout,
		Heartbeat:            cfg.Heartbeat,
		RestartBackoff:       cfg.RestartBackoff,
		PortBase:             cfg.PortBase,
		MetricsInterval:      cfg.MetricsInterval,
		LeaseTTL:             cfg.LeaseTTL,
		NoLease:              cfg.NoLease,
		RunAs:                cfg.RunAs,
		SinkDir:              cfg.SinkDir,
		Self:                 self,
		Launcher:             launcher,
		StoreURL:             plainStore,
		StoreCredentialsFile: credFile,
		StoreTLS:             opts.TLS,
		RestartGrace:         cfg.RestartGrace,
		StoreSilence:         cfg.StoreSilence,
		RejoinGrace:          cfg.RejoinGrace,
		Health:               a.health,
		Images:               pull,
		LateIsolation:        late,
		Logs:                 logsEP,
		Registerer:           a.registry,
		Logger:               cfg.Logger,
	}, a.store, ds...)
	if err != nil {
		return nil, err
	}
	if mgr != nil && cfg.ImageGC.Enabled() {
		gcfg := cfg.ImageGC
		gcfg.Wanted = a.agent.WantedImages
		a.gc = mgr.NewGC(gcfg)
	}
	a.health.Attach(a.agent)
	return a, nil
}

// Files of an agent's log endpoint certificate in its state directory.
const (
	LogsCertFile = "logs.crt"
	LogsKeyFile  = "logs.key"
)

// listenLogs listens for the masters' log requests and says where, for the node record.
func (a *Agent) listenLogs(addr string) (*cluster.LogsEndpoint, error) {
	listen := a.cfg.LogsListen
	if listen == "" {
		listen = net.JoinHostPort(addr, "0")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("logs: listen on %s: %w (pick another --logs-listen)", listen, err)
	}
	a.logs = ln
	ep := &cluster.LogsEndpoint{Port: ln.Addr().(*net.TCPAddr).Port}
	if a.cfg.LogsTLS {
		cert, sum, err := pki.EnsureSelfSigned(a.cfg.StateDir, LogsCertFile, LogsKeyFile, pki.CertHosts(addr, listen))
		if err != nil {
			return nil, fmt.Errorf("logs: %w", err)
		}
		a.logsTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		ep.TLS, ep.CertSHA256 = true, sum
	}
	return ep, nil
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
	if a.drivers.DockerLate {
		dockerDone := make(chan struct{})
		waiting := prometheus.NewGauge(prometheus.GaugeOpts{Name: "stormdock_docker_waiting",
			Help: "1 while the agent waits for its docker engine: the node offers no docker isolation meanwhile."})
		if err := a.registry.Register(waiting); err != nil {
			waiting = nil
		}
		go func() {
			defer close(dockerDone)
			a.awaitDocker(hctx, waiting)
		}()
		defer func() {
			stop()
			<-dockerDone
		}()
	}
	if a.gc != nil {
		gcDone := make(chan struct{})
		go func() {
			defer close(gcDone)
			_ = a.gc.Run(hctx)
		}()
		defer func() {
			stop()
			<-gcDone
		}()
	}
	if a.metrics != nil {
		mux := http.NewServeMux()
		// The figures name jobs (restarts, OOM kills, evictions by job): for the scrape
		// token or the admin token alone, checked against their hashes in the store.
		guard := metricsauth.New(a.store, log)
		mux.Handle("GET /metrics", guard.Wrap(promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{})))
		// The agent's profiles and runtime figures, for the admin alone.
		mux.Handle("GET "+profiling.Prefix, guard.Admin(profiling.Handler()))
		srv := api.NewServer(mux)
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
	if a.logs != nil {
		srv := api.NewServer(a.agent.LogsHandler())
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
		ln := a.logs
		if a.logsTLS != nil {
			ln = tls.NewListener(ln, a.logsTLS)
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("logs server", "err", err)
			}
		}()
		log.Info("serving workers' logs to the masters", "addr", a.logs.Addr().String(), "tls", a.logsTLS != nil)
		defer func() {
			// Followers end with the server: Close, not Shutdown, which would wait for them.
			_ = srv.Close()
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
	if a.logs != nil {
		a.logs.Close()
	}
	if a.store != nil {
		a.store.Close()
	}
	if a.drivers != nil {
		a.drivers.Close()
	}
}
