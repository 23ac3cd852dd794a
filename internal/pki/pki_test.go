package pki

import (
	"os"
	"path/filepath"
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
