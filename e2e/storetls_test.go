package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// TestStoreOverTLS runs a cluster on a ZooKeeper server that serves TLS only
// (secureClientPort, no plain port): the master and agents get --store zks://... and
// --store-ca; the agents' keepers and a mirrored job's routers get the CA from their agent.
// Output flows end to end and the CLI reads the store. The routers serve HTTPS with
// certificates from the router CA: plain HTTP gets nothing from them and a sender trusting
// another CA refuses them. A CLI and a master given another store CA fail with one line
// that says which flag to fix.
//
// It is also the run the audits look at: the loopback traffic of every process of it is
// captured from the start, and once it has run a mirrored job with an HTTP sink and an output
// secret, a job reading a tenant secret (rotated, then rolled out anew), registry credentials
// and tenants' tokens, every value of the store and every byte of the run's connections are
// searched for what must not be there in clear (auditSecrets).
func TestStoreOverTLS(t *testing.T) {
	wire := startCapture(t)
	h := &harness{clustertest.NewTLS(t, binary, 2*time.Second)}
	ca := h.StoreCA()
	if !strings.HasPrefix(h.StoreURL(), "zks://") {
		t.Fatalf("store URL %s: want zks://", h.StoreURL())
	}
	keyFile := filepath.Join(h.Dir, "secrets.key")
	if _, err := keyring.Generate(keyFile); err != nil {
		t.Fatal(err)
	}
	// The master serves HTTPS (--tls): the CLI, and the agents fetching secrets, over TLS.
	masterURL := strings.Replace(h.StartMaster("m1", "--store-ca", ca, "--tls", "--secrets-key", keyFile), "http://", "https://", 1)
	cl := httpsAdmin(t, h, masterURL)
	ctx := context.Background()
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1"} {
		h.StartAgent(n, n[:4], n[5:], 4, "--store-ca", ca)
	}
	testenv.Eventually(t, "3 nodes", 30*time.Second, func() bool { return len(h.NodeRecords()) == 3 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.Dir, "io")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const lines = 300
	input := filepath.Join(dir, "input.txt")
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, "line %d of the input\n", i)
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.SinkPath("e2e", "out.jsonl")
	spec := fmt.Sprintf(`name: mirror
tenant: e2e
workers: 1
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, '300']
links: [dc-a, dc-b]
output: file://%s
gracePeriod: 1s
`, input, out)
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "every line delivered through the router", 90*time.Second, func() bool {
		return len(sinkOffsets(t, out)) >= lines
	})
	if offs := sinkOffsets(t, out); len(offs) != lines {
		t.Errorf("sink holds %d records, want %d", len(offs), lines)
	}
	// The keepers hold the nodes over TLS too.
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1"} {
		if h.KeeperPID(n) == 0 {
			t.Errorf("node %s: no keeper running", n)
		}
	}
	// The CLI reads the store over TLS.
	if ls := h.linkStatus(t, "mirror"); ls.Active == "" {
		t.Errorf("link status: no active link: %+v", ls)
	}

	// The routers serve HTTPS with certificates from the router CA: the job's status names
	// https URLs, a client trusting that CA reads a router's status, plain HTTP gets no
	// status, and a link worker's sender given another CA refuses the router.
	st, err := cl.Job(ctx, "mirror")
	if err != nil || st.Sink == nil || len(st.Sink.Routers) == 0 {
		t.Fatalf("job status: sink %+v, %v", st.Sink, err)
	}
	for _, u := range st.Sink.Routers {
		if !strings.HasPrefix(u, "https://") {
			t.Errorf("router URL %s: want https://", u)
		}
	}
	router := st.Sink.Routers[0]
	rca, err := multidc.EnsureRouterCA(ctx, h.Store)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := rca.Pool()
	if err != nil {
		t.Fatal(err)
	}
	// Every router answers over HTTPS (a standby with 503), the leader with its status.
	leading := 0
	for _, u := range st.Sink.Routers {
		rc, err := multidc.NewClient(u)
		if err != nil {
			t.Fatal(err)
		}
		rc.TrustRouterCA(pool)
		rs, err := rc.Status(ctx)
		var apiErr *multidc.APIError
		switch {
		case err == nil && rs.Job == "mirror":
			leading++
		case errors.As(err, &apiErr):
		default:
			t.Errorf("router %s over HTTPS with the router CA: %+v, %v", u, rs, err)
		}
	}
	if leading != 1 {
		t.Errorf("%d routers of %v answered their status; want the leader alone", leading, st.Sink.Routers)
	}
	if resp, err := http.Get(strings.Replace(router, "https://", "http://", 1) + "/v1/status"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("router answered plain HTTP with %s", resp.Status)
		}
	}
	other := filepath.Join(h.Dir, "other-ca.crt")
	certPEM, _, err := pki.NewCA("not the store's CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(multidc.EnvRouterCA, other)
	if _, err := multidc.NewSender(strings.Join(st.Sink.Routers, ","), "dc-a", 0, 1).Heartbeat(ctx); err == nil ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a sender trusting another CA: %v; want the router's certificate refused", err)
	}

	auditSecrets(t, h, wire, cl, masterURL, keyFile, input)

	// Another CA: the CLI and a master fail at once, with one line naming the flag.
	want := "store " + h.StoreURL() + ": TLS: certificate signed by unknown authority: give --store-ca the CA that signed the ZooKeeper servers' certificates"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"link-status-wrong-ca", []string{"link", "status", "mirror", "--store", h.StoreURL(), "--store-ca", other}},
		{"master-wrong-ca", []string{"master", "--store", h.StoreURL(), "--store-ca", other, "--api", clustertest.FreeAddr(t),
			"--id", "m2", "--data", filepath.Join(h.Dir, "data-m2")}},
	} {
		p := h.Start(tc.name, tc.args...)
		testenv.Eventually(t, tc.name+" to exit", 30*time.Second, func() bool {
			select {
			case <-p.Done:
				return true
			default:
				return false
			}
		})
		b, _ := os.ReadFile(filepath.Join(h.Dir, tc.name+".log"))
		got := strings.TrimSpace(string(b))
		if p.Cmd.ProcessState.ExitCode() == 0 || !strings.Contains(got, want) || strings.Count(got, "\n") > 0 {
			t.Errorf("%s: exit %d, output:\n%s\nwant one line with %q", tc.name, p.Cmd.ProcessState.ExitCode(), got, want)
		}
	}
}

