package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// principal is who makes an API call: the admin, or one tenant.
type principal struct {
	admin bool
	// scrape is the scrape token's holder: it reads /metrics (roleScrape) and nothing else.
	scrape bool
	tenant string
}

type principalKey struct{}

func principalOf(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// role is what a route requires.
type role int

const (
	roleNone   role = iota // no token needed
	roleTenant             // any valid token; handlers scope tenants to their own jobs
	roleAdmin              // the admin token
	roleScrape             // the scrape token or the admin token: /metrics alone
)

// authenticate finds who holds the request's bearer token. With fresh false it looks at the
// admin token and the tenants' mirror only, not at the tenants in the store.
func (a *API) authenticate(r *http.Request, fresh bool) (principal, error) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || token == "" {
		return principal{}, fmt.Errorf("%w: missing API token: pass --token or set STORMDOCK_TOKEN (the admin token is in the master's data directory, admin.token)", api.ErrUnauthorized)
	}
	hash := api.HashToken(strings.TrimSpace(token))
	// The admin token's hash and the tenants' records as this master's watches have them:
	// no store read for a valid token.
	admin, watched := a.m.AdminTokenHash()
	if watched && len(admin) > 0 && subtle.ConstantTimeCompare(admin, []byte(hash)) == 1 {
		return principal{admin: true}, nil
	}
	match := func(name string, value []byte) bool {
		var t cluster.TenantRecord
		return json.Unmarshal(value, &t) == nil && t.TokenHash != "" && subtle.ConstantTimeCompare([]byte(t.TokenHash), []byte(hash)) == 1
	}
	for name, e := range a.m.TenantEntries() {
		if match(name, e.Value) {
			return principal{tenant: name}, nil
		}
	}
	if !fresh {
		return principal{}, fmt.Errorf("%w: invalid API token", api.ErrUnauthorized)
	}
	// The watches may not have it yet: an admin token just written (a provisioned
	// cluster's, or this master's first), or a tenant's made a moment ago (through another
	// master, or just now through this one), is in the store.
	if e, err := a.store.Get(r.Context(), cluster.AdminTokenKey); err == nil && subtle.ConstantTimeCompare(e.Value, []byte(hash)) == 1 {
		return principal{admin: true}, nil
	}
	names, err := a.store.Children(r.Context(), cluster.TenantsKey)
	if err != nil {
		return principal{}, fmt.Errorf("%w: read tenants: %v", api.ErrUnavailable, err)
	}
	for _, name := range names {
		key, err := cluster.TenantKey(name)
		if err != nil {
			continue // not a tenant's record
		}
		if e, err := a.store.Get(r.Context(), key); err == nil && match(name, e.Value) {
			return principal{tenant: name}, nil
		}
	}
	return principal{}, fmt.Errorf("%w: invalid API token: ask an admin for a tenant token (`stormdock tenant token NAME`)", api.ErrUnauthorized)
}

// guard wraps a handler with authentication for the role it needs.
func (a *API) guard(need role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if need == roleNone {
			h(w, r)
			return
		}
		// Tokens and everything else live in the store: say so at once rather than hang.
		// Not for /metrics, which checks its tokens against their last known hashes then.
		if msg := a.m.StoreUnavailable(); msg != "" && need != roleScrape {
			fail(w, api.ErrUnavailable, "%s", msg)
			return
		}
		// An address that used up its failures still gets its valid tokens checked, against
		// what the master holds (clients behind one address are not locked out by one of
		// them), but its guesses cost no store reads and no log lines: they get 429.
		host := api.RemoteHost(r)
		limited, wait := a.authFails.Blocked(host)
		authenticate := a.authenticate
		if need == roleScrape {
			authenticate = a.authenticateScrape
		}
		p, err := authenticate(r, !limited)
		if limited && err != nil {
			a.metrics.authFailures.WithLabelValues("limited").Inc()
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
			fail(w, api.ErrRateLimited, "too many failed token checks from %s: try again in %s", host, wait.Round(100*time.Millisecond))
			return
		}
		if errors.Is(err, api.ErrUnauthorized) {
			reason := "invalid"
			if r.Header.Get("Authorization") == "" {
				reason = "missing"
			}
			a.authFails.Fail(host)
			a.metrics.authFailures.WithLabelValues(reason).Inc()
			a.log.Warn("API token refused", "remote", r.RemoteAddr, "reason", reason, "method", r.Method, "path", clipPath(r.URL.Path))
		}
		if err != nil {
			failErr(w, err)
			return
		}
		notePrincipal(r, p)
		if p.scrape && need != roleScrape {
			// Not reached (only /metrics authenticates the scrape token): kept so that a
			// route added wrongly refuses it rather than lets it through as a tenant "".
			fail(w, api.ErrUnauthorized, "the scrape token reads /metrics only; use an API token (--token or STORMDOCK_TOKEN)")
			return
		}
		if need == roleScrape && !p.admin && !p.scrape {
			fail(w, api.ErrForbidden, "this needs the scrape token or the admin token; tenant %s's token cannot read /metrics (the figures name every tenant's jobs)", p.tenant)
			return
		}
		if need == roleAdmin && !p.admin {
			fail(w, api.ErrForbidden, "this needs the admin token; tenant %s's token cannot do it", p.tenant)
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}
}

// mayUse checks that the caller may act on the tenant's jobs.
func mayUse(p principal, tenant string) error {
	if p.admin || p.tenant == tenant {
		return nil
	}
	return fmt.Errorf("%w: the token of tenant %s cannot act on tenant %s's jobs", api.ErrForbidden, p.tenant, tenant)
}
