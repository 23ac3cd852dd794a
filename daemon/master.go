package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/scheduler"
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
	// ID names the master in the election (default host@listen address).
	ID string
	// DataDir receives admin.token at the cluster's first start.
	DataDir string
	// RouterStore is the store URL the master's output routers open (default: Store when it
	// is ZooKeeper).
	RouterStore string
	// ReregisterGrace: see scheduler.Config.
	ReregisterGrace time.Duration
	Logger          *slog.Logger
}

// Master is a built master: its store client, its scheduler and its HTTP server.
type Master struct {
	cfg       MasterConfig
	ln        net.Listener
	store     coord.Store
	ownStore  bool
	sched     *scheduler.Master
	registry  *prometheus.Registry
	srv       *http.Server
	tokenPath string
}

// NewMaster listens on the API address, opens the store, makes the admin token on the
// cluster's first start and builds the scheduler. Nothing runs until Run.
func NewMaster(ctx context.Context, cfg MasterConfig) (m *Master, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m = &Master{cfg: cfg}
	// Not m itself: a failed return sets the result to nil before this runs.
	built := m
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	if m.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("listen on %s: %w (is another master running? pick --api)", cfg.Listen, err)
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
	}
	m.registry = NewRegistry()
	routerStore := cfg.RouterStore
	if routerStore == "" && strings.HasPrefix(cfg.Store, "zk://") {
		// An embedded store is held by one process: routers then keep no checkpoint
		// (the scheduler's default) and recover from their sink alone.
		routerStore = cfg.Store
	}
	m.sched, err = scheduler.New(m.store, scheduler.Config{ID: m.cfg.ID, API: m.URL(), RouterStore: routerStore,
		ReregisterGrace: cfg.ReregisterGrace, Logger: cfg.Logger, Registry: m.registry})
	if err != nil {
		return nil, err
	}
	m.srv = NewHTTPServer(m.sched.Handler(m.registry))
	return m, nil
}

// NewRegistry is a process's metrics registry, with the Go runtime's and the process's own.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// NewHTTPServer is every stormdock HTTP server's shape: bounded header reads, so a client
// that sends its headers slowly cannot hold a connection.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
}

// URL is where the API is served.
func (m *Master) URL() string { return "http://" + m.ln.Addr().String() }

// TokenPath is the admin token's file, or "" when another master (or data directory) made it.
func (m *Master) TokenPath() string { return m.tokenPath }

// Registry holds the master's metrics, served at URL()/metrics.
func (m *Master) Registry() *prometheus.Registry { return m.registry }

// Scheduler is the master's scheduler.
func (m *Master) Scheduler() *scheduler.Master { return m.sched }

// Run serves the API and runs the scheduler until ctx is done, then shuts the server down.
func (m *Master) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- m.srv.Serve(m.ln) }()
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
