// Package drivertest is the conformance suite every isolation driver passes: limits, OOM,
// fork bombs, clean stops, grace periods and adoption, checked against the real kernel.
package drivertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
)

// Harness adapts one driver to the suite.
type Harness struct {
	// Factory returns a constructor bound to fresh driver state (state dir, node, cgroup
	// parent) for one test; each call of the constructor is a new driver instance on that
	// same state, as an agent restart would make. The harness cleans the state up.
	Factory func(t *testing.T) func() isolation.Driver
	// Spec returns a spec that runs the hog test program (isolation/testdata/hog) with args.
	Spec func(t *testing.T, id string, args ...string) isolation.Spec
	// HostPIDs lists the host pids of a running worker, read without the driver.
	HostPIDs func(t *testing.T, w isolation.Worker) []int
	// KernelLimits reads a worker's limits without the driver: cgroup files, docker inspect.
	KernelLimits func(t *testing.T, w isolation.Worker) isolation.Limits
	// Exists reports whether anything of the worker (cgroup, container) is left.
	Exists func(t *testing.T, w isolation.Worker) bool
}

// RunSuite runs the conformance tests against the driver h adapts.
func RunSuite(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"LimitsApplied", testLimits},
		{"OOMKilled", testOOM},
		{"ForkBombHeld", testForkBomb},
		{"StopLeavesNothing", testStopTree},
		{"GraceThenExit", testGraceExit},
		{"GraceThenKill", testGraceKill},
		{"ExitCode", testExitCode},
		{"Signal", testSignal},
		{"Adopt", testAdopt},
		{"BadInput", testBadInput},
		{"Usage", testUsage},
		{"Logs", testLogs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, h)
		})
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(d))
	t.Cleanup(cancel)
	return ctx
}

// start starts a worker and stops it (no grace) when the test ends, whatever happened.
func start(t *testing.T, d isolation.Driver, spec isolation.Spec) isolation.Worker {
	t.Helper()
	w, err := d.Start(ctxFor(t, 60*time.Second), spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := d.Stop(ctx, spec.ID, 0); err != nil && !errors.Is(err, isolation.ErrNotFound) && !errors.Is(err, isolation.ErrClosed) {
			t.Errorf("cleanup stop %s: %v", spec.ID, err)
		}
		if dd, ok := d.(isolation.Discarder); ok {
			if err := dd.Discard(ctx, spec.ID); err != nil {
				t.Errorf("cleanup discard %s: %v", spec.ID, err)
			}
		}
	})
	return w
}

func newDriver(t *testing.T, h Harness) isolation.Driver {
	d := h.Factory(t)()
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func uniqueID(t *testing.T) string {
	s := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	return fmt.Sprintf("%s-%d", s, time.Now().UnixNano()%1e6)
}

func testLimits(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "sleep")
	spec.MemoryBytes, spec.MilliCPU, spec.Pids = 48*isolation.MiB, 500, 77
	w := start(t, d, spec)
	want := isolation.Limits{MemoryBytes: 48 * isolation.MiB, Pids: 77}
	for name, got := range map[string]isolation.Limits{
		"kernel": h.KernelLimits(t, w),
		"driver": mustLimits(t, d, spec.ID),
	} {
		if got.MemoryBytes != want.MemoryBytes {
			t.Errorf("%s memory limit = %d, want %d", name, got.MemoryBytes, want.MemoryBytes)
		}
		if got.MemorySwapBytes != want.MemoryBytes {
			t.Errorf("%s memory+swap limit = %d, want %d (no swap)", name, got.MemorySwapBytes, want.MemoryBytes)
		}
		if got.MilliCPU() != 500 {
			t.Errorf("%s cpu = quota %v / period %v = %d milli, want 500", name, got.CPUQuota, got.CPUPeriod, got.MilliCPU())
		}
		if got.Pids != want.Pids {
			t.Errorf("%s pids limit = %d, want %d", name, got.Pids, want.Pids)
		}
	}
}

func mustLimits(t *testing.T, d isolation.Driver, id string) isolation.Limits {
	t.Helper()
	l, err := d.Limits(ctxFor(t, 10*time.Second), id)
	if err != nil {
		t.Fatalf("limits: %v", err)
	}
	return l
}

