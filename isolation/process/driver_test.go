package process_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/drivertest"
	"github.com/stormdock/stormdock/isolation/process"
)

var (
	hog string // the static test worker, built by TestMain
	// shimBin is cmd/stormdock-shim, built by TestMain: the drivers under test start their
	// workers with it, as agents do, unless a test asks for the fallback (selfShim).
	shimBin string
	// parent is the cgroup parent of this test binary's workers, removed at the end.
	parent = fmt.Sprintf("/stormdock-test-%d", os.Getpid())
)

const helperEnv = "STORMDOCK_PROCESS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "new-driver":
		// Run as an unprivileged user by TestNotRoot.
		_, err := process.New(process.Config{CgroupParent: parent + "-nobody", StateDir: os.Getenv("STATE_DIR")})
		fmt.Print(err)
		os.Exit(0)
	case "delegated":
		runDelegated()
		os.Exit(0)
	case "cgroup":
		// Run in place by the shim in TestPlacedBeforeExec: the first thing it does.
		b, _ := os.ReadFile("/proc/self/cgroup")
		os.Stdout.Write(b)
		os.Exit(0)
	}
	var err error
	if hog, err = testenv.Build("./isolation/testdata/hog"); err == nil {
		shimBin, err = testenv.Build("./cmd/stormdock-shim")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	removeCgroups(parent)
	testenv.RemoveBuilds()
	os.Exit(code)
}

// cgroupDirs are the directories of a cgroup in every hierarchy this machine has.
func cgroupDirs(name string) []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{filepath.Join("/sys/fs/cgroup", name)}
	}
	var out []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if e.IsDir() && e.Name() != "unified" {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name(), name))
		}
	}
	return out
}

// removeCgroups kills whatever is left below name and removes the cgroups, deepest first:
// the last line of cleanup, independent of the driver.
func removeCgroups(name string) {
	for _, dir := range cgroupDirs(name) {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for range 50 {
				for _, pid := range readPids(filepath.Join(dirs[i], "cgroup.procs")) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				if err := os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
				// TestMain's last-resort cleanup has no testing.TB for testenv.Eventually:
				// retry while the kernel tears the killed processes down.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

func readPids(file string) []int {
	b, _ := os.ReadFile(file)
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// kernelFile is a cgroup file of worker id, v1 (controller given) or v2.
func kernelFile(id, controller, v1name, v2name string) string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return filepath.Join("/sys/fs/cgroup", parent, id, v2name)
	}
	return filepath.Join("/sys/fs/cgroup", controller, parent, id, v1name)
}

func readInt(t *testing.T, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1
	}
	n, err := strconv.ParseInt(strings.Fields(s)[0], 10, 64)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	return n
}

var seq atomic.Int64

func config(t *testing.T, stateDir string) process.Config {
	return process.Config{CgroupParent: parent, StateDir: stateDir, PollInterval: 20 * time.Millisecond, Shim: shimBin}
}

// selfShim is the shim of a driver whose binary has no stormdock-shim beside it: the binary
// itself (this test binary, which imports the driver), as a go run build of stormdock has.
const selfShim = "/proc/self/exe"

func harness() drivertest.Harness {
	return drivertest.Harness{
		Factory: func(t *testing.T) func() isolation.Driver {
			testenv.Cgroups(t)
			state := t.TempDir()
			return func() isolation.Driver {
				d, err := process.New(config(t, state))
				if err != nil {
					t.Fatalf("new driver: %v", err)
				}
				return d
			}
		},
		Spec: func(t *testing.T, id string, args ...string) isolation.Spec {
			return isolation.Spec{
				ID: id, Job: "test", Tenant: "t", Worker: int(seq.Add(1)), Node: "n1",
				Command:     append([]string{hog}, args...),
				MemoryBytes: 64 * isolation.MiB, MilliCPU: 500,
				LogDir: t.TempDir(),
			}
		},
		HostPIDs: func(t *testing.T, w isolation.Worker) []int {
			return readPids(kernelFile(w.Spec.ID, "pids", "cgroup.procs", "cgroup.procs"))
		},
		KernelLimits: func(t *testing.T, w isolation.Worker) isolation.Limits {
			id := w.Spec.ID
			l := isolation.Limits{
				MemoryBytes: readInt(t, kernelFile(id, "memory", "memory.limit_in_bytes", "memory.max")),
				Pids:        readInt(t, kernelFile(id, "pids", "pids.max", "pids.max")),
			}
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				l.MemorySwapBytes = l.MemoryBytes + readInt(t, kernelFile(id, "", "", "memory.swap.max"))
				b, _ := os.ReadFile(kernelFile(id, "", "", "cpu.max"))
				var q, p int64
				fmt.Sscan(string(b), &q, &p)
				l.CPUQuota, l.CPUPeriod = time.Duration(q)*time.Microsecond, time.Duration(p)*time.Microsecond
				return l
			}
			l.MemorySwapBytes = readInt(t, kernelFile(id, "memory", "memory.memsw.limit_in_bytes", ""))
			l.CPUQuota = time.Duration(readInt(t, kernelFile(id, "cpu", "cpu.cfs_quota_us", ""))) * time.Microsecond
			l.CPUPeriod = time.Duration(readInt(t, kernelFile(id, "cpu", "cpu.cfs_period_us", ""))) * time.Microsecond
			return l
		},
		Exists: func(t *testing.T, w isolation.Worker) bool {
			for _, dir := range cgroupDirs(filepath.Join(parent, w.Spec.ID)) {
				if _, err := os.Stat(dir); err == nil {
					return true
				}
			}
			return false
		},
	}
}

