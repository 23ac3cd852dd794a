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
	path := filepath.Join(dataDir, api.AdminTokenFile)
	e, err := s.Get(ctx, cluster.AdminTokenKey)
	if err == nil {
		b, ferr := os.ReadFile(path)
		if ferr == nil && api.HashToken(strings.TrimSpace(string(b))) == string(e.Value) {
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
	token := api.NewToken()
	// The file first: a token whose hash is stored but that nobody holds would lock
	// everyone out. A temporary file of its own: masters sharing a data directory may start
	// at the same moment, and only the one whose hash the store takes renames its file.
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	defer f.Cleanup()
	if _, err := f.Write([]byte(token + "\n")); err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	if _, err := s.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		if errors.Is(err, coord.ErrExists) {
			return "", nil // another master made it at the same moment
		}
		return "", fmt.Errorf("store admin token: %w", err)
	}
	if err := f.Commit(); err != nil {
		return "", fmt.Errorf("write admin token: %w", err)
	}
	return path, nil
}