func testOOM(t *testing.T, h Harness) {
	d := newDriver(t, h)
	// The worker runs a moment before it allocates, as real workers do: the docker engine
	// (20.10, cgroup v1) loses the OOM kill of a container that dies within its first tenth
	// of a second, its shim gone before it reads the kernel's notification (docs/events-and-logs.md,
	// Docker workers).
	spec := h.Spec(t, uniqueID(t), "alloc", "256", "500")
	spec.MemoryBytes = 32 * isolation.MiB
	start(t, d, spec)
	ex, err := d.Wait(ctxFor(t, 60*time.Second), spec.ID)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if !ex.OOMKilled || ex.Signal != syscall.SIGKILL || ex.Code != 137 {
		t.Fatalf("exit = %+v (%s), want OOM-killed by SIGKILL", ex, ex)
	}
	ex2, err := d.Stop(ctxFor(t, 30*time.Second), spec.ID, time.Second)
	if err != nil || !ex2.OOMKilled {
		t.Fatalf("stop after OOM = %+v, %v; want the same OOM exit", ex2, err)
	}
}

func testForkBomb(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "forkbomb")
	spec.MemoryBytes, spec.Pids = 512*isolation.MiB, 40
	w := start(t, d, spec)
	most := 0
	testenv.AssertUntil(t, "the fork bomb held", 3*time.Second, func() (bool, string) {
		// cgroup v1 may list a process more than once: count distinct pids.
		ps := slices.Compact(slices.Sorted(slices.Values(h.HostPIDs(t, w))))
		most = max(most, len(ps))
		if len(ps) > 40 {
			return false, fmt.Sprintf("fork bomb has %d processes, limit 40", len(ps))
		}
		// The machine stays usable: a fork outside the worker still works promptly (the
		// bound has room for a loaded machine).
		t0 := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return false, fmt.Sprintf("host fork failed during the fork bomb: %v", err)
		}
		if el := time.Since(t0); el > testenv.Timeout(2*time.Second) {
			return false, fmt.Sprintf("host fork took %v during the fork bomb", el)
		}
		return true, ""
	})
	if most < 3 {
		t.Fatalf("fork bomb never got going: at most %d processes", most)
	}
	// Held, not ended: the bomb is still running against its limit.
	if ws, err := d.List(ctxFor(t, 10*time.Second)); err != nil || len(ws) != 1 || !ws[0].Running() {
		t.Fatalf("fork bomb worker after %v: %+v, %v; want it still running", 3*time.Second, ws, err)
	}
	pids := procs(h.HostPIDs(t, w))
	if _, err := d.Stop(ctxFor(t, 60*time.Second), spec.ID, 0); err != nil {
		t.Fatalf("stop: %v", err)
	}
	assertGone(t, h, w, pids)
}

// proc names one process: pid plus start time, as pids are reused.
type proc struct {
	pid   int
	start string
}

func procs(pids []int) []proc {
	var out []proc
	for _, p := range pids {
		if s, ok := startTime(p); ok {
			out = append(out, proc{p, s})
		}
	}
	return out
}

func startTime(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}

// assertGone checks that no process of the worker and no cgroup or container is left.
func assertGone(t *testing.T, h Harness, w isolation.Worker, ps []proc) {
	t.Helper()
	testenv.EventuallyWith(t, "the processes of worker "+w.Spec.ID+" gone", 5*time.Second, func() (bool, string) {
		var left []int
		for _, p := range ps {
			if s, ok := startTime(p.pid); ok && s == p.start {
				left = append(left, p.pid)
			}
		}
		return len(left) == 0, fmt.Sprintf("processes %v survived its stop", left)
	})
	if h.Exists(t, w) {
		t.Fatalf("cgroup or container of worker %s left after stop", w.Spec.ID)
	}
}

// waitPIDs waits until the worker has at least n processes and returns them.
func waitPIDs(t *testing.T, h Harness, w isolation.Worker, n int) []int {
	t.Helper()
	var ps []int
	testenv.EventuallyWith(t, fmt.Sprintf("%d processes of worker %s", n, w.Spec.ID), 20*time.Second, func() (bool, string) {
		ps = slices.Compact(slices.Sorted(slices.Values(h.HostPIDs(t, w))))
		return len(ps) >= n, fmt.Sprintf("%d processes %v", len(ps), ps)
	})
	return ps
}