func TestSuite(t *testing.T) {
	drivertest.RunSuite(t, harness())
}

func newDriver(t *testing.T) *process.Driver { return newDriverWith(t, shimBin) }

// newDriverWith is a driver whose workers start with the given shim binary.
func newDriverWith(t *testing.T, shim string) *process.Driver {
	testenv.Cgroups(t)
	cfg := config(t, t.TempDir())
	cfg.Shim = shim
	d, err := process.New(cfg)
	if err != nil {
		t.Fatalf("new driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func stopOnCleanup(t *testing.T, d *process.Driver, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = d.Stop(ctx, id, 0)
	})
}

// The program runs inside its cgroup from its first instruction: cat reports its own cgroup
// before doing anything else. So does the lease launcher when it is the shim's own binary:
// stormdock-shim's, exec'd afresh from its placed thread (v1) or run in place (v2, cloned into
// its cgroup), the cat it runs reporting the cgroup it inherited; and that of a binary that
// is its own shim (stormdock without stormdock-shim beside it; here this test binary, which
// reports its cgroup first thing), moved by the driver and run in place.
func TestPlacedBeforeExec(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lease := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		shim string
		cmd  []string
		env  map[string]string
	}{
		{"exec", shimBin, []string{"cat", "/proc/self/cgroup"}, nil},
		{"exec by self shim", selfShim, []string{"cat", "/proc/self/cgroup"}, nil},
		{"launcher in place", shimBin, []string{shimBin, "launch", "--lease", lease, "--ttl", "1m", "--", "cat", "/proc/self/cgroup"}, nil},
		{"in place by self shim", selfShim, []string{self}, map[string]string{helperEnv: "cgroup"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriverWith(t, tc.shim)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := harness().Spec(t, "placed-"+strings.ReplaceAll(tc.name, " ", "-"), "unused")
			spec.Command, spec.Env = tc.cmd, tc.env
			w, err := d.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			stopOnCleanup(t, d, spec.ID)
			ex, err := d.Wait(ctx, spec.ID)
			if err != nil || !ex.Success() {
				out, _ := os.ReadFile(w.LogPath)
				t.Fatalf("wait: %v, %v\n%s", ex, err, out)
			}
			out, err := os.ReadFile(w.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			want := d.CgroupPath(spec.ID)
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if strings.Contains(line, ":memory:") || strings.Contains(line, ":pids:") || strings.HasPrefix(line, "0::") && d.CgroupVersion() == 2 {
					if !strings.HasSuffix(line, want) {
						t.Fatalf("first thing the program saw: %q, want cgroup %s", line, want)
					}
				}
			}
			if !strings.Contains(string(out), want) {
				t.Fatalf("program output %q does not name cgroup %s", out, want)
			}
		})
	}
}

