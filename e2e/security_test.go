package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestSecuredCluster runs a cluster of real processes the way an operator secures one: a
// master serving TLS (--tls), the store behind a digest ACL (--store-credentials-file), and
// agents, run as root, whose workers run as their tenant's uid (the default). On it runs a mirrored job
// (link workers, an output router started by an agent, keepers, lease launchers) and a job
// that reports who it runs as. Then: the store is closed to anyone without the credentials,
// no process's command line shows a secret, a tenant's process worker runs as its tenant's
// uid (not root, not the agent's), with no supplementary groups and no new privileges, and the router takes records only with the job's sender token.
func TestSecuredCluster(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	ctx := context.Background()
	// A chroot of its own, opened by the credentials alone.
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	pass := base64.RawURLEncoding.EncodeToString(b)
	credFile := filepath.Join(h.Dir, "store.credentials")
	if err := os.WriteFile(credFile, []byte("stormdock:"+pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.Chroot = "/e2e-secured"
	h.Store.Close()
	var err error
	if h.Store, err = coord.Open(ctx, h.StoreURL(), coord.Options{SessionTimeout: 4 * time.Second, Credentials: "stormdock:" + pass}); err != nil {
		t.Fatal(err)
	}

	addr := clustertest.FreeAddr(t)
	data := filepath.Join(h.Dir, "data")
	m := h.Start("master-m1", "master", "--store", h.StoreURL(), "--store-credentials-file", credFile, "--api", addr, "--id", "m1",
		"--session-timeout", h.Session.String(), "--data", data, "--tls", "--sink-dir", h.SinkDir)
	h.SetMaster("m1", m)
	for _, dc := range []string{"dc-a", "dc-b", "dc-c"} {
		h.StartAgent(dc+"-r1", dc, "r1", 4, "--store-credentials-file", credFile)
	}
	var token []byte
	testenv.Eventually(t, "admin token and CA", testenv.Timeout(20*time.Second), func() bool {
		token, err = os.ReadFile(filepath.Join(data, api.AdminTokenFile))
		_, cerr := os.Stat(filepath.Join(data, "ca.crt"))
		return err == nil && cerr == nil
	})
	pool, err := api.CAPool(filepath.Join(data, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient("https://"+addr, strings.TrimSpace(string(token)), api.WithRootCAs(pool))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "3 nodes", testenv.Timeout(30*time.Second), func() bool {
		ns, err := cl.Nodes(ctx)
		return err == nil && len(ns) == 3
	})
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	tenantToken, err := cl.TenantToken(ctx, "e2e")
	if err != nil {
		t.Fatal(err)
	}

	// The job that says who it is, and the mirrored job, its input and output in places a
	// worker's user may read (and the router, which runs as its tenant's router uid, may
	// write).
	io := filepath.Join(h.Dir, "io")
	if err := os.Mkdir(io, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(io, 0o777); err != nil {
		t.Fatal(err)
	}
	const lines = 400
	input := filepath.Join(io, "input.txt")
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, "line %d of the input\n", i)
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.SinkPath("e2e", "out.jsonl") // below the cluster's --sink-dir
	who := `name: who
tenant: e2e
workers: 1
resources: {memory: 64Mi, cpu: 0.1}
command: [sh, -c, 'id -u; id -G; grep NoNewPrivs /proc/self/status; exec sleep 600']
gracePeriod: 1s
`
	mirror := fmt.Sprintf(`name: mirror
tenant: e2e
workers: 1
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, '400']
links: [dc-a, dc-b]
output: file://%s
gracePeriod: 1s
`, input, out)
	for _, spec := range []string{who, mirror} {
		if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "every line delivered through the router", testenv.Timeout(60*time.Second), func() bool {
		return len(sinkOffsets(t, out)) >= lines
	})

	// Who the tenant's worker is: its own report, in its log.
	var report string
	testenv.Eventually(t, "the who job's report", testenv.Timeout(30*time.Second), func() bool {
		logs, _ := filepath.Glob(filepath.Join(h.Dir, "agent-*", "process", "logs", "*who*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			if strings.Contains(string(b), "NoNewPrivs") {
				report = string(b)
				return true
			}
		}
		return false
	})
	fields := strings.Fields(report)
	ts, err := cl.Tenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].UID < cluster.DefaultTenantUIDs.First {
		t.Fatalf("tenants %+v, %v; want e2e with a uid of the default range", ts, err)
	}
	uid := fmt.Sprint(ts[0].UID)
	// id -u; id -G (the gid alone: no supplementary group); NoNewPrivs.
	if len(fields) != 4 || fields[0] != uid || fields[1] != uid || fields[3] != "1" {
		t.Errorf("the tenant's process worker reports `id -u; id -G; NoNewPrivs`: %q; want its tenant's uid %s, gid %s alone, no_new_privs 1", report, uid, uid)
	}
	t.Logf("tenant worker: %s", strings.Join(fields, " "))

	// The store: nothing of the cluster without the credentials.
	anon, err := coord.Open(ctx, h.StoreURL(), coord.Options{SessionTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	for _, key := range []string{cluster.JobsKey, cluster.NodesKey, cluster.AdminTokenKey, cluster.OutputKeyKey, cluster.AssignmentsKey} {
		if _, err := anon.Get(ctx, key); !errors.Is(err, coord.ErrPermission) {
			t.Errorf("reading %s without the credentials: %v; want a permission error", key, err)
		}
	}

	// The router: records without the job's sender token are refused.
	st, err := cl.Job(ctx, "mirror")
	if err != nil {
		t.Fatal(err)
	}
	if st.Sink == nil || len(st.Sink.Routers) == 0 {
		t.Fatalf("job status names no router: %+v", st.Sink)
	}
	routerURL := st.Sink.Routers[0] + "/v1/records?link=dc-a&worker=0"
	rc := h.routerClient(t)
	for _, tok := range []string{"", tenantToken, "sdo_forged"} {
		req, _ := http.NewRequest(http.MethodPost, routerURL, strings.NewReader(`{"offset":0,"link":"dc-a"}`))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := rc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a record with token %q: %s; want 401", tok, resp.Status)
		}
	}

	// No secret on any command line: the store's password, the admin and tenant tokens, the
	// job's sender token, the output key, the master's private key.
	secrets := map[string]string{"store password": pass, "admin token": strings.TrimSpace(string(token)), "tenant token": tenantToken}
	tokens, _ := filepath.Glob(filepath.Join(h.Dir, "agent-*", "leases", "*", "output.token"))
	if len(tokens) == 0 {
		t.Fatal("no link worker has a sender token file")
	}
	sender, _ := os.ReadFile(tokens[0])
	secrets["sender token"] = strings.TrimSpace(string(sender))
	if e, err := h.Store.Get(ctx, cluster.OutputKeyKey); err == nil {
		secrets["output key"] = string(e.Value)
	}
	key, _ := os.ReadFile(filepath.Join(data, "master.key"))
	secrets["master key"] = strings.Split(strings.TrimSpace(string(key)), "\n")[1]
	ps, err := exec.Command("ps", "-eo", "args").Output()
	if err != nil {
		t.Fatal(err)
	}
	for what, s := range secrets {
		if s == "" || strings.Contains(string(ps), s) {
			t.Errorf("ps -eo args shows the %s (or it is empty: %q)", what, s)
		}
	}
	// Nor in any log: the master's, the agents', the keepers', the workers' (the router's).
	logs, _ := filepath.Glob(filepath.Join(h.Dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(h.Dir, "agent-*", "keeper.log"))
	workerLogs, _ := filepath.Glob(filepath.Join(h.Dir, "agent-*", "process", "logs", "*.log"))
	logs = append(append(logs, more...), workerLogs...)
	if len(more) != 3 || len(workerLogs) == 0 {
		t.Errorf("found %d keeper logs and %d worker logs", len(more), len(workerLogs))
	}
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for what, s := range secrets {
			if s != "" && strings.Contains(string(b), s) {
				t.Errorf("%s holds the %s", l, what)
			}
		}
	}
	// The keepers, which hold the nodes' sessions, got the credentials by file (the router
	// gets the file's name in its environment).
	keepers := 0
	for _, line := range strings.Split(string(ps), "\n") {
		if strings.Contains(line, " keeper ") && strings.Contains(line, h.Chroot) {
			keepers++
			if !strings.Contains(line, "--store-credentials-file "+credFile) {
				t.Errorf("a keeper runs without the credentials file: %s", line)
			}
		}
	}
	if keepers != 3 {
		t.Errorf("%d keeper processes run; want one per node", keepers)
	}
}
