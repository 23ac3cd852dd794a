package provision

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/atomicfile"
	"github.com/stormdock/stormdock/internal/pki"
)

// Tokens keeps the admin tokens of the clusters this operator created, one file per
// cluster: Dir/NAME/admin.token, mode 0600, and beside it the scrape token
// (metrics.token, for /metrics alone). They are the only things kept on the operator's
// machine: the CLI makes them before the master starts and stores their hashes at
// cluster.AdminTokenKey and cluster.MetricsTokenKey, so the master (which finds the hashes
// there) never writes tokens of its own, and nothing secret goes into container labels or
// job specs.
type Tokens struct {
	Dir string
}

// DefaultTokenDir is $STORMDOCK_DATA/clusters, or ~/.stormdock/clusters.
func DefaultTokenDir() string {
	base := os.Getenv("STORMDOCK_DATA")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "."
		}
		base = filepath.Join(home, ".stormdock")
	}
	return filepath.Join(base, "clusters")
}

// ClusterDir is the directory of cluster name's files (its admin token, CA and store
// credentials). A name CheckName refuses is refused here too, so that no name reaches a
// path outside Dir.
func (t Tokens) ClusterDir(name string) (string, error) {
	if err := CheckName(name); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadSpec, err)
	}
	return filepath.Join(t.Dir, name), nil
}

// Path is the token file of cluster name.
func (t Tokens) Path(name string) (string, error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, api.AdminTokenFile), nil
}

// Read returns cluster name's admin token.
func (t Tokens) Read(name string) (string, error) {
	path, err := t.Path(name)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read admin token of cluster %s: %w (pass --token if another machine created it)", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Install gives cluster name an admin token before its master starts: it writes the token
// file and stores the hash in the cluster's store. If the store already holds a hash, the
// token file must match it (the same cluster created again over its old state); otherwise
// the chroot belongs to someone else and Install refuses. undo reverses what Install did.
func (t Tokens) Install(ctx context.Context, kv coord.KV, name string) (token string, undo func(context.Context), err error) {
	noop := func(context.Context) {}
	e, err := kv.Get(ctx, cluster.AdminTokenKey)
	switch {
	case err == nil:
		if tok, rerr := t.Read(name); rerr == nil && api.HashToken(tok) == string(e.Value) {
			return tok, noop, nil
		}
		return "", nil, fmt.Errorf("%w: the store already holds another cluster's admin token: give the cluster a fresh chroot, or delete the old state (zkCli.sh deleteall /CHROOT)", ErrExists)
	case !errors.Is(err, coord.ErrNotFound):
		return "", nil, fmt.Errorf("read admin token from the store: %w", err)
	}
	path, err := t.Path(name)
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", nil, fmt.Errorf("make token directory: %w", err)
	}
	token = api.NewToken()
	// The file first: a stored hash nobody holds the token of would lock everyone out.
	if err := atomicfile.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return "", nil, fmt.Errorf("write admin token: %w", err)
	}
	if _, err := kv.Create(ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		os.Remove(path)
		return "", nil, fmt.Errorf("store admin token: %w", err)
	}
	undoAdmin := func(ctx context.Context) {
		_ = kv.Delete(ctx, cluster.AdminTokenKey, coord.AnyVersion)
		t.RemoveFile(name)
	}
	if err := installScrapeToken(ctx, kv, filepath.Dir(path)); err != nil {
		undoAdmin(ctx)
		return "", nil, err
	}
	return token, func(ctx context.Context) {
		_ = kv.Delete(ctx, cluster.MetricsTokenKey, coord.AnyVersion)
		undoAdmin(ctx)
	}, nil
}

// installScrapeToken makes the cluster's scrape token beside its admin token
// (dir/metrics.token, 0600) and stores its hash, so that the operator holds the token their
// Prometheus scrapes /metrics with: the master finds the hash and writes none of its own.
// A hash already stored is left alone (the master, or an earlier create, made it).
func installScrapeToken(ctx context.Context, kv coord.KV, dir string) error {
	if _, err := kv.Get(ctx, cluster.MetricsTokenKey); err == nil {
		return nil
	} else if !errors.Is(err, coord.ErrNotFound) {
		return fmt.Errorf("read scrape token from the store: %w", err)
	}
	path := filepath.Join(dir, api.MetricsTokenFile)
	token := api.NewToken()
	if err := atomicfile.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("write scrape token: %w", err)
	}
	if _, err := kv.Create(ctx, cluster.MetricsTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		os.Remove(path)
		return fmt.Errorf("store scrape token: %w", err)
	}
	return nil
}

// Remove drops cluster name's admin and scrape tokens from the store (kv may be nil) and
// their files.
func (t Tokens) Remove(ctx context.Context, kv coord.KV, name string) error {
	if kv != nil {
		if err := kv.Delete(ctx, cluster.AdminTokenKey, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) {
			return fmt.Errorf("remove admin token from the store: %w", err)
		}
		if err := kv.Delete(ctx, cluster.MetricsTokenKey, coord.AnyVersion); err != nil && !errors.Is(err, coord.ErrNotFound) {
			return fmt.Errorf("remove scrape token from the store: %w", err)
		}
	}
	t.RemoveFile(name)
	return nil
}

// RemoveFile deletes the token files, the cluster's CA and certificate, and their directory
// unless the store's credentials are in it: the cluster's data stays in its chroot, which
// only they open.
func (t Tokens) RemoveFile(name string) {
	path, err := t.Path(name)
	if err != nil {
		return
	}
	dir := filepath.Dir(path)
	for _, f := range []string{path, filepath.Join(dir, api.MetricsTokenFile), filepath.Join(dir, pki.CACertFile), filepath.Join(dir, pki.CAKeyFile),
		filepath.Join(dir, pki.MasterCertFile), filepath.Join(dir, pki.MasterKeyFile)} {
		os.Remove(f)
	}
	os.Remove(dir) // fails, harmlessly, while the credentials are in it
}

// Forget removes a destroyed cluster's admin token: its file, and its hash in the cluster's
// store when storeURL is known and the store can be reached (otherwise the hash stays, and
// the warning says so).
func (t Tokens) Forget(ctx context.Context, storeURL, name string, log *slog.Logger) {
	var kv coord.KV
	if storeURL != "" {
		if store, err := t.OpenStore(ctx, name, storeURL, log); err == nil {
			defer store.Close()
			kv = store
		} else {
			log.Warn("admin token hash stays in the store", "err", err)
		}
	}
	if err := t.Remove(ctx, kv, name); err != nil {
		log.Warn("remove admin token", "cluster", name, "err", err)
	}
}
