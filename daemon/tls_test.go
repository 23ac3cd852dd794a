package daemon

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/internal/testenv"
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

// TestMasterTLS: a master with --tls answers a client that trusts its CA; a client that
// does not, plain HTTP, and a certificate for another host all fail with an error saying so.
func TestMasterTLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	conf, err := MasterTLS(dir, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := startMaster(t, MasterConfig{Store: "mem://" + t.Name(), Listen: "127.0.0.1:0", DataDir: dir, TLS: conf})
	if !strings.HasPrefix(m.URL(), "https://") {
		t.Fatalf("URL %s", m.URL())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, api.URLFile)); strings.TrimSpace(string(b)) != m.URL() {
		t.Errorf("api.url holds %q, want %s", b, m.URL())
	}
	token, _ := os.ReadFile(m.TokenPath())
	pool, err := api.CAPool(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	trusted, _ := api.NewClient(m.URL(), strings.TrimSpace(string(token)), api.WithRootCAs(pool))
	testenv.Eventually(t, "the master answers over TLS", testenv.Timeout(5*time.Second), func() bool {
		_, err := trusted.Jobs(ctx)
		return err == nil
	})
	untrusted, _ := api.NewClient(m.URL(), "x")
	if _, err := untrusted.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "does not trust") {
		t.Errorf("client without the CA: %v", err)
	}
	plain, _ := api.NewClient(strings.Replace(m.URL(), "https://", "http://", 1), "x")
	if _, err := plain.Jobs(ctx); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "serves HTTPS: use https://") {
		t.Errorf("plain HTTP to the TLS listener: %v", err)
	}
	if curl, err := exec.LookPath("curl"); err == nil {
		out, err := exec.Command(curl, "-sS", "-o", "/dev/null", m.URL()+"/v1/health").CombinedOutput()
		if err == nil {
			t.Errorf("curl without the CA reached the master: %s", out)
		}
		out, err = exec.Command(curl, "-sS", "--cacert", filepath.Join(dir, CACertFile), m.URL()+"/v1/health").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"leader"`) {
			t.Errorf("curl with the CA: %v: %s", err, out)
		}
	} else {
		testenv.Missing(t, "curl: %v", err)
	}

	// A certificate from the same CA for another host: the client refuses it.
	caPair, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	caKey, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	ca, key, err := ParseCA(caPair, caKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := IssueCert(ca, key, []string{"master.example"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wrongConf, err := ServerTLSPEM(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	wrong := startMaster(t, MasterConfig{Store: "mem://" + t.Name() + "-wrong", Listen: "127.0.0.1:0", TLS: wrongConf})
	cl, _ := api.NewClient(wrong.URL(), "x", api.WithRootCAs(pool))
	if _, err := cl.Jobs(ctx); err == nil || !strings.Contains(err.Error(), "certificate for other names") {
		t.Errorf("certificate for the wrong host: %v", err)
	}
}

func startMaster(t *testing.T, cfg MasterConfig) *Master {
	t.Helper()
	m, err := NewMaster(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = m.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		m.Close()
	})
	return m
}
