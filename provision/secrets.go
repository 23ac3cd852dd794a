package provision

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/pki"
)

// What the operator's machine keeps of a cluster besides its admin token, in the same
// directory: the store's credentials (every znode of the cluster gets a digest ACL for them
// alone) and the CA that signs the master's certificate, with the certificate and its key.
// Processes get them in their containers' environment, never on a command line.
const StoreCredentialsFile = "store.credentials"

// StoreCredentials returns cluster name's store credentials ("" when it has none), making
// them first when create is set.
func (t Tokens) StoreCredentials(name string, create bool) (string, error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, StoreCredentialsFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		return strings.TrimSpace(string(b)), nil
	case !errors.Is(err, os.ErrNotExist) || !create:
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("store credentials of cluster %s: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("store credentials: %w", err)
	}
	r := make([]byte, 24)
	_, _ = rand.Read(r)
	creds := "stormdock:" + base64.RawURLEncoding.EncodeToString(r)
	if err := pki.WriteFiles(map[string][]byte{path: []byte(creds + "\n")}, 0o600); err != nil {
		return "", fmt.Errorf("store credentials: %w", err)
	}
	return creds, nil
}

// SecretsKeyring returns cluster name's keyring for tenant secrets (the file SecretsKeyFile
// in its directory, beside the admin token, made at the first call), as text: its masters
// get it in their containers' environment. Rotate it with `stormdock secret keygen FILE`
// on that file, then restart the master containers and run `stormdock secret rewrap`.
func (t Tokens) SecretsKeyring(name string) (string, error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("secrets keyring: %w", err)
	}
	path := filepath.Join(dir, SecretsKeyFile)
	if _, err := keyring.Ensure(path); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	return string(b), err
}

// SecretsKeyFile is a cluster's keyring for tenant secrets, in its directory.
const SecretsKeyFile = "secrets.key"

// MasterTLS makes (at the first call) the cluster's CA and a certificate for a master
// serving on loopback, and returns the certificate and key as PEM.
func (t Tokens) MasterTLS(name string) (certPEM, keyPEM []byte, err error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return nil, nil, err
	}
	cert, key, err := pki.EnsureCerts(dir, pki.CertHosts("127.0.0.1"))
	if err != nil {
		return nil, nil, err
	}
	if certPEM, err = os.ReadFile(cert); err == nil {
		keyPEM, err = os.ReadFile(key)
	}
	return certPEM, keyPEM, err
}

// CAFile is the CA certificate of cluster name's master ("" when it serves no TLS).
func (t Tokens) CAFile(name string) string {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return ""
	}
	p := filepath.Join(dir, pki.CACertFile)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// ClientOptions make an API client trust cluster name's CA.
func (t Tokens) ClientOptions(name string) ([]api.ClientOption, error) {
	ca := t.CAFile(name)
	if ca == "" {
		return nil, nil
	}
	pool, err := api.CAPool(ca)
	if err != nil {
		return nil, err
	}
	return []api.ClientOption{api.WithRootCAs(pool)}, nil
}

// OpenStore opens cluster name's store with its credentials, when it has some.
func (t Tokens) OpenStore(ctx context.Context, name, url string, log *slog.Logger) (coord.Store, error) {
	creds, err := t.StoreCredentials(name, false)
	if err != nil {
		return nil, err
	}
	files, err := t.StoreTLS(name)
	if err != nil {
		return nil, err
	}
	return openStore(ctx, url, coord.Options{Credentials: creds, TLS: files}, log)
}
