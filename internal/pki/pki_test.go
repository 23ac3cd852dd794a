package pki

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnsureCerts: the first start makes a CA and a server certificate with their keys
// private; the next start keeps them; an address the certificate does not cover gets a new
// certificate from the same CA.
func TestEnsureCerts(t *testing.T) {
	dir := t.TempDir()
	cert, key, err := EnsureCerts(dir, CertHosts("127.0.0.1:7070"))
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600, MasterCertFile: 0o644, MasterKeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v; want %v", name, err, fi.Mode().Perm(), mode)
		}
	}
	if cert != filepath.Join(dir, MasterCertFile) || key != filepath.Join(dir, MasterKeyFile) {
		t.Errorf("EnsureCerts returned %s, %s", cert, key)
	}
	first, _ := os.ReadFile(cert)
	ca, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	if _, _, err := EnsureCerts(dir, CertHosts("127.0.0.1:7071", "localhost:7071")); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(cert); string(again) != string(first) {
		t.Error("a second start with the same hosts made a new certificate")
	}
	if _, _, err := EnsureCerts(dir, CertHosts("10.1.2.3:7070", "master.example:7070")); err != nil {
		t.Fatal(err)
	}
	renewed, _ := os.ReadFile(cert)
	caAgain, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	if string(renewed) == string(first) || string(caAgain) != string(ca) {
		t.Error("new hosts: want a new certificate from the same CA")
	}
}

// TestWriteFilesConcurrently: writers of the same file at the same moment (two masters of one
// local cluster writing its api.url) all succeed, the file holds one of their contents whole,
// with the mode asked for, and no temporary file is left behind.
func TestWriteFilesConcurrently(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "api.url")
	const writers = 16
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			errs <- WriteFiles(map[string][]byte{path: []byte(fmt.Sprintf("http://10.0.0.%d:7070\n", i))}, 0o644)
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.HasPrefix(string(b), "http://10.0.0.") || !strings.HasSuffix(string(b), ":7070\n") {
		t.Errorf("api.url holds %q (%v)", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("api.url mode: %v, %v", fi.Mode().Perm(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files left in the directory, want only api.url", len(ents))
	}
}

// TestEnsureCertsConcurrently: masters sharing a data directory that start at once end with
// one CA, whose key matches its certificate, and certificates it signed.
func TestEnsureCertsConcurrently(t *testing.T) {
	dir := t.TempDir()
	const masters = 8
	errs := make(chan error, masters)
	for i := range masters {
		go func() {
			_, _, err := EnsureCerts(dir, CertHosts(fmt.Sprintf("10.0.0.%d:7070", i+1)))
			errs <- err
		}()
	}
	for range masters {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	ca, _, err := ensureCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !certValid(filepath.Join(dir, MasterCertFile), filepath.Join(dir, MasterKeyFile), ca, nil) {
		t.Error("the master certificate left is not the CA's, or its key does not match")
	}
}
