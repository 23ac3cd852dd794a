package multidc

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// A router serving HTTPS with a certificate from the router CA: a client or sender trusting
// that CA reaches it; one trusting another CA, or none, refuses it; plain HTTP gets nothing
// of its API.
func TestRouterTLS(t *testing.T) {
	_, store := embeddedStore(t)
	ctx := context.Background()
	ca, err := EnsureRouterCA(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := EnsureRouterCA(ctx, store); err != nil || again != ca {
		t.Fatalf("the router CA read again differs: %v", err)
	}
	certPEM, keyPEM, err := ca.Issue(pki.CertHosts("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	})
	if !strings.HasPrefix(tr.URL(), "https://") {
		t.Fatalf("router URL %s: want https://", tr.URL())
	}
	pool, err := ca.Pool()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := NewClient(tr.URL())
	if err != nil {
		t.Fatal(err)
	}
	cl.TrustRouterCA(pool)
	testenv.Eventually(t, "the router's status over HTTPS", testenv.Timeout(10*time.Second), func() bool {
		st, err := cl.Status(ctx)
		return err == nil && st.Job == "wordcount"
	})

	dir := t.TempDir()
	caFile, otherFile := filepath.Join(dir, "router-ca.crt"), filepath.Join(dir, "other.crt")
	otherPEM, _, err := pki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{caFile: []byte(ca.Cert), otherFile: otherPEM} {
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, caFile, wantErr string // wantErr "": no TLS error
	}{
		{"the router CA", caFile, ""},
		{"another CA", otherFile, "certificate signed by unknown authority"},
		{"no CA: the system's roots", "", "certificate signed by unknown authority"},
		{"a CA file that is not there", filepath.Join(dir, "missing.crt"), "router CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvRouterCA, tc.caFile)
			s := NewSender(tr.URL(), "dc-a", 0, 1)
			s.Token = testToken
			_, err := s.Heartbeat(ctx)
			if tc.wantErr == "" {
				if err != nil && (strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), "tls")) {
					t.Fatalf("heartbeat with the router CA: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("heartbeat: %v; want an error with %q", err, tc.wantErr)
			}
		})
	}
	resp, err := http.Get(strings.Replace(tr.URL(), "https://", "http://", 1) + "/v1/status")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the router: %s; want 400 (Go's answer to HTTP on a TLS port)", resp.Status)
		}
	}
}
