package daemon

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/pki"
)

// StoreCredentialsFile is the name of the file, in a data or state directory, that holds
// the store's digest credentials (user:pass, mode 0600). Processes get them through such a
// file (--store-credentials-file) or the environment (STORMDOCK_STORE_CREDENTIALS), never on
// a command line, where ps shows them to every user of the machine.
const StoreCredentialsFile = "store.credentials"

// StoreUser is the user name of the credentials stormdock makes.
const StoreUser = "stormdock"

// EnsureStoreCredentials returns the credentials in dir/store.credentials, making them at
// the first start: every znode the cluster creates is then readable and writable with them
// alone (a ZooKeeper digest ACL).
func EnsureStoreCredentials(dir string) (path, creds string, err error) {
	path = filepath.Join(dir, StoreCredentialsFile)
	creds, err = ReadStoreCredentials(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return path, creds, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("store credentials: %w", err)
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	creds = StoreUser + ":" + base64.RawURLEncoding.EncodeToString(b)
	if err := pki.WriteFiles(map[string][]byte{path: []byte(creds + "\n")}, 0o600); err != nil {
		return "", "", fmt.Errorf("store credentials: %w", err)
	}
	return path, creds, nil
}

// ReadStoreCredentials reads user:pass from a credentials file.
func ReadStoreCredentials(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("store credentials: %w", err)
	}
	creds := strings.TrimSpace(string(b))
	if user, _, ok := strings.Cut(creds, ":"); !ok || user == "" || strings.ContainsAny(creds, "\n\r") {
		return "", fmt.Errorf("store credentials: %s must hold one line user:pass", path)
	}
	return creds, nil
}

// WriteStoreCredentials writes creds to dir/store.credentials (0600), for processes that
// took them from the environment and hand them on by file, and returns its path.
func WriteStoreCredentials(dir, creds string) (string, error) {
	path := filepath.Join(dir, StoreCredentialsFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("store credentials: %w", err)
	}
	if err := pki.WriteFiles(map[string][]byte{path: []byte(creds + "\n")}, 0o600); err != nil {
		return "", fmt.Errorf("store credentials: %w", err)
	}
	return path, nil
}

// PlainStoreURL is a store URL without the credentials it may carry: what goes on the
// command lines of the processes a stormdock process starts.
func PlainStoreURL(raw string) (url, creds string, err error) {
	t, err := coord.ParseURL(raw)
	if err != nil {
		return "", "", err
	}
	return t.String(), t.Credentials, nil
}