// TestUpOnTLSStore: `stormdock up --store zks://... --store-ca` runs a local cluster on a
// ZooKeeper that serves TLS only, and a job runs on it.
func TestUpOnTLSStore(t *testing.T) {
	testenv.Cgroups(t)
	srv := zktest.Start(t, zktest.Options{TickTime: 250 * time.Millisecond, TLS: true})
	data := t.TempDir()
	addr := clustertest.FreeAddr(t)
	c := &cli{t: t, data: data, env: []string{"STORMDOCK_DATA=" + data}}
	up := exec.Command(binary, "up", "--nodes", "2", "--dcs", "dc-a", "--racks-per-dc", "1", "--slots", "2",
		"--data", data, "--api", addr, "--session-timeout", "3s", "--log-level", "warn",
		"--store", srv.URL("/up-tls"), "--store-ca", srv.CAFile())
	var upOut bytes.Buffer
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGKILL)
		_ = up.Wait()
		clustertest.KillCgroupTree("/stormdock-local/" + filepath.Base(data))
	})
	testenv.EventuallyWith(t, "local cluster up on the TLS store", 60*time.Second, func() (bool, string) {
		out, code := c.run("node", "list", "-o", "json")
		var nodes []api.NodeView
		return code == 0 && json.Unmarshal([]byte(out), &nodes) == nil && len(nodes) == 2, out
	})
	c.ok("tenant", "create", "t1")
	spec := filepath.Join(t.TempDir(), "wc.yaml")
	if err := os.WriteFile(spec, []byte("name: wc\ntenant: t1\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [stormdock, worker, wordcount, --rate, '2']\ngracePeriod: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("job", "submit", spec, "--wait"); !strings.Contains(out, "all 2 workers running") {
		t.Fatalf("submit --wait: %s", out)
	}
}
