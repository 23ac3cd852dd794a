package docker_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
)

// TestCreateLocksTheClusterDown: a created cluster serves its API over TLS and keeps its
// store behind a digest ACL, with no setup; the credentials, keys and tokens are files of
// mode 0600 on the operator's machine and appear on no command line of any container or
// host process.
func TestCreateLocksTheClusterDown(t *testing.T) {
	p, spec, dc := newProvider(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(3*time.Minute))
	defer cancel()
	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.API, "https://127.0.0.1:") {
		t.Fatalf("API %s; want https", c.API)
	}
	tokens := provision.Tokens{Dir: p.TokenDir()}
	dir, _ := tokens.ClusterDir(spec.Name)
	for _, f := range []string{provision.StoreCredentialsFile, "admin.token", "metrics.token", "ca.key", "master.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, fi.Mode().Perm())
		}
	}
	creds, _ := tokens.StoreCredentials(spec.Name, false)
	token, _ := tokens.Read(spec.Name)
	keyPEM, _ := os.ReadFile(filepath.Join(dir, "master.key"))
	_, pass, _ := strings.Cut(creds, ":")
	if pass == "" || token == "" {
		t.Fatalf("no credentials (%q) or token", creds)
	}

	// The store: nothing of the cluster is readable without its credentials.
	anon, err := coord.Open(ctx, spec.Store, coord.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	for _, key := range []string{"/jobs", "/nodes", "/master/admin", "/tenants"} {
		if _, err := anon.Get(ctx, key); !errors.Is(err, coord.ErrPermission) {
			t.Errorf("reading %s without the credentials: %v; want a permission error", key, err)
		}
	}
	// The API: trusted through the cluster's CA only.
	if _, err := apiClient(t, tokens, c).Jobs(ctx); err != nil {
		t.Fatalf("client with the cluster's CA: %v", err)
	}
	if out, err := exec.Command("curl", "-sS", "-o", "/dev/null", c.API+"/v1/health").CombinedOutput(); err == nil {
		t.Errorf("curl without the CA reached the master: %s", out)
	}
	// /metrics: the scrape token create wrote reads it; an anonymous caller gets 401.
	pool, err := api.CAPool(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	scrape, _ := os.ReadFile(filepath.Join(dir, "metrics.token"))
	for _, tc := range []struct {
		token  string
		status int
	}{{"", http.StatusUnauthorized}, {strings.TrimSpace(string(scrape)), http.StatusOK}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.API+"/metrics", nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("GET /metrics (token %v): %s, want %d", tc.token != "", resp.Status, tc.status)
		}
	}
	// No secret on a command line: the containers' nor the host's processes'.
	ctrs, err := dc.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", pdocker.LabelCluster+"="+spec.Name))})
	if err != nil || len(ctrs) != 2 {
		t.Fatalf("containers: %d, %v", len(ctrs), err)
	}
	secrets := []string{pass, token, strings.TrimSpace(string(keyPEM))}
	for _, ct := range ctrs {
		info, err := dc.ContainerInspect(ctx, ct.ID)
		if err != nil {
			t.Fatal(err)
		}
		line := strings.Join(append([]string{info.Path}, info.Args...), " ")
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("container %s's command line holds a secret: %s", info.Name, line)
			}
		}
	}
	ps, err := exec.Command("ps", "-eo", "args").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(string(ps), s) {
			t.Errorf("ps -eo args shows a secret of the cluster")
		}
	}
}