// The worker sees the contract's identity variables.
func TestEnvironment(t *testing.T) {
	d := newDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := harness().Spec(t, "env", "unused")
	spec.Command = []string{"env"}
	spec.Env = map[string]string{"STORMDOCK_DC": "dc-a", "STORMDOCK_JOB": "overridden"}
	w, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, d, spec.ID)
	if _, err := d.Wait(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(w.LogPath)
	for _, kv := range []string{"STORMDOCK_JOB=test", "STORMDOCK_DC=dc-a", "STORMDOCK_NODE=n1", "STORMDOCK_WORKER=" + strconv.Itoa(spec.Worker)} {
		if !strings.Contains(string(out), kv+"\n") {
			t.Errorf("worker env lacks %s:\n%s", kv, out)
		}
	}
	if strings.Contains(string(out), "_STORMDOCK_ISOLATION_SHIM") {
		t.Errorf("the shim's marker leaked into the worker's environment:\n%s", out)
	}
}

func TestMissingCommand(t *testing.T) {
	d := newDriver(t)
	spec := harness().Spec(t, "missing", "x")
	spec.Command = []string{"/nonexistent/worker"}
	_, err := d.Start(context.Background(), spec)
	if !errors.Is(err, isolation.ErrInvalidSpec) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("start: %v, want ErrInvalidSpec naming the missing file", err)
	}
	t.Logf("missing command: %v", err)
	if harness().Exists(t, isolation.Worker{Spec: spec}) {
		t.Fatalf("failed start left its cgroup")
	}
	spec.Command = []string{"no-such-program-anywhere"}
	if _, err := d.Start(context.Background(), spec); !errors.Is(err, isolation.ErrInvalidSpec) {
		t.Fatalf("start: %v, want ErrInvalidSpec", err)
	}
}

func TestLogCapped(t *testing.T) {
	testenv.Cgroups(t)
	cfg := config(t, t.TempDir())
	cfg.LogCheckInterval = 20 * time.Millisecond
	d, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	spec := harness().Spec(t, "spew", "spew", "600")
	spec.LogMaxBytes = 100 << 10
	w, err := d.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, d, spec.ID)
	testenv.EventuallyWith(t, "the log capped", 10*time.Second, func() (bool, string) {
		cur, err1 := os.Stat(w.LogPath)
		old, err2 := os.Stat(w.LogPath + ".1")
		// The rotated file holds what was written up to the check that rotated it, which on a
		// loaded machine can be well past the cap; the live log is what the cap bounds.
		if err1 == nil && err2 == nil && cur.Size() <= spec.LogMaxBytes && old.Size() >= spec.LogMaxBytes {
			// "ready" comes after the 600 lines: it must be in the kept log or its rotation.
			b1, _ := os.ReadFile(w.LogPath)
			b2, _ := os.ReadFile(w.LogPath + ".1")
			if strings.Contains(string(b1)+string(b2), "ready") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("log not capped: %v %v / %v %v", cur, err1, old, err2)
	})
	// Nothing written between the rotation's last copy and its truncation is lost (the
	// worker is frozen for that instant): the rotated part and the live log hold numbered
	// lines that run on without a gap up to the last, then "ready".
	b1, _ := os.ReadFile(w.LogPath + ".1")
	b2, _ := os.ReadFile(w.LogPath)
	// The rotated part starts mid-line (the newest bytes of the log up to the cap).
	_, kept, _ := strings.Cut(string(b1), "\n")
	next := -1
	for line := range strings.Lines(kept + string(b2)) {
		var n int
		if _, err := fmt.Sscanf(line, "%d ", &n); err != nil {
			continue // "ready"
		}
		if next >= 0 && n != next {
			t.Errorf("line %d follows line %d: %d lines lost", n, next-1, n-next)
		}
		next = n + 1
	}
	if next != 600 {
		t.Errorf("the last numbered line kept is %d, want 599", next-1)
	}
}

