package agents_test

import (
	"errors"
	"fmt"
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
	"github.com/stormdock/stormdock/agents/leasefile"
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
func asNobody(args ...string) (string, error) { return asUID(65534, args...) }

// asUID runs a command as uid:uid with no supplementary group, and returns its output.
func asUID(uid uint32, args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// owned checks a file's mode and owner from the host.
func owned(t *testing.T, path string, mode os.FileMode, uid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Error(err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != mode || int(st.Uid) != uid || int(st.Gid) != uid {
		t.Errorf("%s: mode %v owner %d:%d; want %v %d:%d", path, fi.Mode().Perm(), st.Uid, st.Gid, mode, uid, uid)
	}
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

// TestTenantsApart: two tenants' process workers run as their own uids (gid the same, no
// supplementary groups, no_new_privs, no capabilities), never root nor the agent's; each
// worker's lease directory, live configuration, sender token and log are its own, and
// tenant B's worker, probing as itself, reads none of tenant A's, nor A's environment
// through /proc, nor the agent's, and cannot signal A's worker.
func TestTenantsApart(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	h.start(h.cfg, h.agentStore())

	const uidA, uidB = tenantUID, tenantUID + 2
	a := h.wa("a", 0, 1, "run")
	a.Tenant, a.UID = "a", uidA
	a.Key.Link = "dc-a"
	a.OutputToken = "sdo_a-only"
	a.Env["SECRET"] = "a-secret-value"
	h.assign(a)
	h.waitRecord("A's worker runs", testenv.Timeout(20*time.Second), allRunning("a@dc-a/0"))
	wA := h.waitReports("a.dc-a.0", 1)[0]

	leaseA := filepath.Dir(wA.Env[agents.EnvConfig])
	logs, _ := filepath.Glob(filepath.Join(h.stateDir, "process", "logs", "*a.dc-a.0.log"))
	if len(logs) != 1 {
		t.Fatalf("A's log: %v", logs)
	}
	filesA := []string{leaseA + "/lease", wA.Env[agents.EnvConfig], wA.Env[agents.EnvOutputTokenFile], logs[0],
		fmt.Sprintf("/proc/%d/environ", wA.PID), fmt.Sprintf("/proc/%d/environ", os.Getpid())}
	// B's worker probes as itself, and writes what it got where the test reads it.
	probe := filepath.Join(h.helperDir, "probe.out")
	script := `out=$PROBE_OUT.tmp; : > $out
for f in $PROBE_FILES; do if cat "$f" >/dev/null 2>&1; then echo "READ $f" >> $out; else echo "DENIED $f" >> $out; fi; done
if ls "$PROBE_DIR" >/dev/null 2>&1; then echo "LISTED $PROBE_DIR" >> $out; else echo "DENIED $PROBE_DIR" >> $out; fi
if kill -0 $PROBE_PID 2>/dev/null; then echo "SIGNALLED $PROBE_PID" >> $out; else echo "DENIED kill $PROBE_PID" >> $out; fi
if cat "$STORMDOCK_CONFIG" >/dev/null 2>&1; then echo "OWN config" >> $out; fi
mv $out $PROBE_OUT; exec sleep 600`
	b := h.wa("b", 0, 1, "run")
	b.Tenant, b.UID = "b", uidB
	b.Command = []string{"/bin/sh", "-c", script}
	b.Env = map[string]string{"PROBE_OUT": probe, "PROBE_FILES": strings.Join(filesA, " "), "PROBE_DIR": leaseA, "PROBE_PID": fmt.Sprint(wA.PID)}
	h.assign(a, b)
	h.waitRecord("B's probe runs", testenv.Timeout(20*time.Second), allRunning("a@dc-a/0", "b/0"))
	var got string
	testenv.Eventually(t, "B's probe reports", 20*time.Second, func() bool {
		out, err := os.ReadFile(probe)
		got = string(out)
		return err == nil
	})
	for _, f := range filesA {
		if !strings.Contains(got, "DENIED "+f+"\n") {
			t.Errorf("B's worker was not refused %s:\n%s", f, got)
		}
	}
	for _, want := range []string{"DENIED " + leaseA + "\n", fmt.Sprintf("DENIED kill %d\n", wA.PID), "OWN config\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("B's probe lacks %q:\n%s", want, got)
		}
	}

	rec, _, _ := h.record()
	var pidB int
	for _, w := range rec.Workers {
		if w.Key.Job == "b" {
			pidB = w.PID
		}
	}
	for _, c := range []struct {
		what string
		pid  int
		uid  int
	}{{"A's worker", wA.PID, uidA}, {"A's lease launcher", wA.PPID, uidA}, {"B's worker", pidB, uidB}} {
		u := fmt.Sprint(c.uid)
		want := map[string]string{"Uid": strings.Repeat(u+" ", 3) + u, "Gid": strings.Repeat(u+" ", 3) + u, "Groups": "",
			"NoNewPrivs": "1", "CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapAmb": "0000000000000000"}
		for k, v := range want {
			if got := procStatus(t, c.pid, k); got != v {
				t.Errorf("%s (pid %d): %s %q, want %q", c.what, c.pid, k, got, v)
			}
		}
		if uid := procStatus(t, c.pid, "Uid"); strings.HasPrefix(uid, "0 ") || strings.HasPrefix(uid, fmt.Sprint(os.Geteuid())+" ") {
			t.Errorf("%s runs as root or the agent: %s", c.what, uid)
		}
	}
	owned(t, leaseA, 0o700, uidA)
	owned(t, wA.Env[agents.EnvConfig], 0o600, uidA)
	owned(t, wA.Env[agents.EnvOutputTokenFile], 0o400, uidA)
	owned(t, logs[0], 0o600, uidA)
}

// TestNoUIDNotRun: an assignment without a uid (a master older than the agent) is not run
// as anyone: the worker fails with the reason, one line.
func TestNoUIDNotRun(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	h.start(h.cfg, h.agentStore())
	w := h.wa("nouid", 0, 1, "run")
	w.UID = 0
	h.assign(w)
	rec := h.waitRecord("the worker fails", testenv.Timeout(20*time.Second), func(r cluster.NodeRecord) bool {
		return len(r.Workers) == 1 && r.Workers[0].State == cluster.WorkerFailed
	})
	if e := rec.Workers[0].LastExit; !strings.Contains(e, "no uid") || strings.Contains(e, "\n") {
		t.Errorf("last exit %q; want one line saying it has no uid", e)
	}
	if reps, _ := filepath.Glob(filepath.Join(h.helperDir, "*")); len(reps) != 0 {
		t.Errorf("the worker ran: %v", reps)
	}
}

// TestRunAsUser: with RunAs (the single-tenant opt-out), a tenant's process worker and its
// lease launcher run as that user with no new privileges, the launcher holds its shared
// lock on the lease, the worker finds its sender token, and nothing else of the agent's
// state is readable to it; the output router (a system worker) runs as its own uid with its
// own copy of the store's credentials, which the tenant's worker cannot read.
func TestRunAsUser(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	credFile := filepath.Join(h.stateDir, "store.credentials")
	if err := os.WriteFile(credFile, []byte("stormdock:s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := h.cfg
	cfg.RunAs = &isolation.User{UID: 65534, GID: 65534, Name: "nobody"}
	cfg.StoreCredentialsFile = credFile
	h.start(cfg, h.agentStore())

	tenant := h.wa("mirror", 0, 1, "run")
	tenant.Key.Link = "dc-a"
	tenant.OutputToken = "sdo_only-for-this-worker"
	router := h.wa("mirror.router", 0, 1, "run")
	router.System, router.UID = true, tenantUID+1
	h.assign(tenant, router)
	h.waitRecord("both workers run", testenv.Timeout(20*time.Second), allRunning("mirror@dc-a/0", "mirror.router/0"))

	w := h.waitReports("mirror.dc-a.0", 1)[0]
	for what, pid := range map[string]int{"worker": w.PID, "lease launcher": w.PPID} {
		if uid, nnp := procStatus(t, pid, "Uid"), procStatus(t, pid, "NoNewPrivs"); uid != "65534 65534 65534 65534" || nnp != "1" {
			t.Errorf("the tenant's %s (pid %d) runs as uid %q with no_new_privs %q; want 65534 and 1", what, pid, uid, nnp)
		}
	}
	r := h.waitReports("mirror.router.0", 1)[0]
	ru := fmt.Sprint(tenantUID + 1)
	if uid := procStatus(t, r.PID, "Uid"); uid != strings.Repeat(ru+" ", 3)+ru {
		t.Errorf("the router worker runs as uid %q; want its own, %s", uid, ru)
	}
	routerCreds := r.Env[agents.EnvStoreCredentialsFile]
	if b, err := os.ReadFile(routerCreds); routerCreds == credFile || err != nil || string(b) != "stormdock:s3cret\n" {
		t.Errorf("router's %s = %q (%q, %v); want its own copy of %s", agents.EnvStoreCredentialsFile, routerCreds, b, err, credFile)
	}
	owned(t, routerCreds, 0o400, tenantUID+1)
	if out, err := asNobody("cat", routerCreds); err == nil {
		t.Errorf("the tenant's worker user reads the router's credentials: %q", out)
	}
	if out, err := asUID(tenantUID, "cat", routerCreds); err == nil {
		t.Errorf("the tenant's uid reads the router's credentials: %q", out)
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
	if out, err := asNobody("cat", lease); err != nil {
		t.Errorf("the worker reading its lease: %q, %v", out, err)
	} else if _, err := leasefile.Parse([]byte(out)); err != nil {
		t.Errorf("the worker's lease %q: %v", out, err)
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
	leases, _ := filepath.EvalSymlinks(filepath.Join(h.stateDir, "leases"))
	for _, d := range []string{h.stateDir, leases, filepath.Join(h.stateDir, "workers")} {
		if out, err := asNobody("ls", d); err == nil {
			t.Errorf("the worker's user lists %s: %q", d, out)
		}
	}
}

// TestRunAsRootRefused: --run-as root is no opt-out.
func TestRunAsRootRefused(t *testing.T) {
	h := newHarness(t, "mem")
	cfg := h.cfg
	cfg.RunAs = &isolation.User{UID: 0, GID: 0, Name: "root"}
	_, err := agents.New(cfg, h.agentStore(), agents.Driver{Isolation: cluster.IsolationProcess, Driver: h.drv})
	if err == nil || !strings.Contains(err.Error(), "never runs as root") {
		t.Fatalf("New with --run-as root: %v", err)
	}
}

// TestLeasesBelowRun: a root agent whose state directory the tenants' uids cannot reach (a
// data directory below /root) keeps its leases below /run, linked from the state
// directory, and its workers run; the agent's next start keeps the place.
func TestLeasesBelowRun(t *testing.T) {
	testenv.Root(t)
	h := newHarness(t, "mem")
	if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(h.stateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	ra := h.start(h.cfg, h.agentStore())
	h.assign(h.wa("r", 0, 1, "run"))
	first := h.waitRecord("the worker runs", testenv.Timeout(20*time.Second), allRunning("r/0"))
	link := filepath.Join(h.stateDir, "leases")
	target, err := os.Readlink(link)
	if err != nil || !strings.HasPrefix(target, "/run/stormdock/leases/") {
		t.Fatalf("leases at %q (%v); want a link below /run/stormdock/leases", target, err)
	}
	w := h.waitReports("r.0", 1)[0]
	if cfg := w.Env[agents.EnvConfig]; !strings.HasPrefix(cfg, target+"/") {
		t.Errorf("the worker's configuration %s is not below %s", cfg, target)
	}
	if err := ra.stop(); err != nil {
		t.Fatal(err)
	}
	h.start(h.cfg, h.agentStore())
	h.waitRecord("the worker is adopted by the new agent", testenv.Timeout(20*time.Second), func(r cluster.NodeRecord) bool {
		return r.Agent != first.Agent && allRunning("r/0")(r)
	})
	if again, _ := os.Readlink(link); again != target {
		t.Errorf("after a restart the leases link to %q, want %q", again, target)
	}
}
