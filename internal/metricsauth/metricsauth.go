// Package metricsauth guards the /metrics of agents and output routers with the cluster's
// scrape token (or its admin token), as the master guards its own: their figures carry job
// names in labels (worker restarts, OOM kills and evictions by job; every router series by
// job), which are for the operator's Prometheus, not for whoever reaches the port. Both hold
// a store client, so the tokens are checked against the hashes the masters keep there
// (cluster.MetricsTokenKey, cluster.AdminTokenKey): nothing to hand out to every node.
package metricsauth

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Help ends every refusal: what /metrics wants and where to find it.
const Help = "/metrics needs the scrape token (metrics.token in the first master's data directory) or the admin token: send `Authorization: Bearer TOKEN` (Prometheus: authorization.credentials_file)"

// adminHelp ends the refusals of Admin's routes.
const adminHelp = "this needs the admin token (admin.token in the first master's data directory): send `Authorization: Bearer TOKEN`"

// recheck is how long a token that matched is taken without reading the store again: a
// scrape every few seconds costs no store reads, and a token replaced in the store stops
// working within this long.
const recheck = 30 * time.Second

// readTimeout bounds the store reads of one request: a store that does not answer leaves
// the last hashes read in force rather than hanging the scrape.
const readTimeout = 2 * time.Second

// Guard checks the bearer token of requests for /metrics. Safe for concurrent use.
type Guard struct {
	kv    coord.KV
	log   *slog.Logger
	fails *api.FailLimiter

	mu            sync.Mutex
	scrape, admin []byte // the hashes last read; nil: none read, or none stored
	read          time.Time
}

// New returns a guard that reads the tokens' hashes from kv.
func New(kv coord.KV, log *slog.Logger) *Guard {
	if log == nil {
		log = slog.Default()
	}
	return &Guard{kv: kv, log: log, fails: api.NewFailLimiter()}
}

// match reports whether hash is the admin token's or, unless adminOnly, the scrape token's,
// reading the store again when the last read is older than recheck or the hash matched
// nothing.
func (g *Guard) match(ctx context.Context, hash []byte, adminOnly bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	eq := func() bool { return g.known(hash, adminOnly) }
	if time.Since(g.read) < recheck && eq() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	read := func(key string, into *[]byte) bool {
		e, err := g.kv.Get(ctx, key)
		switch {
		case err == nil:
			*into = e.Value
		case errors.Is(err, coord.ErrNotFound):
			*into = nil
		default:
			g.log.Warn("metrics: cannot read a token's hash; the last one read stays in force", "key", key, "err", err)
			return false
		}
		return true
	}
	if read(cluster.MetricsTokenKey, &g.scrape) && read(cluster.AdminTokenKey, &g.admin) {
		g.read = time.Now()
	}
	return eq()
}

// known compares hash with the hashes last read; g.mu is held.
func (g *Guard) known(hash []byte, adminOnly bool) bool {
	// Both compared, whichever matches: the time taken says nothing of which one.
	s := len(g.scrape) > 0 && subtle.ConstantTimeCompare(g.scrape, hash) == 1
	a := len(g.admin) > 0 && subtle.ConstantTimeCompare(g.admin, hash) == 1
	return a || s && !adminOnly
}

// Wrap serves h to requests that carry the scrape token or the admin token. Others get 401
// (429 once their address failed too often) with a one-line error that names nothing of the
// cluster's.
func (g *Guard) Wrap(h http.Handler) http.Handler { return g.wrap(h, false) }

// Admin serves h to requests that carry the admin token alone: the process's profiles
// (package internal/profiling), which show its memory, are not for the scrape token.
func (g *Guard) Admin(h http.Handler) http.Handler { return g.wrap(h, true) }

func (g *Guard) wrap(h http.Handler, adminOnly bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := api.RemoteHost(r)
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		token = strings.TrimSpace(token)
		if limited, wait := g.fails.Blocked(host); limited {
			// The guesses of an address that used up its failures cost no store reads; a
			// valid token still gets through (other scrapers behind the same address).
			g.mu.Lock()
			known := token != "" && g.known([]byte(api.HashToken(token)), adminOnly)
			g.mu.Unlock()
			if !known {
				w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
				api.Errorf(w, api.ErrRateLimited, "too many failed token checks from "+host+": try again in "+wait.Round(100*time.Millisecond).String())
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		msg := ""
		switch {
		case (!ok || token == "") && adminOnly:
			msg = "missing token: " + adminHelp
		case !ok || token == "":
			msg = "missing token: " + Help
		case adminOnly && !g.match(r.Context(), []byte(api.HashToken(token)), true):
			msg = "invalid token: " + adminHelp
		case !adminOnly && !g.match(r.Context(), []byte(api.HashToken(token)), false):
			msg = "invalid token (a tenant's token does not read metrics): " + Help
		}
		if msg != "" {
			g.fails.Fail(host)
			g.log.Warn("metrics token refused", "remote", r.RemoteAddr)
			api.Errorf(w, api.ErrUnauthorized, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}