func testStopTree(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "tree", "2", "2")
	w := start(t, d, spec)
	ps := procs(waitPIDs(t, h, w, 7)) // main, 2 children, 4 grandchildren
	if !slices.ContainsFunc(ps, func(p proc) bool { return p.pid == w.PID }) {
		t.Fatalf("main pid %d not among the worker's processes %v", w.PID, ps)
	}
	ex, err := d.Stop(ctxFor(t, 60*time.Second), spec.ID, 2*time.Second)
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("exit: %s", ex)
	assertGone(t, h, w, ps)
	if _, err := d.Wait(ctxFor(t, time.Second), spec.ID); !errors.Is(err, isolation.ErrNotFound) {
		t.Fatalf("wait after stop: %v, want ErrNotFound", err)
	}
}

// waitReady waits until the worker's main process has set itself up (the hog then ignores
// SIGUSR2), so that a test does not race the program's start-up.
func waitReady(t *testing.T, pid int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("pid %d ready", pid), 10*time.Second, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			t.Fatalf("read status of %d: %v", pid, err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
				mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err == nil && mask&(1<<(syscall.SIGUSR2-1)) != 0 {
					return true
				}
			}
		}
		return false
	})
}

func testGraceExit(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "term")
	w := start(t, d, spec)
	waitReady(t, w.PID)
	t0 := time.Now()
	ex, err := d.Stop(ctxFor(t, 60*time.Second), spec.ID, 20*time.Second)
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	if el := time.Since(t0); el > 10*time.Second {
		t.Fatalf("a worker that exits on SIGTERM took %v to stop", el)
	}
	if !ex.Success() {
		t.Fatalf("exit = %s, want a clean exit after SIGTERM", ex)
	}
}

func testGraceKill(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "ignore-term")
	w := start(t, d, spec)
	waitReady(t, w.PID)
	const grace = time.Second
	t0 := time.Now()
	ex, err := d.Stop(ctxFor(t, 60*time.Second), spec.ID, grace)
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	el := time.Since(t0)
	if el < grace {
		t.Fatalf("stopped after %v, before the %v grace period was over", el, grace)
	}
	if el > grace+10*time.Second {
		t.Fatalf("stop took %v with a %v grace period", el, grace)
	}
	if ex.Signal != syscall.SIGKILL || ex.OOMKilled {
		t.Fatalf("exit = %s, want killed by SIGKILL", ex)
	}
	assertGone(t, h, w, nil)
}

// testSignal: a signal reaches the worker's program (through whatever runs it), and
// signalling an unknown or ended worker is harmless.
func testSignal(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "hup")
	w := start(t, d, spec)
	waitReady(t, w.PID)
	if err := d.Signal(ctxFor(t, 10*time.Second), spec.ID, syscall.SIGHUP); err != nil {
		t.Fatalf("signal: %v", err)
	}
	ex, err := d.Wait(ctxFor(t, 30*time.Second), spec.ID)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if ex.Code != 42 || ex.Signal != 0 {
		t.Fatalf("exit = %s, want code 42 (the program's answer to SIGHUP)", ex)
	}
	if err := d.Signal(ctxFor(t, 10*time.Second), spec.ID, syscall.SIGHUP); err != nil {
		t.Fatalf("signal of an ended worker: %v, want nil", err)
	}
	if err := d.Signal(ctxFor(t, 10*time.Second), "no-such-worker", syscall.SIGHUP); !errors.Is(err, isolation.ErrNotFound) {
		t.Fatalf("signal of an unknown worker: %v, want ErrNotFound", err)
	}
}

func testExitCode(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "exit", "3")
	start(t, d, spec)
	ex, err := d.Wait(ctxFor(t, 30*time.Second), spec.ID)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if ex.Code != 3 || ex.Signal != 0 || ex.OOMKilled {
		t.Fatalf("exit = %+v, want code 3", ex)
	}
	ws, err := d.List(ctxFor(t, 10*time.Second))
	if err != nil || len(ws) != 1 || ws[0].Running() {
		t.Fatalf("list = %+v, %v; want the one ended worker", ws, err)
	}
}

