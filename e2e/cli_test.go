package e2e

import (
	"bytes"
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
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// cli runs the stormdock binary against a local cluster.
type cli struct {
	t    *testing.T
	env  []string
	data string
}

// run runs one command and returns its output and exit code.
func (c *cli) run(args ...string) (string, int) {
	c.t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), c.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatal(err)
	}
	return out.String(), code
}

// ok runs a command that must succeed.
func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("stormdock %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// refused runs a command that must fail with exit code 2 and a message containing want.
func (c *cli) refused(want string, args ...string) {
	c.t.Helper()
	out, code := c.run(args...)
	if code != 2 || !strings.Contains(out, want) {
		c.t.Fatalf("stormdock %s: exit %d, output %q; want exit 2 and %q", strings.Join(args, " "), code, out, want)
	}
	if strings.Count(strings.TrimSpace(out), "\n") > 0 {
		c.t.Errorf("stormdock %s: error is not one line: %q", strings.Join(args, " "), out)
	}
}

func (c *cli) status(job string, token ...string) api.JobStatus {
	c.t.Helper()
	args := []string{"job", "status", job, "-o", "json"}
	if len(token) > 0 {
		args = append(args, "--token", token[0])
	}
	var st api.JobStatus
	if err := json.Unmarshal([]byte(c.ok(args...)), &st); err != nil {
		c.t.Fatal(err)
	}
	return st
}

// TestCLIAgainstLocalCluster is issue 6's end-to-end run through the CLI binary against
// `stormdock up`.
func TestCLIAgainstLocalCluster(t *testing.T) {
	testenv.Cgroups(t)
	data := t.TempDir()
	addr := clustertest.FreeAddr(t)
	// No --master, no --ca: the CLI finds the local cluster's URL (https) and CA in its data
	// directory.
	c := &cli{t: t, data: data, env: []string{"STORMDOCK_DATA=" + data}}
	up := exec.Command(binary, "up", "--nodes", "6", "--dcs", "dc-a,dc-b,dc-c", "--racks-per-dc", "2", "--slots", "4",
		"--data", data, "--api", addr, "--session-timeout", "3s", "--log-level", "warn")
	var upOut bytes.Buffer
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	upDone := make(chan error, 1)
	go func() { upDone <- up.Wait() }()
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGKILL)
		clustertest.KillCgroupTree("/stormdock-local/" + filepath.Base(data))
	})
	testenv.Eventually(t, "local cluster up", 30*time.Second, func() bool {
		out, code := c.run("node", "list", "-o", "json")
		var nodes []api.NodeView
		return code == 0 && json.Unmarshal([]byte(out), &nodes) == nil && len(nodes) == 6
	})

	c.ok("tenant", "create", "t1", "--max-workers", "10")
	c.ok("tenant", "create", "t2")
	// A data directory holding another cluster's admin token: the refusal names the file.
	otherData := t.TempDir()
	if err := os.WriteFile(filepath.Join(otherData, api.AdminTokenFile), []byte(api.NewToken()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stranger := &cli{t: t, env: []string{"STORMDOCK_DATA=" + otherData, "STORMDOCK_MASTER=https://" + addr,
		"STORMDOCK_CA=" + filepath.Join(data, "ca.crt")}}
	stranger.refused("read from "+filepath.Join(otherData, api.AdminTokenFile), "job", "list")
	// job status shows each worker's pid.
	dir := t.TempDir()
	specFile := filepath.Join(dir, "wc.yaml")
	spec := "name: wc\ntenant: t1\nworkers: 6\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [stormdock, worker, wordcount, --rate, '2']\nplacement: {spread: [dc, rack]}\ngracePeriod: 2s\n"
	if err := os.WriteFile(specFile, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("job", "submit", specFile, "--wait"); !strings.Contains(out, "all 6 workers running") {
		t.Fatalf("submit --wait: %s", out)
	}
	pids := map[int]int{}
	for _, w := range c.status("wc").Workers {
		pids[w.Worker] = w.PID
	}

	// Scale out: the six keep their processes.
	c.ok("job", "scale", "wc", "--workers", "9", "--wait")
	for _, w := range c.status("wc").Workers {
		if old, ok := pids[w.Worker]; ok && old != w.PID {
			t.Errorf("scale out restarted worker %d (pid %d -> %d)", w.Worker, old, w.PID)
		}
	}
	// Scale in: only the surplus stops, and the spread stays even.
	c.ok("job", "scale", "wc", "--workers", "6", "--wait")
	st := c.status("wc")
	perDC := map[string]int{}
	for _, w := range st.Workers {
		if pids[w.Worker] != w.PID || !clustertest.Alive(w.PID) {
			t.Errorf("scale in touched worker %d (pid %d -> %d)", w.Worker, pids[w.Worker], w.PID)
		}
		perDC[w.DC]++
	}
	if len(st.Workers) != 6 || perDC["dc-a"] != 2 || perDC["dc-b"] != 2 || perDC["dc-c"] != 2 {
		t.Errorf("after scale in: %d workers, per dc %v; want 6, 2 per dc", len(st.Workers), perDC)
	}

	// Drain the node of worker 0: its workers move, with their grace period.
	drained := st.Workers[0].Node
	c.ok("node", "drain", drained)
	testenv.Eventually(t, "drained node emptied", 30*time.Second, func() bool {
		s := c.status("wc")
		for _, w := range s.Workers {
			if w.Node == drained || w.State != "running" {
				return false
			}
		}
		return s.Summary.Stopping == 0
	})
	c.ok("node", "undrain", drained)

	// Refusals change nothing.
	other := strings.Replace(strings.Replace(spec, "name: wc", "name: big", 1), "workers: 6", "workers: 5", 1)
	otherFile := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(otherFile, []byte(other), 0o644); err != nil {
		t.Fatal(err)
	}
	c.refused("tenant t1: 6 of 10 workers used, asked for 5 more", "job", "submit", otherFile)
	c.refused("tenant t1: 6 of 10 workers used, asked for 5 more", "job", "scale", "wc", "--workers", "11")
	t2 := strings.TrimSpace(c.ok("tenant", "token", "t2"))
	c.refused("the token of tenant t2 cannot act on tenant t1's jobs", "job", "scale", "wc", "--workers", "1", "--token", t2)
	c.refused("the token of tenant t2 cannot act on tenant t1's jobs", "job", "kill", "wc", "--token", t2)
	c.refused("the token of tenant t2 cannot act on tenant t1's jobs", "job", "status", "wc", "--token", t2)
	c.refused("this needs the admin token", "node", "drain", drained, "--token", t2)
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: bad\ntenant: t1\nworkers: 0\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [x]\ncolour: blue\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.refused("workers: must be at least 1 (line 3)", "job", "submit", bad)
	c.refused("colour: unknown field (line 6)", "job", "submit", bad)
	c.refused("takes one job spec FILE", "job", "submit")
	if out := c.ok("job", "list", "-o", "json"); strings.Count(out, `"name"`) != 1 {
		t.Errorf("refused calls changed the job list: %s", out)
	}
	if after := c.status("wc"); after.Summary.Workers != 6 || after.Summary.Running != 6 {
		t.Errorf("refused calls changed the job: %+v", after.Summary)
	}
	for _, line := range strings.Split(c.ok("node", "list"), "\n") {
		if len(line) > 100 {
			t.Errorf("table line over 100 columns: %q", line)
		}
	}

	// Kill, then stop the cluster: nothing is left running.
	final := c.status("wc")
	c.ok("job", "kill", "wc", "--grace", "1s", "--wait")
	for _, w := range final.Workers {
		if clustertest.Alive(w.PID) {
			t.Errorf("worker %d (pid %d) still runs after kill", w.Worker, w.PID)
		}
	}
	_ = up.Process.Signal(syscall.SIGINT)
	select {
	case err := <-upDone:
		if err != nil {
			t.Errorf("stormdock up exited with %v:\n%s", err, upOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("stormdock up did not stop on Ctrl-C")
	}
}

// TestDemo runs the README's run command's program to its end: exit 0, every worker gone.
func TestDemo(t *testing.T) {
	testenv.Cgroups(t)
	cmd := exec.Command(binary, "demo")
	cmd.Env = append(os.Environ(), "STORMDOCK_DATA="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"wordcount: 4/4 workers running", "node loss to replacements running", "workers restarted by scale to 8  0", "demo done"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	if m, _ := filepath.Glob(memoryDir("/stormdock-local/stormdock-demo-*")); len(m) > 0 {
		t.Errorf("demo left cgroups behind: %v", m)
	}
}

// TestRunSelfCommand: `stormdock run -- stormdock ARGS` runs this stormdock binary (in a
// container, the image's /stormdock), as a job's command does, with the default limits.
func TestRunSelfCommand(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) []string // the isolation flags
	}{
		{"process", func(t *testing.T) []string {
			testenv.Cgroups(t)
			return []string{"--isolation", "process"}
		}},
		{"docker", func(t *testing.T) []string {
			testenv.DockerSocket(t)
			tag := fmt.Sprintf("stormdock-e2e/run-self:%d", os.Getpid())
			c := &cli{t: t}
			c.ok("image", "build", "--tag", tag)
			t.Cleanup(func() {
				if out, err := exec.Command("docker", "rmi", "--force", tag).CombinedOutput(); err != nil {
					t.Logf("remove image %s: %v\n%s", tag, err, out)
				}
			})
			return []string{"--isolation", "docker", "--image", tag}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &cli{t: t}
			version := strings.TrimSpace(c.ok("version"))
			args := append([]string{"run"}, tt.setup(t)...)
			out := c.ok(append(args, "--", "stormdock", "version")...)
			// The version line proves the program ran and its output was echoed.
			for _, want := range []string{version, "memory 256Mi, cpu 0.5", "exited with code 0"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
