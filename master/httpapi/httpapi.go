// Package httpapi is the master's HTTP API: every route, authentication and the guards
// around each call, the console's cluster map and its watch streams, and the workers' logs
// relayed from their agents. It reads a master's published snapshot and writes through
// the store commands (package master/desired), and holds no state of the leader's.
package httpapi

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/agentclient"
)

// Config tunes the API.
type Config struct {
	// Registry is where the API's metrics are registered; nil registers them on the
	// master's registry (master.Config.Registry), where there is one.
	Registry prometheus.Registerer
	// Gatherer, when not nil, is served at /metrics, to the scrape token
	// (cluster.MetricsTokenKey) or the admin token.
	Gatherer prometheus.Gatherer
	// WatchReauth is how often a watch stream checks that its token is still valid: a
	// tenant whose token was replaced stops seeing the map within this long. Default 10s.
	WatchReauth time.Duration
}

func (c *Config) defaults() {
	if c.WatchReauth <= 0 {
		c.WatchReauth = 10 * time.Second
	}
}

// API serves one master's HTTP API.
type API struct {
	m     *master.Master
	cfg   Config
	store coord.Store
	log   *slog.Logger
	mux   *http.ServeMux
	// routes are the patterns of the API's routes, so that tests can probe every one.
	routes []string
	// authFails counts failed API token checks per remote address (see guard).
	authFails *api.FailLimiter
	// logKey signs this master's requests for workers' logs to agents (logs.go).
	logKey  *agentclient.Client
	metrics *metrics
	// scrapeHashes are the tokens /metrics answers to (metricsauth.go).
	scrapeHashes scrapeHashes
	// block holds the reads' indexes and their waiters (blocking.go).
	block *blockHub
	stops shutdowns
}

// ServeHTTP serves one request of the API or the console.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Routes are the patterns of the API's routes, as given to http.ServeMux.
func (a *API) Routes() []string { return a.routes }
