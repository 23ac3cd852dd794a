package agents_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
)

// openUp lets every user enter the directories from dir up to /tmp, as a deployment's
// state directory under /var/lib is: test directories are made for root alone.
func openUp(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

// asNobody runs a command as uid 65534, the way a worker runs, and returns its output.
func asNobody(args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func procStatus(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// TestRunAsUser: with RunAs, a tenant's process worker and its lease launcher run as that
// user with no new privileges, the launcher holds its shared lock on the lease, the worker
// finds its sender token, and nothing else of the agent's state is readable to it; the
// output router (a system worker) runs as the agent and gets the store's credentials.
func TestRunAsUser(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	openUp(t, filepath.Dir(h.stateDir), 0o711)
	openUp(t, h.helperDir, 0o777)
	binDir := t.TempDir()
	openUp(t, binDir, 0o755)
	bin := filepath.Join(binDir, "stormdock")
	b, err := os.ReadFile(stormdockBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	credFile := filepath.Join(h.stateDir, "store.credentials")
	if err := os.WriteFile(credFile, []byte("stormdock:s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := h.cfg
	cfg.Self = bin
	cfg.RunAs = &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	cfg.StoreCredentialsFile = credFile
	h.start(cfg, h.agentStore())

	tenant := h.wa("mirror", 0, 1, "run")
	tenant.Key.Link = "dc-a"
	tenant.OutputToken = "sdo_only-for-this-worker"
	router := h.wa("mirror.router", 0, 1, "run")
	router.System = true
	h.assign(tenant, router)
	h.waitRecord("both workers run", testenv.Timeout(20*time.Second), allRunning("mirror@dc-a/0", "mirror.router/0"))

	w := h.waitReports("mirror.dc-a.0", 1)[0]
	for what, pid := range map[string]int{"worker": w.PID, "lease launcher": w.PPID} {
		if uid, nnp := procStatus(t, pid, "Uid"), procStatus(t, pid, "NoNewPrivs"); uid != "65534 65534 65534 65534" || nnp != "1" {
			t.Errorf("the tenant's %s (pid %d) runs as uid %q with no_new_privs %q; want 65534 and 1", what, pid, uid, nnp)
		}
	}
	r := h.waitReports("mirror.router.0", 1)[0]
	if uid := procStatus(t, r.PID, "Uid"); !strings.HasPrefix(uid, "0 ") {
		t.Errorf("the router worker runs as uid %q; want the agent's (0)", uid)
	}
	if got := r.Env[agents.EnvStoreCredentialsFile]; got != credFile {
		t.Errorf("router's %s = %q, want %s", agents.EnvStoreCredentialsFile, got, credFile)
	}
	if got, ok := w.Env[agents.EnvStoreCredentialsFile]; ok {
		t.Errorf("a tenant's worker was given the store's credentials file %q", got)
	}

	// The launcher, as nobody, opened its lease and holds a shared lock on it: the keeper
	// cannot take the node lease exclusively.
	node := filepath.Join(h.stateDir, "leases", ".node")
	f, err := os.Open(node)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("exclusive lock of the node lease while workers run: %v; want EWOULDBLOCK (the launchers' shared locks)", err)
	}

	// What the worker's user reads of the agent's state: its lease and its token, nothing else.
	token := w.Env[agents.EnvOutputTokenFile]
	if out, err := asNobody("cat", token); err != nil || strings.TrimSpace(out) != tenant.OutputToken {
		t.Errorf("the worker reading its token %s: %q, %v", token, out, err)
	}
	lease := filepath.Join(filepath.Dir(token), "lease")
	if out, err := asNobody("cat", lease); err != nil || out != "" {
		t.Errorf("the worker reading its lease: %q, %v", out, err)
	}
	secret := []string{credFile, filepath.Join(h.stateDir, "node.json"), filepath.Join(h.stateDir, "agent.lock")}
	recs, _ := filepath.Glob(filepath.Join(h.stateDir, "workers", "*.json"))
	states, _ := filepath.Glob(filepath.Join(h.stateDir, "process", "*.json"))
	if len(recs) == 0 || len(states) == 0 {
		t.Fatalf("no worker records (%v) or driver states (%v) to check", recs, states)
	}
	secret = append(append(secret, recs...), states...)
	for _, p := range secret {
		if out, err := asNobody("cat", p); err == nil {
			t.Errorf("the worker's user reads %s: %.100q", p, out)
		}
	}
	for _, d := range []string{h.stateDir, filepath.Join(h.stateDir, "leases"), filepath.Join(h.stateDir, "workers")} {
		if out, err := asNobody("ls", d); err == nil {
			t.Errorf("the worker's user lists %s: %q", d, out)
		}
	}
}

// TestRunAsUnreachableStateDir: an agent whose workers' user cannot reach their leases
// refuses to start and says what to do.
func TestRunAsUnreachableStateDir(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem") // its state dir is inside a directory only root may enter
	cfg := h.cfg
	cfg.RunAs = &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	a, err := agents.New(cfg, h.agentStore(), agents.Driver{Isolation: cluster.IsolationProcess, Driver: h.drv})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(10*time.Second))
	defer cancel()
	err = a.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "cannot enter") || !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("Run with an unreachable state dir: %v", err)
	}
}