// A worker that ended while no driver watched is reported ended, and its cgroup cleaned up.
func TestAdoptEndedWhileAway(t *testing.T) {
	testenv.Cgroups(t)
	state := t.TempDir()
	d1, err := process.New(config(t, state))
	if err != nil {
		t.Fatal(err)
	}
	spec := harness().Spec(t, "away", "tree", "1", "1")
	w, err := d1.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	d1.Close()
	if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d2, err := process.New(config(t, state))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d2.Close() })
	stopOnCleanup(t, d2, spec.ID)
	// The killed main process may not be reaped yet by d1's background reaper; either way it
	// must not count as running. Adopt once the kill has taken effect.
	testenv.Eventually(t, "the killed worker dead", 5*time.Second, func() bool { return !running(w.PID) })
	got, err := d2.Adopt(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("adopt = %v, %v", got, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ex, err := d2.Wait(ctx, spec.ID)
	if err != nil || ex.Code != isolation.ExitUnknown {
		t.Fatalf("wait = %s, %v; want an unknown exit", ex, err)
	}
	if harness().Exists(t, w) {
		t.Fatalf("cgroup of a worker that ended while away was not removed")
	}
	if _, err := d2.Stop(ctx, spec.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, spec.ID+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left after stop: %v", err)
	}
}

// Without permission to create cgroups the driver says so, and what to do, in one line.
func TestNotRoot(t *testing.T) {
	testenv.Root(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary lives in a private build dir: copy it where nobody can run it.
	dir, err := os.MkdirTemp("", "notroot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "test.bin")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	os.Mkdir(state, 0o777)
	os.Chmod(state, 0o777)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), helperEnv+"=new-driver", "STATE_DIR="+state)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	msg := string(out)
	t.Logf("as uid 65534: %s", msg)
	if !strings.Contains(msg, "isolation unavailable") || !strings.Contains(msg, "run the agent as root") || strings.Contains(msg, "\n") {
		t.Fatalf("error as non-root = %q, want one line saying cgroups are not writable and what to do", msg)
	}
}

// BenchmarkStartStop: go test -run '^$' -bench StartStop -benchtime 1x ./isolation/process/
func BenchmarkStartStop(b *testing.B) {
	testenv.Cgroups(b)
	d, err := process.New(process.Config{CgroupParent: parent, StateDir: b.TempDir(), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	dir := b.TempDir()
	drivertest.BenchmarkStartStop(b, d, func(id string) isolation.Spec {
		return isolation.Spec{ID: id, Command: []string{hog, "term"}, MemoryBytes: 64 * isolation.MiB, MilliCPU: 500, LogDir: dir}
	})
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// BenchmarkUsage is one read of a running worker's usage, which agents take of every worker
// often: go test -run '^$' -bench Usage ./isolation/process/
func BenchmarkUsage(b *testing.B) {
	testenv.Cgroups(b)
	d, err := process.New(process.Config{CgroupParent: parent, StateDir: b.TempDir(), Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	spec := isolation.Spec{ID: "bench-usage", Command: []string{hog, "sleep"}, MemoryBytes: 64 * isolation.MiB, MilliCPU: 500, LogDir: b.TempDir()}
	if _, err := d.Start(ctx, spec); err != nil {
		b.Fatal(err)
	}
	defer d.Stop(ctx, spec.ID, 0)
	for b.Loop() {
		if _, err := d.Usage(ctx, spec.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// startLog keeps the driver's "start phases" records, as attribute maps.
type startLog struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (l *startLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *startLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *startLog) WithGroup(string) slog.Handler            { return l }
func (l *startLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "start phases" {
		return nil
	}
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	l.recs = append(l.recs, m)
	l.mu.Unlock()
	return nil
}

// On cgroup v2, where the kernel can (Linux 5.7), the shim is started in the worker's cgroup
// (clone3 with CLONE_INTO_CGROUP) and never moved; on v1 (and older kernels) it is moved into
// the cgroup after the fork, before it is released. Either way the program starts inside
// (TestPlacedBeforeExec).
func TestClonedIntoCgroup(t *testing.T) {
	testenv.Cgroups(t)
	log := &startLog{}
	cfg := config(t, t.TempDir())
	cfg.Logger = slog.New(log)
	d, err := process.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	spec := harness().Spec(t, "cloned", "sleep")
	if _, err := d.Start(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	stopOnCleanup(t, d, spec.ID)
	log.mu.Lock()
	defer log.mu.Unlock()
	if len(log.recs) != 1 {
		t.Fatalf("%d start phase records, want 1", len(log.recs))
	}
	rec := log.recs[0]
	_, moved := rec["place"]
	var u syscall.Utsname
	_ = syscall.Uname(&u)
	release := unixString(u.Release[:])
	want := d.CgroupVersion() == 2 && kernelAtLeast(release, 5, 7)
	t.Logf("cgroup v%d, kernel %s: %v", d.CgroupVersion(), release, rec)
	if got := rec["clone_into_cgroup"] == "true"; got != want || moved == want {
		t.Fatalf("cgroup v%d, kernel %s: cloned into the cgroup %v, moved after the fork %v; want cloned %v", d.CgroupVersion(), release, got, moved, want)
	}
}

func unixString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// kernelAtLeast reports whether a kernel release ("6.1.0-57-amd64") is major.minor or later.
func kernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(release, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}
