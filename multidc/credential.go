package multidc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// EnvSecretsDir names, in every worker's environment (an output router's too), the
// directory of its tenant secrets, one file per secret (agents.EnvSecretsDir).
const EnvSecretsDir = "STORMDOCK_SECRETS_DIR"

// maxCredential bounds what a credential file may hold (a tenant secret's bound).
const maxCredential = 64 << 10

// Credential is the router's output secret: the sink's credentials (a password, a token, a
// key), kept by the agent in a file of the router's own uid, 0400. Bytes reads the file each
// time, so a rotated secret (the agent replaces the file atomically, then signals the
// router) is what the next call returns: a sink that holds a connection re-reads it when
// it connects again.
type Credential struct {
	name, path string
}

// OutputCredential is the credential of the output secret name in dir (the router's
// --secrets-dir, from STORMDOCK_SECRETS_DIR); nil when name is empty (the job names no
// output secret).
func OutputCredential(dir, name string) (*Credential, error) {
	if name == "" {
		return nil, nil
	}
	if dir == "" {
		return nil, fmt.Errorf("the output secret %s: no secrets directory (STORMDOCK_SECRETS_DIR, set by the agent)", name)
	}
	if name != filepath.Base(name) || name == "." || name == ".." {
		return nil, fmt.Errorf("the output secret %q is not a secret's name", name)
	}
	return &Credential{name: name, path: filepath.Join(dir, name)}, nil
}

// Name is the secret's name (never its value): for messages.
func (c *Credential) Name() string { return c.name }

// Bytes returns the secret's value as its file holds it now, one trailing line break
// dropped (files written by editors and `echo` end with one). It never follows a symlink.
func (c *Credential) Bytes() ([]byte, error) {
	f, err := os.OpenFile(c.path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("the output secret %s is not delivered yet (%s missing)", c.name, c.path)
		}
		return nil, fmt.Errorf("the output secret %s: %w", c.name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredential+1))
	if err != nil {
		return nil, fmt.Errorf("the output secret %s: %w", c.name, err)
	}
	if len(b) > maxCredential {
		return nil, fmt.Errorf("the output secret %s is over %d bytes", c.name, maxCredential)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	return b, nil
}
