package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestTenantRegistryAuth, through the CLI binary against `stormdock up --isolation docker
// --registry-auth NODEFILE` and an htpasswd registry: tenant a gives its own credentials
// (stdin, with its own token) and its private image is pinned and runs; tenant b cannot set
// a's credentials (403), and b's jobs naming a's image by tag and by digest, on the node
// that has it, are refused with the one-line error and run nothing, though the node's own
// credentials reach the registry; once the admin shares the prefix they run with those.
// No credential is in `tenant list -o json`, the events, the cluster's output or its store:
// they are sealed there, and the node gets them from the master (TestSecretsDelivered's
// channel).
func TestTenantRegistryAuth(t *testing.T) {
	testenv.Cgroups(t)
	testenv.DockerSocket(t)
	const user, pass = "acme", "s3cret-acme-e2e-1"
	const nodeUser, nodePass = "node", "s3cret-node-e2e-2"
	srv := testenv.StartRegistry(t, map[string]string{user: pass, nodeUser: nodePass})
	tenantFile, nodeFile := srv.AuthFile(user, pass), srv.AuthFile(nodeUser, nodePass)
	data := t.TempDir()
	addr := clustertest.FreeAddr(t)
	c := &cli{t: t, data: data, env: []string{"STORMDOCK_DATA=" + data}}
	tag := fmt.Sprintf("%s/private/wc-%d:1", srv.Addr, os.Getpid())
	out := c.ok("image", "build", "--tag", tag, "--push", "--registry-auth", tenantFile,
		"--label", fmt.Sprintf("io.example.e2e=%d-private-%d", os.Getpid(), time.Now().UnixNano()))
	id, pinned := builtID(out), lastLine(out)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "--force", id).Run() })
	rmi(t, id)

	up := exec.Command(binary, "up", "--nodes", "1", "--dcs", "dc-a", "--racks-per-dc", "1", "--slots", "8",
		"--isolation", "docker", "--registry-auth", nodeFile, "--data", data, "--api", addr, "--tls=false",
		"--session-timeout", "1s", "--log-level", "debug")
	var upOut bytes.Buffer
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGKILL)
		_ = up.Wait()
		clustertest.KillCgroupTree("/stormdock-local/" + filepath.Base(data))
		removeLocalContainers(filepath.Base(data))
		if t.Failed() {
			t.Logf("stormdock up output:\n%s", clustertest.Tail(upOut.Bytes(), 4000))
		}
	})
	testenv.Eventually(t, "local cluster up", 30*time.Second, func() bool {
		out, code := c.run("node", "list", "-o", "json")
		var nodes []api.NodeView
		return code == 0 && json.Unmarshal([]byte(out), &nodes) == nil && len(nodes) == 1
	})
	tokens := map[string]string{}
	for _, name := range []string{"a", "b"} {
		c.ok("tenant", "create", name)
		tokens[name] = strings.TrimSpace(c.ok("tenant", "token", name))
	}
	c.refused("cannot set tenant a's registry credentials", "tenant", "registry-auth", "--token", tokens["b"], "a", tenantFile)
	c.refused("not JSON", "tenant", "registry-auth", "a", "/dev/null")
	set := exec.Command(binary, "tenant", "registry-auth", "--token", tokens["a"], "a", "-")
	set.Env = append(os.Environ(), c.env...)
	set.Stdin, _ = os.Open(tenantFile)
	if out, err := set.CombinedOutput(); err != nil || !strings.Contains(string(out), "registry credentials set for "+srv.Addr) {
		t.Fatalf("tenant registry-auth a - (its own token): %v\n%s", err, out)
	}
	if table := c.ok("tenant", "list"); !strings.Contains(table, "REGISTRY-AUTH") || !strings.Contains(table, "yes ("+srv.Addr+")") {
		t.Errorf("tenant list:\n%s", table)
	}
	list := c.ok("tenant", "list", "-o", "json")

	dir := t.TempDir()
	spec := func(name, tenant, image string) string {
		p := filepath.Join(dir, name+".yaml")
		body := fmt.Sprintf("name: %s\ntenant: %s\nworkers: 1\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\n"+
			"command: [stormdock, worker, wordcount, --rate, '2']\ngracePeriod: 2s\n", name, tenant, image)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out = c.ok("job", "submit", spec("wa", "a", tag), "--token", tokens["a"], "--wait")
	if !strings.Contains(out, "pinned for generation 1: "+pinned) || !strings.Contains(out, "all 1 workers running") {
		t.Fatalf("a's job: %s", out)
	}
	// b names a's image: by tag (not on the node under that name: a pull with b's
	// credentials) and by digest (on the node: the registry check with b's credentials).
	for job, image := range map[string]string{"wb": tag, "wbd": pinned} {
		if out := c.ok("job", "submit", spec(job, "b", image), "--token", tokens["b"]); !strings.Contains(out, "not pinned, no worker will run it") {
			t.Errorf("b's submit of %s: %s", job, out)
		}
		want := fmt.Sprintf("image pull failed: image %s: tenant b has no credentials for registry %s: give the tenant registry credentials with `stormdock tenant registry-auth b FILE`, or ask the admin to share it", image, srv.Addr)
		testenv.EventuallyWith(t, job+" refused", 60*time.Second, func() (bool, string) {
			st := c.status(job, tokens["b"])
			if len(st.Workers) != 1 {
				return false, fmt.Sprintf("%+v", st.Workers)
			}
			w := st.Workers[0]
			return w.State == cluster.WorkerFailed && strings.HasPrefix(w.LastExit, want) && w.PID == 0, fmt.Sprintf("%+v", w)
		})
		st := c.status(job, tokens["b"])
		t.Logf("%s: %s", job, st.Workers[0].LastExit)
		if ids := jobImages(t, job); len(ids) != 0 {
			t.Fatalf("b's job %s has containers running %v", job, ids)
		}
	}
	c.refused("needs the admin token", "image", "share", "--token", tokens["b"], srv.Addr+"/private/")
	c.ok("image", "share", srv.Addr+"/private/")
	if out := c.ok("image", "shared"); !strings.Contains(out, srv.Addr+"/private") {
		t.Errorf("image shared: %s", out)
	}
	for _, job := range []string{"wb", "wbd"} {
		testenv.EventuallyWith(t, job+" running once shared", 90*time.Second, func() (bool, string) {
			st := c.status(job, tokens["b"])
			return len(st.Workers) == 1 && st.Workers[0].State == cluster.WorkerRunning, fmt.Sprintf("%+v", st.Workers)
		})
	}

	events := c.ok("events", "-o", "json")
	// Stopped, so that its output is complete (Wait waits for the copy).
	_ = up.Process.Signal(syscall.SIGKILL)
	_ = up.Wait()
	for _, secret := range []string{pass, nodePass, base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)),
		base64.StdEncoding.EncodeToString([]byte(nodeUser + ":" + nodePass))} {
		// Sealed with the masters' keyring (up makes one): not in the store either.
		store, err := os.ReadFile(filepath.Join(data, "store.json"))
		if err != nil {
			t.Fatal(err)
		}
		for what, text := range map[string]string{"tenant list -o json": list, "events": events, "the cluster's output": upOut.String(),
			"the store (store.json)": string(store)} {
			if strings.Contains(text, secret) {
				t.Errorf("a credential (%s...) is in %s", secret[:4], what)
			}
		}
	}
}
