package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// binary is the stormdock binary built once for the package; allocBinary the test worker
// that allocates memory in steps.
var binary, allocBinary string

func TestMain(m *testing.M) {
	var err error
	if binary, err = testenv.Build("./cmd/stormdock"); err == nil {
		allocBinary, err = testenv.Build("./e2e/testdata/alloc")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	removeOwnImage()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// harness is a cluster of stormdock processes on a ZooKeeper server of the test's own
// (internal/clustertest), with what this package's tests add to it.
type harness struct {
	*clustertest.Cluster
}

func newHarness(t testing.TB, session time.Duration) *harness {
	t.Helper()
	return &harness{clustertest.New(t, binary, session)}
}

// newEnsembleHarness is a harness on a ZooKeeper ensemble of n servers of its own.
func newEnsembleHarness(t testing.TB, n int, session time.Duration) *harness {
	t.Helper()
	return &harness{clustertest.NewEnsemble(t, binary, n, session)}
}

// getMetrics reads url/metrics with token ("" sends none) and returns the status and body.
func getMetrics(t testing.TB, url, token string) (int, string) {
	t.Helper()
	return getURL(t, url+"/metrics", token)
}

// getURL GETs url with token ("" sends none) and returns the status and body.
func getURL(t testing.TB, url, token string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// reconciles reads how many reconciles the master at url has finished, from its /metrics,
// with the cluster's scrape token.
func reconciles(t testing.TB, h *harness, url string) float64 {
	t.Helper()
	status, body := getMetrics(t, url, h.MetricsToken())
	if status != http.StatusOK {
		t.Fatalf("%s/metrics with the scrape token: %d: %s", url, status, body)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "stormdock_master_reconcile_duration_seconds_count "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s/metrics: %q: %v", url, sc.Text(), err)
			}
			return n
		}
	}
	t.Fatalf("%s/metrics: no stormdock_master_reconcile_duration_seconds_count (%v)", url, sc.Err())
	return 0
}

func jobSpec(name string, workers int) []byte {
	return []byte(fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount]
placement: {spread: [dc, rack]}
gracePeriod: 2s
`, name, workers))
}

// routerClient is an HTTP client that trusts the cluster's router CA (from the store), as
// link workers do: routers serve HTTPS.
func (h *harness) routerClient(t testing.TB) *http.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := multidc.EnsureRouterCA(ctx, h.Store)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ca.Pool()
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// sharedDir makes dir (and any missing parent) writable by every user, and the directories
// above it up to the temporary directory enterable: workers and output routers run as their
// tenants' uids, and write a job's output there.
func sharedDir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir() && d != "."; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o111); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
