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
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

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
	ca, key, err := pki.ParseCA(caPair, caKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := pki.IssueCert(ca, key, []string{"master.example"}, time.Hour)
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

func startMaster(t testing.TB, cfg MasterConfig) *Master {
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

// TestMasterCutsSlowClients: the master's own server (plain HTTP here) cuts a client that
// trickles its headers, as api.NewServer says.
func TestMasterCutsSlowClients(t *testing.T) {
	t.Parallel()
	m := startMaster(t, MasterConfig{Store: "mem://" + t.Name(), Listen: "127.0.0.1:0"})
	took := testenv.SlowHeaders(t, strings.TrimPrefix(m.URL(), "http://"), 100*time.Millisecond, testenv.Timeout(api.ReadHeaderTimeout+10*time.Second))
	t.Logf("figure: the master cut a client sending one header byte per 100ms after %s", took.Round(time.Millisecond))
}