func testAdopt(t *testing.T, h Harness) {
	newD := h.Factory(t)
	d1 := newD()
	sleeper := h.Spec(t, uniqueID(t)+"-a", "sleep")
	oomer := h.Spec(t, uniqueID(t)+"-b", "alloc", "256", "1500")
	oomer.MemoryBytes = 32 * isolation.MiB
	w1 := start(t, d1, sleeper)
	w2 := start(t, d1, oomer)
	if err := d1.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	d2 := newD() // a restarted agent: same state, new instance
	t.Cleanup(func() { _ = d2.Close() })
	// Cleanup stops go through d2, which owns the workers now.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, id := range []string{sleeper.ID, oomer.ID} {
			_, _ = d2.Stop(ctx, id, 0)
		}
	})
	got, err := d2.Adopt(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	byID := map[string]isolation.Worker{}
	for _, w := range got {
		byID[w.Spec.ID] = w
	}
	for _, w := range []isolation.Worker{w1, w2} {
		a, ok := byID[w.Spec.ID]
		if !ok {
			t.Fatalf("adopt found %v, missing %s", got, w.Spec.ID)
		}
		if a.PID != w.PID || a.ContainerID != w.ContainerID || !a.Adopted {
			t.Fatalf("adopted %s as pid %d container %q adopted=%v, started as pid %d container %q",
				w.Spec.ID, a.PID, a.ContainerID, a.Adopted, w.PID, w.ContainerID)
		}
	}
	if _, err := d2.Start(ctxFor(t, 30*time.Second), sleeper); !errors.Is(err, isolation.ErrExists) {
		t.Fatalf("start of an adopted worker: %v, want ErrExists", err)
	}
	again, err := d2.Adopt(ctxFor(t, 30*time.Second))
	if err != nil || len(again) != 0 {
		t.Fatalf("second adopt = %v, %v; want nothing new", again, err)
	}
	ws, err := d2.List(ctxFor(t, 10*time.Second))
	if err != nil || len(ws) != 2 {
		t.Fatalf("list after adopt = %+v, %v; want exactly the 2 workers", ws, err)
	}
	// The adopted worker's OOM is observed although this driver did not start it.
	ex, err := d2.Wait(ctxFor(t, 60*time.Second), oomer.ID)
	if err != nil {
		t.Fatalf("wait adopted: %v", err)
	}
	if !ex.OOMKilled {
		t.Fatalf("adopted worker exit = %s, want OOM-killed", ex)
	}
	ps := procs(h.HostPIDs(t, w1))
	if _, err := d2.Stop(ctxFor(t, 30*time.Second), sleeper.ID, time.Second); err != nil {
		t.Fatalf("stop adopted: %v", err)
	}
	assertGone(t, h, w1, ps)
	if _, err := d2.Stop(ctxFor(t, 30*time.Second), oomer.ID, time.Second); err != nil {
		t.Fatalf("stop ended adopted: %v", err)
	}
	assertGone(t, h, w2, nil)
}

func testBadInput(t *testing.T, h Harness) {
	d := newDriver(t, h)
	ctx := ctxFor(t, 30*time.Second)
	small := h.Spec(t, uniqueID(t), "sleep")
	small.MemoryBytes = 2 * isolation.MiB
	if _, err := d.Start(ctx, small); !errors.Is(err, isolation.ErrInvalidSpec) || !strings.Contains(err.Error(), "at least") {
		t.Fatalf("start with 2Mi: %v, want ErrInvalidSpec saying the minimum", err)
	} else {
		t.Logf("2Mi: %v", err)
	}
	if h.Exists(t, isolation.Worker{Spec: small}) {
		t.Fatalf("a rejected start left a cgroup or container")
	}
	spec := h.Spec(t, uniqueID(t)+"-dup", "sleep")
	start(t, d, spec)
	if _, err := d.Start(ctx, spec); !errors.Is(err, isolation.ErrExists) {
		t.Fatalf("second start: %v, want ErrExists", err)
	}
	if _, err := d.Stop(ctx, "no-such-worker", 0); !errors.Is(err, isolation.ErrNotFound) {
		t.Fatalf("stop unknown: %v, want ErrNotFound", err)
	}
	if _, err := d.Wait(ctx, "no-such-worker"); !errors.Is(err, isolation.ErrNotFound) {
		t.Fatalf("wait unknown: %v, want ErrNotFound", err)
	}
}

