package provision

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/pki"
)

// A zks:// store's TLS files, kept in the cluster's directory beside its store credentials
// (and, like them, kept after destroy: the chroot still needs them). The client key is
// 0400; containers get the files by a read-only bind mount, never in their environment.
const (
	StoreCAFile   = "store-ca.pem"
	StoreCertFile = "store-cert.pem"
	StoreKeyFile  = "store-key.pem"
)

// KeepStoreTLS copies f's files into cluster name's directory and returns the kept ones
// (empty fields where f gives none). Files kept by an earlier call and not given again stay.
func (t Tokens) KeepStoreTLS(name string, f coord.TLSFiles) (coord.TLSFiles, error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return coord.TLSFiles{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return coord.TLSFiles{}, fmt.Errorf("store TLS files: %w", err)
	}
	for _, c := range []struct {
		src, dst string
		mode     os.FileMode
	}{{f.CA, StoreCAFile, 0o444}, {f.Cert, StoreCertFile, 0o444}, {f.Key, StoreKeyFile, 0o400}} {
		if c.src == "" {
			continue
		}
		b, err := os.ReadFile(c.src)
		if err != nil {
			return coord.TLSFiles{}, fmt.Errorf("%w: store TLS file: %v", ErrBadSpec, err)
		}
		if err := pki.WriteFiles(map[string][]byte{filepath.Join(dir, c.dst): b}, c.mode); err != nil {
			return coord.TLSFiles{}, fmt.Errorf("store TLS files: %w", err)
		}
	}
	return t.StoreTLS(name)
}

// StoreTLS returns the store TLS files kept for cluster name (empty fields for those it
// has none of).
func (t Tokens) StoreTLS(name string) (coord.TLSFiles, error) {
	dir, err := t.ClusterDir(name)
	if err != nil {
		return coord.TLSFiles{}, err
	}
	var f coord.TLSFiles
	for _, c := range []struct {
		file string
		dst  *string
	}{{StoreCAFile, &f.CA}, {StoreCertFile, &f.Cert}, {StoreKeyFile, &f.Key}} {
		p := filepath.Join(dir, c.file)
		switch _, err := os.Stat(p); {
		case err == nil:
			*c.dst = p
		case !errors.Is(err, os.ErrNotExist):
			return coord.TLSFiles{}, fmt.Errorf("store TLS files of cluster %s: %w", name, err)
		}
	}
	return f, nil
}
