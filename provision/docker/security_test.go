package docker_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
)

// TestCreateLocksTheClusterDown: a created cluster serves its API over TLS and keeps its
// store behind a digest ACL, with no setup; the credentials, keys and tokens are files of
// mode 0600 on the operator's machine and appear on no command line of any container or
// host process. Its agent is root in its container with the capabilities to switch users
// alone; a tenant's process job runs, its worker as the tenant's uid with no capabilities
// and no new privileges, judged from the host's /proc, with its tenant secret (the master
// holds the keyring create made, given in its environment, never on a command line).
func TestCreateLocksTheClusterDown(t *testing.T) {
	p, spec, dc := newProvider(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(4*time.Minute))
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
	for _, f := range []string{provision.StoreCredentialsFile, "admin.token", "metrics.token", "ca.key", "master.key", provision.SecretsKeyFile} {
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
	ring, _ := os.ReadFile(filepath.Join(dir, provision.SecretsKeyFile))
	for _, line := range strings.Split(string(ring), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			secrets = append(secrets, f[1]) // the masters' keyring: the master's environment only
		}
	}
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

	// The agent is root in its container with the capabilities to run workers as their
	// tenants' uids alone, and no new privileges.
	var agent container.InspectResponse
	for _, ct := range ctrs {
		if ct.Labels[pdocker.LabelRole] == "agent" {
			if agent, err = dc.ContainerInspect(ctx, ct.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if agent.State == nil || agent.State.Pid == 0 {
		t.Fatalf("no running agent container among %d", len(ctrs))
	}
	// The engine keeps CapAdd sorted.
	if !slices.Equal(slices.Sorted(slices.Values(agent.HostConfig.CapAdd)), slices.Sorted(slices.Values(pdocker.AgentCapabilities))) || !slices.Equal(agent.HostConfig.CapDrop, []string{"ALL"}) ||
		!slices.Contains(agent.HostConfig.SecurityOpt, "no-new-privileges") || !agent.HostConfig.ReadonlyRootfs || agent.Config.User != "0:0" {
		t.Errorf("agent container: user %q, cap add %v, drop %v, security %v, read-only %v; want 0:0, %v, [ALL], no-new-privileges, read-only",
			agent.Config.User, agent.HostConfig.CapAdd, agent.HostConfig.CapDrop, agent.HostConfig.SecurityOpt, agent.HostConfig.ReadonlyRootfs, pdocker.AgentCapabilities)
	}
	var want uint64
	for _, c := range []int{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_KILL} {
		want |= 1 << c
	}
	for _, tc := range []struct {
		field, want string
	}{
		{"Uid", "0\t0\t0\t0"}, {"CapEff", fmt.Sprintf("%016x", want)}, {"CapPrm", fmt.Sprintf("%016x", want)},
		{"CapBnd", fmt.Sprintf("%016x", want)}, {"CapAmb", fmt.Sprintf("%016x", 0)}, {"NoNewPrivs", "1"},
	} {
		if got := procStatus(t, agent.State.Pid, tc.field); got != tc.want {
			t.Errorf("agent (pid %d) %s: %q, want %q", agent.State.Pid, tc.field, got, tc.want)
		}
	}

	// The tenants' uids reach the leases in the state tmpfs itself (root's, 0711): no
	// fallback below /run, which the read-only root could not hold.
	state := fmt.Sprintf("/proc/%d/root/state", agent.State.Pid)
	if fi, err := os.Stat(state); err != nil {
		t.Errorf("agent's state directory: %v", err)
	} else if fi.Mode().Perm() != 0o711 {
		t.Errorf("agent's state directory: mode %v; want 0711", fi.Mode())
	}
	if fi, err := os.Lstat(state + "/leases"); err != nil {
		t.Errorf("agent's leases: %v", err)
	} else if !fi.IsDir() {
		t.Errorf("agent's leases: mode %v; want a directory in the state directory, not a link below /run", fi.Mode())
	}

	// A tenant's process job runs, its worker as the tenant's uid (never root or the
	// agent), with no capabilities and no new privileges: judged from the host.
	cl := apiClient(t, tokens, c)
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	ts, err := cl.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	uid := 0
	for _, tn := range ts {
		if tn.Name == "t1" {
			uid = tn.UID
		}
	}
	if uid <= 0 {
		t.Fatalf("tenant t1 has uid %d", uid)
	}
	// Its master holds the cluster's keyring: a tenant secret is kept, and the worker,
	// which names it, starts only once its agent got it from the master.
	if _, err := cl.SetSecret(ctx, "t1", "db", []byte("created-cluster-secret")); err != nil {
		t.Fatalf("a secret on a created cluster: %v", err)
	}
	if _, err := cl.SubmitJob(ctx, append(jobSpec(1), "secrets: [db]\n"...)); err != nil {
		t.Fatal(err)
	}
	settled(t, cl, 1, time.Minute)
	ids := fmt.Sprintf("%d\t%d\t%d\t%d", uid, uid, uid, uid)
	var pids []int
	testenv.EventuallyWith(t, "the worker of wc on "+spec.SlotAt(0).Node+" among the host's processes", time.Minute, func() (bool, string) {
		pids = workerPIDs(t, "wc", spec.SlotAt(0).Node)
		return len(pids) > 0, fmt.Sprintf("%d found", len(pids))
	})
	for _, pid := range pids {
		for _, tc := range []struct {
			field, want string
		}{
			{"Uid", ids}, {"Gid", ids}, {"Groups", ""}, {"CapEff", fmt.Sprintf("%016x", 0)}, {"CapPrm", fmt.Sprintf("%016x", 0)},
			{"CapAmb", fmt.Sprintf("%016x", 0)}, {"NoNewPrivs", "1"},
		} {
			if got := procStatus(t, pid, tc.field); got != tc.want {
				t.Errorf("worker (pid %d) %s: %q, want %q", pid, tc.field, got, tc.want)
			}
		}
	}
	// The agent stops a worker of another uid (CAP_KILL).
	if _, err := cl.KillJob(ctx, "wc", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the worker of wc gone from the host", time.Minute, func() (bool, string) {
		n := len(workerPIDs(t, "wc", spec.SlotAt(0).Node))
		return n == 0, fmt.Sprintf("%d processes left", n)
	})
}

// procStatus is a field of /proc/PID/status, as the kernel writes it.
func procStatus(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return ""
}

// workerPIDs are the host's processes of job's workers on node: by STORMDOCK_JOB and
// STORMDOCK_NODE in their environment (the node names the cluster: other tests' clusters
// run jobs of the same name).
func workerPIDs(t *testing.T, job, node string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue // gone, or a kernel thread
		}
		env := strings.Split(string(b), "\x00")
		if slices.Contains(env, "STORMDOCK_JOB="+job) && slices.Contains(env, "STORMDOCK_NODE="+node) {
			out = append(out, pid)
		}
	}
	return out
}
