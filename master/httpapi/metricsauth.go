package httpapi

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// scrapeHelp ends every 401 of /metrics: the job and tenant names in the
// figures are for the operator's scraper, not for whoever reaches the port.
const scrapeHelp = "/metrics needs the scrape token (metrics.token in the first master's data directory) or the admin token: send `Authorization: Bearer TOKEN` (Prometheus: authorization.credentials_file)"

// scrapeHashes remembers the scrape and admin tokens' hashes last read from the store, so
// that /metrics keeps answering Prometheus while the store is out (the figures of an outage
// matter most then). Neither token is replaced while a cluster runs.
type scrapeHashes struct {
	mu            sync.Mutex
	scrape, admin []byte
	read          bool // the store was read once
}

// hashes returns the tokens' hashes: read from the store when it answers and fresh is set
// (or nothing was read yet), else the last ones read.
func (c *scrapeHashes) hashes(a *API, r *http.Request, storeUp, fresh bool) (scrape, admin []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if storeUp && (fresh || !c.read) {
		// A failed read leaves the last hashes in force.
		read := func(key string, into *[]byte) bool {
			e, err := a.store.Get(r.Context(), key)
			switch {
			case err == nil:
				*into = e.Value
			case errors.Is(err, coord.ErrNotFound):
				*into = nil
			default:
				return false
			}
			return true
		}
		okScrape := read(cluster.MetricsTokenKey, &c.scrape)
		okAdmin := read(cluster.AdminTokenKey, &c.admin)
		c.read = c.read || (okScrape && okAdmin)
	}
	return c.scrape, c.admin
}

// authenticateScrape finds who holds the request's token for /metrics: the scrape token
// (principal.scrape), the admin, or a tenant (whom guard then refuses with 403). Only this
// route calls it, so no other route takes the scrape token.
func (a *API) authenticateScrape(r *http.Request, fresh bool) (principal, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token = strings.TrimSpace(token)
	if !ok || token == "" {
		return principal{}, fmt.Errorf("%w: missing token: %s", api.ErrUnauthorized, scrapeHelp)
	}
	hash := []byte(api.HashToken(token))
	storeUp := a.m.StoreUnavailable() == ""
	// An address that used up its failures (fresh false) costs no store reads.
	scrape, admin := a.scrapeHashes.hashes(a, r, storeUp, fresh)
	// Both compared, whichever matches: the time taken says nothing of which one it was.
	isScrape := len(scrape) > 0 && subtle.ConstantTimeCompare(scrape, hash) == 1
	isAdmin := len(admin) > 0 && subtle.ConstantTimeCompare(admin, hash) == 1
	switch {
	case isScrape:
		return principal{scrape: true}, nil
	case isAdmin:
		return principal{admin: true}, nil
	case !storeUp:
		return principal{}, fmt.Errorf("%w: invalid token (the store is out, so only the scrape and admin tokens are checked): %s", api.ErrUnauthorized, scrapeHelp)
	}
	// A tenant's token is told apart from a wrong one: it gets 403, not 401.
	p, err := a.authenticate(r, fresh)
	if errors.Is(err, api.ErrUnauthorized) {
		return principal{}, fmt.Errorf("%w: invalid token: %s", api.ErrUnauthorized, scrapeHelp)
	}
	return p, err
}
