package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/eventlog"
	"github.com/stormdock/stormdock/master/httpapi"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// MasterConfig is everything a master process is built from.
type MasterConfig struct {
	// Store is the coordination store's URL (see coord.Open). A master of a local cluster
	// shares the cluster's client instead (OpenStore).
	Store        string
	StoreOptions coord.Options
	// OpenedStore, when set, is used instead of opening Store; the master does not close it.
	OpenedStore coord.Store
	// Listen is the API's listen address ("127.0.0.1:7070"; port 0 picks one).
	Listen string
	// Advertise is the API's address (HOST:PORT) as clients on other hosts reach it, told to
	// them through the store and written to the data directory's api.url; default: the
	// listen address, or, when that is every interface, the address that reaches the store.
	Advertise string
	// TLS, when set, serves the API over TLS (see EnsureCerts and ServerTLS).
	TLS *tls.Config
	// ID names the master in the election (default host@listen address).
	ID string
	// DataDir receives admin.token at the cluster's first start, and api.url (the URL the
	// API is served at, which the CLI reads when no --master is given).
	DataDir string
	// SinkDir is where file sinks must lie (master.Config.SinkDir); "" turns them off.
	SinkDir string
	// RouterStore is the store URL the master's output routers open (default: Store when it
	// is ZooKeeper).
	RouterStore string
	// ReregisterGrace: see master.Config.
	ReregisterGrace time.Duration
	// AvoidPeriod and AvoidMax: how long a node is avoided for a job after its first crash
	// loop there, and the cap of its doubling (see master.Config).
	AvoidPeriod, AvoidMax time.Duration
	// RegistryAuth is Docker's config.json with the credentials the master resolves image
	// tags to digests with; "" resolves anonymously.
	RegistryAuth string
	// Events bounds and paces the cluster's events (see eventlog.Config).
	Events eventlog.Config
	// Metrics shapes the collection and history of the jobs' metrics (jobmetrics.Config).
	Metrics jobmetrics.Config
	// TenantUIDs is the range tenants' uids are given from; zero: the default.
	TenantUIDs cluster.UIDRange
	Logger     *slog.Logger
}

// Master is a built master: its store client, its scheduler and its HTTP server.
type Master struct {
	cfg       MasterConfig
	ln        net.Listener
	store     coord.Store
	ownStore  bool
	sched     *master.Master
	registry  *prometheus.Registry
	srv       *http.Server
	tokenPath string
	// metricsPath is the scrape token's file (see EnsureMetricsToken).
	metricsPath string
}

// NewMaster listens on the API address, opens the store, makes the admin token on the
// cluster's first start and builds the scheduler. Nothing runs until Run.
func NewMaster(ctx context.Context, cfg MasterConfig) (m *Master, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m = &Master{cfg: cfg}
	built := m // a failing return sets the named result to nil before this runs
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	if m.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another master running? pick --api)", cfg.Listen, err)
	}
	if m.cfg.Advertise == "" {
		if m.cfg.Advertise, err = advertisedAddr(m.ln, cfg.Store); err != nil {
			return nil, err
		}
	}
	if m.cfg.ID == "" {
		host, _ := os.Hostname()
		m.cfg.ID = host + "@" + m.ln.Addr().String()
	}
	m.store = cfg.OpenedStore
	if m.store == nil {
		opts := cfg.StoreOptions
		opts.Logger = cfg.Logger
		if m.store, err = coord.Open(ctx, cfg.Store, opts); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		m.ownStore = true
	}
	if cfg.DataDir != "" {
		if m.tokenPath, err = EnsureAdminToken(ctx, m.store, cfg.DataDir); err != nil {
			return nil, err
		}
		if m.metricsPath, err = EnsureMetricsToken(ctx, m.store, cfg.DataDir); err != nil {
			return nil, err
		}
		if err := pki.WriteFiles(map[string][]byte{filepath.Join(cfg.DataDir, api.URLFile): []byte(m.URL() + "\n")}, 0o644); err != nil {
			return nil, err
		}
	}
	m.registry = NewRegistry()
	routerStore := cfg.RouterStore
	if t, perr := coord.ParseURL(cfg.Store); routerStore == "" && perr == nil && t.Scheme == "zk" {
		// An embedded store is held by one process: routers then keep no checkpoint
		// (the scheduler's default) and recover from their sink alone. Routers get the
		// store's credentials from their agent, in a file: the URL goes on their command
		// line.
		if routerStore, _, err = PlainStoreURL(cfg.Store); err != nil {
			return nil, err
		}
	}
	res := &images.Resolver{}
	if cfg.RegistryAuth != "" {
		if res.Auth, err = images.LoadAuth(cfg.RegistryAuth); err != nil {
			return nil, err
		}
	}
	m.sched, err = master.New(m.store, master.Config{ID: m.cfg.ID, API: m.URL(), RouterStore: routerStore, SinkDir: cfg.SinkDir,
		ReregisterGrace: cfg.ReregisterGrace, AvoidPeriod: cfg.AvoidPeriod, AvoidMax: cfg.AvoidMax, Resolver: res, Events: cfg.Events, Metrics: cfg.Metrics, TenantUIDs: cfg.TenantUIDs, Logger: cfg.Logger, Registry: m.registry})
	if err != nil {
		return nil, err
	}
	m.srv = api.NewServer(httpapi.New(m.sched, httpapi.Config{Gatherer: m.registry}))
	// The server's own complaints (TLS handshakes that fail, connections cut by the
	// limits) go to the master's log.
	m.srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	return m, nil
}

// NewRegistry is a process's metrics registry, with the Go runtime's and the process's own.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// URL is where the API is served: https:// when it is served over TLS.
func (m *Master) URL() string {
	if m.cfg.TLS != nil {
		return "https://" + m.cfg.Advertise
	}
	return "http://" + m.cfg.Advertise
}

// TokenPath is the admin token's file, or "" when another master (or data directory) made it.
func (m *Master) TokenPath() string { return m.tokenPath }

// MetricsTokenPath is the scrape token's file, or "" when another master (or data
// directory) made it.
func (m *Master) MetricsTokenPath() string { return m.metricsPath }

// Registry holds the master's metrics, served at URL()/metrics to the scrape token or the
// admin token.
func (m *Master) Registry() *prometheus.Registry { return m.registry }

// Scheduler is the master's scheduler.
func (m *Master) Scheduler() *master.Master { return m.sched }

// Run serves the API and runs the scheduler until ctx is done, then shuts the server down.
func (m *Master) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	ln := m.ln
	if m.cfg.TLS != nil {
		ln = tls.NewListener(ln, m.cfg.TLS)
	}
	go func() { errc <- m.srv.Serve(ln) }()
	m.cfg.Logger.Info("master API listening", "url", m.URL(), "metrics", m.URL()+"/metrics", "id", m.cfg.ID)
	runErr := m.sched.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}

// Close releases the listener and the store client the master opened.
func (m *Master) Close() {
	if m.ln != nil {
		m.ln.Close()
	}
	if m.ownStore && m.store != nil {
		m.store.Close()
	}
}
