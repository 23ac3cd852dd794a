package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/atomicfile"
)

// EnsureAdminToken makes the cluster's admin token on first start: it stores its hash and
// writes the token to dataDir/admin.token with mode 0600. It returns the file's path, or ""
// when the token was made by a master with another data directory.
func EnsureAdminToken(ctx context.Context, s coord.KV, dataDir string) (string, error) {
	return ensureToken(ctx, s, dataDir, cluster.AdminTokenKey, api.AdminTokenFile, "admin token")
}

// EnsureMetricsToken makes the cluster's scrape token on first start, as EnsureAdminToken
// the admin token: its hash at cluster.MetricsTokenKey, the token in dataDir/metrics.token
// (0600). /metrics answers to it (or to the admin token) and nothing else does: Prometheus
// reads it from the file and holds no key to anything but the figures.
func EnsureMetricsToken(ctx context.Context, s coord.KV, dataDir string) (string, error) {
	return ensureToken(ctx, s, dataDir, cluster.MetricsTokenKey, api.MetricsTokenFile, "scrape token")
}

func ensureToken(ctx context.Context, s coord.KV, dataDir, key, file, what string) (string, error) {
	path := filepath.Join(dataDir, file)
	e, err := s.Get(ctx, key)
	if err == nil {
		b, ferr := os.ReadFile(path)
		if ferr == nil && api.HashToken(strings.TrimSpace(string(b))) == string(e.Value) {
			return path, nil
		}
		return "", nil
	}
	if !errors.Is(err, coord.ErrNotFound) {
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("make data directory: %w", err)
	}
	token := api.NewToken()
	// The file first: a token whose hash is stored but that nobody holds would lock
	// everyone out. A temporary file of its own: masters sharing a data directory may start
	// at the same moment, and only the one whose hash the store takes renames its file.
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return "", fmt.Errorf("write %s: %w", what, err)
	}
	defer f.Cleanup()
	if _, err := f.Write([]byte(token + "\n")); err != nil {
		return "", fmt.Errorf("write %s: %w", what, err)
	}
	if _, err := s.Create(ctx, key, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		if errors.Is(err, coord.ErrExists) {
			return "", nil // another master made it at the same moment
		}
		return "", fmt.Errorf("store %s: %w", what, err)
	}
	if err := f.Commit(); err != nil {
		return "", fmt.Errorf("write %s: %w", what, err)
	}
	return path, nil
}

// ScrapeHint says how to read url/metrics with the scrape token at tokenPath (a curl
// command line), for startup messages; caFile, when not "", is the API's CA.
func ScrapeHint(url, tokenPath, caFile string) string {
	if tokenPath == "" {
		return "needs the scrape token (metrics.token in the first master's data directory) or the admin token"
	}
	ca := ""
	if caFile != "" {
		ca = " --cacert " + caFile
	}
	return fmt.Sprintf(`curl%s -H "Authorization: Bearer $(cat %s)" %s/metrics`, ca, tokenPath, url)
}