func testUsage(t *testing.T, h Harness) {
	d := newDriver(t, h)
	spec := h.Spec(t, uniqueID(t), "alloc", "24")
	spec.MemoryBytes = 64 * isolation.MiB
	start(t, d, spec)
	testenv.EventuallyWith(t, "usage of 20-64 MiB and some cpu", 20*time.Second, func() (bool, string) {
		u, err := d.Usage(ctxFor(t, 10*time.Second), spec.ID)
		if err != nil {
			t.Fatalf("usage: %v", err)
		}
		return u.MemoryBytes >= 20*uint64(isolation.MiB) && u.MemoryBytes <= 64*uint64(isolation.MiB) && u.CPU > 0, fmt.Sprintf("usage = %+v", u)
	})
}

// testLogs reads a worker's output: the tail, followed as it writes and across a restart,
// and the run before the restart. Drivers that read no logs skip it.
func testLogs(t *testing.T, h Harness) {
	d := newDriver(t, h)
	lr, ok := d.(isolation.LogReader)
	if !ok {
		t.Skip("the driver reads no logs")
	}
	spec := h.Spec(t, uniqueID(t), "tick", "30")
	start(t, d, spec)
	// The follower spans two runs of the worker: a bound for a stuck test, not a figure (a
	// loaded machine took 68s).
	ctx := ctxFor(t, 3*time.Minute)
	follow, err := lr.Logs(ctx, spec.ID, isolation.LogOptions{Follow: true, Tail: -1})
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	defer follow.Close()
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(follow)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func(want func(string) bool, what string) {
		t.Helper()
		deadline := time.After(testenv.Timeout(20 * time.Second))
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the followed log ended before %s", what)
				}
				if want(l) {
					return
				}
			case <-deadline:
				t.Fatalf("no %s in the followed log", what)
			}
		}
	}
	next(func(l string) bool { return l == "tick 0" }, "tick 0")
	next(func(l string) bool { return l == "tick 5" }, "tick 5 (stdout and stderr)")
	r, err := lr.Logs(ctx, spec.ID, isolation.LogOptions{Tail: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); len(got) != 2 || !strings.HasPrefix(got[0], "tick ") {
		t.Fatalf("tail 2 = %q", b)
	}
	if _, err := lr.Logs(ctx, spec.ID, isolation.LogOptions{Previous: true}); !errors.Is(err, isolation.ErrNoLogs) {
		t.Fatalf("previous run of a worker never restarted: %v; want ErrNoLogs", err)
	}
	// A restart: the follower goes on with the new run; the old one is the previous.
	if _, err := d.Stop(ctx, spec.ID, 0); err != nil {
		t.Fatal(err)
	}
	start(t, d, spec)
	next(func(l string) bool { return l == "tick 0" }, "the new run's tick 0")
	next(func(l string) bool { return l == "tick 1" }, "the new run's tick 1")
	prev, err := lr.Logs(ctx, spec.ID, isolation.LogOptions{Previous: true, Tail: -1})
	if err != nil {
		t.Fatalf("previous: %v", err)
	}
	b, _ = io.ReadAll(prev)
	prev.Close()
	// Between lines the order of stdout and stderr is the driver's (docker keeps two
	// streams): check the lines, not their order.
	if !strings.Contains(string(b), "tick 0\n") || !strings.Contains(string(b), "tick 5\n") {
		t.Fatalf("previous run's log = %q", b)
	}
	cur, err := lr.Logs(ctx, spec.ID, isolation.LogOptions{Tail: -1})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(cur)
	cur.Close()
	if !strings.Contains(string(b), "tick 0\n") || strings.Count(string(b), "tick 0\n") != 1 {
		t.Fatalf("current run's log = %q; want the new run alone", b)
	}
}
