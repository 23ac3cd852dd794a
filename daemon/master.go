package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/await"
	"github.com/stormdock/stormdock/internal/keyring"
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
	// SecretsKey is the keyring file tenant secrets are sealed with (internal/keyring),
	// the same on every master; "" turns secrets off.
	SecretsKey string
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
	handler   swapHandler
	served    chan error // the server's end, once it was started
	tokenPath string
	// metricsPath is the scrape token's file (see EnsureMetricsToken).
	metricsPath string
}

// NewMaster listens on the API address, opens the store, makes the admin token on the
// cluster's first start and builds the scheduler. While the store is away (unreachable, no
// quorum) it waits for it until ctx ends, its API answering that it waits; the scheduler
// runs from Run.
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
	m.registry = NewRegistry()
	storeWaiting := await.StoreWaiting(m.registry)
	// The API answers from now on: while the store is away, /v1/health says the master
	// waits for it (503) and every other route that it cannot serve yet.
	var waitingOn atomic.Pointer[string]
	m.handler.set(waitingHandler(m.cfg.ID, &waitingOn))
	m.srv = api.NewServer(&m.handler)
	m.srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	m.serve()
	// A master started while the store is unreachable or without quorum waits for it
	// (saying so, with stormdock_store_waiting at 1) instead of exiting.
	dep := await.Dep{Name: "the store", Log: cfg.Logger, Waiting: storeWaiting, OnWait: func(err error) {
		msg := "the store: " + err.Error()
		waitingOn.Store(&msg)
	}}
	m.store = cfg.OpenedStore
	if m.store == nil {
		opts := cfg.StoreOptions
		opts.Logger = cfg.Logger
		if m.store, err = dep.OpenStore(ctx, cfg.Store, opts); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		m.ownStore = true
	}
	if cfg.DataDir != "" {
		if err := dep.Do(ctx, "read or make the admin token", func(ctx context.Context) (err error) {
			m.tokenPath, err = EnsureAdminToken(ctx, m.store, cfg.DataDir)
			return err
		}); err != nil {
			return nil, err
		}
		if err := dep.Do(ctx, "read or make the scrape token", func(ctx context.Context) (err error) {
			m.metricsPath, err = EnsureMetricsToken(ctx, m.store, cfg.DataDir)
			return err
		}); err != nil {
			return nil, err
		}
		if err := pki.WriteFiles(map[string][]byte{filepath.Join(cfg.DataDir, api.URLFile): []byte(m.URL() + "\n")}, 0o644); err != nil {
			return nil, err
		}
	}
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
	var ring *keyring.File
	if cfg.SecretsKey != "" {
		if ring, err = keyring.Open(cfg.SecretsKey); err != nil {
			return nil, err
		}
	}
	m.sched, err = master.New(m.store, master.Config{ID: m.cfg.ID, API: m.URL(), RouterStore: routerStore, SinkDir: cfg.SinkDir,
		ReregisterGrace: cfg.ReregisterGrace, AvoidPeriod: cfg.AvoidPeriod, AvoidMax: cfg.AvoidMax, Resolver: res, Events: cfg.Events, Metrics: cfg.Metrics, TenantUIDs: cfg.TenantUIDs, Logger: cfg.Logger, Registry: m.registry,
		Keyring: ring, APICertSHA256: certSHA256(cfg.TLS), StoreWaiting: storeWaiting})
	if err != nil {
		return nil, err
	}
	m.handler.set(httpapi.New(m.sched, httpapi.Config{Gatherer: m.registry}))
	return m, nil
}

// serve starts the API server on the listener; its end goes to m.served.
func (m *Master) serve() {
	ln := m.ln
	if m.cfg.TLS != nil {
		ln = tls.NewListener(ln, m.cfg.TLS)
	}
	m.served = make(chan error, 1)
	srv := m.srv
	go func() { m.served <- srv.Serve(ln) }()
}

// swapHandler serves the waiting answers until the API is built, then the API.
type swapHandler struct{ h atomic.Pointer[http.Handler] }

func (s *swapHandler) set(h http.Handler) { s.h.Store(&h) }

func (s *swapHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// waitingHandler answers while the master waits for its store: /v1/health says so (503),
// every other route is unavailable.
func waitingHandler(id string, on *atomic.Pointer[string]) http.Handler {
	what := func() string {
		if p := on.Load(); p != nil {
			return *p
		}
		return "the store"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusServiceUnavailable, api.Health{ID: id, Waiting: what()})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		api.WriteError(w, fmt.Errorf("%w: the master is starting and waits for %s", api.ErrUnavailable, what()))
	})
	return mux
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
	m.cfg.Logger.Info("master API listening", "url", m.URL(), "metrics", m.URL()+"/metrics", "id", m.cfg.ID)
	runErr := m.sched.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(sctx)
	err := <-m.served
	m.served = nil
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}

// Close releases the listener, the API server when Run did not end it, and the store client
// the master opened.
func (m *Master) Close() {
	if m.served != nil {
		_ = m.srv.Close()
		<-m.served
		m.served = nil
	}
	if m.ln != nil {
		m.ln.Close()
	}
	if m.ownStore && m.store != nil {
		m.store.Close()
	}
}

// certSHA256 is the SHA-256 (hex) of the certificate conf serves, "" without TLS: the
// master advertises it so that agents trust that certificate alone (cluster.MasterInfo).
func certSHA256(conf *tls.Config) string {
	if conf == nil || len(conf.Certificates) == 0 || len(conf.Certificates[0].Certificate) == 0 {
		return ""
	}
	sum := sha256.Sum256(conf.Certificates[0].Certificate[0])
	return hex.EncodeToString(sum[:])
}
