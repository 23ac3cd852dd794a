package scheduler

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// AdminTokenKey holds the hash of the admin token; the token itself is only in the file
// of the master that made it.
const AdminTokenKey = "/master/admin"

// AdminTokenFile is the name of the admin token's file in a master's data directory.
const AdminTokenFile = "admin.token"

// NewToken returns a fresh random API token.
func NewToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "sdt_" + base64.RawURLEncoding.EncodeToString(b)
}

// HashToken is what the store keeps of a token.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// EnsureAdminToken makes the cluster's admin token on first start: it stores its hash and
// writes the token to dataDir/admin.token with mode 0600. It returns the file's path, or ""
// when the token was made by a master with another data directory.
func EnsureAdminToken(ctx context.Context, s coord.KV, dataDir string) (string, error) {
	path := filepath.Join(dataDir, AdminTokenFile)
	e, err := s.Get(ctx, AdminTokenKey)
	if err == nil {
		b, ferr := os.ReadFile(path)
		if ferr == nil && HashToken(strings.TrimSpace(string(b))) == string(e.Value) {
			return path, nil
		}
		return "", nil
	}
	if !errors.Is(err, coord.ErrNotFound) {
		return "", fmt.Errorf("read admin token: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("make data directory: %w", err)
	}
	token := NewToken()
	// The file first: a token whose hash is stored but that nobody holds would lock
	// everyone out.
	if err := os.WriteFile(path+".tmp", []byte(token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	if _, err := s.Create(ctx, AdminTokenKey, []byte(HashToken(token)), coord.Persistent); err != nil {
		os.Remove(path + ".tmp")
		if errors.Is(err, coord.ErrExists) {
			return "", nil // another master made it at the same moment
		}
		return "", fmt.Errorf("store admin token: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	return path, nil
}

// principal is who makes an API call: the admin, or one tenant.
type principal struct {
	admin  bool
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
)

// authenticate finds who holds the request's bearer token.
func (m *Master) authenticate(r *http.Request) (principal, int, string) {
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || token == "" {
		return principal{}, http.StatusUnauthorized, "missing API token: pass --token or set STORMDOCK_TOKEN (the admin token is in the master's data directory, admin.token)"
	}
	hash := HashToken(strings.TrimSpace(token))
	if e, err := m.store.Get(r.Context(), AdminTokenKey); err == nil && subtle.ConstantTimeCompare(e.Value, []byte(hash)) == 1 {
		return principal{admin: true}, 0, ""
	}
	for name, e := range m.tenants.snapshot() {
		var t cluster.TenantRecord
		if json.Unmarshal(e.Value, &t) == nil && t.TokenHash != "" && subtle.ConstantTimeCompare([]byte(t.TokenHash), []byte(hash)) == 1 {
			return principal{tenant: name}, 0, ""
		}
	}
	return principal{}, http.StatusUnauthorized, "invalid API token: ask an admin for a tenant token (`stormdock tenant token NAME`)"
}

// guard wraps a handler with authentication for the role it needs.
func (m *Master) guard(need role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if need == roleNone {
			h(w, r)
			return
		}
		p, status, msg := m.authenticate(r)
		if status != 0 {
			fail(w, status, "%s", msg)
			return
		}
		if need == roleAdmin && !p.admin {
			fail(w, http.StatusForbidden, "this needs the admin token; tenant %s's token cannot do it", p.tenant)
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
	return fmt.Errorf("%w: the token of tenant %s cannot act on tenant %s's jobs", ErrForbidden, p.tenant, tenant)
}

// SetTenantToken makes a new token for a tenant, replacing the old one, and returns it.
func SetTenantToken(ctx context.Context, s coord.KV, name string) (string, error) {
	var token string
	_, err := coord.Update(ctx, s, cluster.TenantKey(name), func(cur []byte, exists bool) ([]byte, error) {
		t, err := decodeTenant(name, cur, exists)
		if err != nil {
			return nil, err
		}
		token = NewToken()
		t.TokenHash = HashToken(token)
		return json.Marshal(t)
	})
	if err != nil {
		return "", busy(err, "tenant "+name)
	}
	return token, nil
}
