package testenv

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestTimeout(t *testing.T) {
	for _, tc := range []struct {
		scale, ci string
		want      time.Duration
	}{
		{"", "", time.Second},
		{"", "true", 3 * time.Second},
		{"2", "", 2 * time.Second},
		{"0.5", "true", 500 * time.Millisecond},
	} {
		t.Run(fmt.Sprintf("scale=%q,CI=%q", tc.scale, tc.ci), func(t *testing.T) {
			t.Setenv(TimeoutScaleEnv, tc.scale)
			t.Setenv("CI", tc.ci)
			if got := Timeout(time.Second); got != tc.want {
				t.Errorf("Timeout(1s) = %s, want %s", got, tc.want)
			}
		})
	}
}

// fakeTB records the failure of a helper under test; Fatalf ends the goroutine, as
// testing.T's does.
type fakeTB struct {
	testing.TB
	failure string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failure = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a fakeTB on a goroutine of its own and returns the failure, "" if none.
func run(t *testing.T, fn func(tb testing.TB)) string {
	t.Setenv(TimeoutScaleEnv, "1")
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.failure
}

func TestEventually(t *testing.T) {
	var calls atomic.Int32
	if f := run(t, func(tb testing.TB) {
		Eventually(tb, "three calls", time.Second, func() bool { return calls.Add(1) == 3 })
	}); f != "" || calls.Load() != 3 {
		t.Errorf("failure %q after %d calls, want success after 3", f, calls.Load())
	}
	begin := time.Now()
	f := run(t, func(tb testing.TB) {
		EventuallyWith(tb, "the impossible", 100*time.Millisecond, func() (bool, string) { return false, "not yet" })
	})
	if took := time.Since(begin); took < 100*time.Millisecond {
		t.Errorf("gave up after %s, before the 100ms timeout", took)
	}
	if want := "timed out after 100ms waiting for the impossible; last: not yet"; f != want {
		t.Errorf("failure %q, want %q", f, want)
	}
}

func TestAssertUntil(t *testing.T) {
	var calls atomic.Int32
	begin := time.Now()
	if f := run(t, func(tb testing.TB) {
		AssertUntil(tb, "always", 100*time.Millisecond, func() (bool, string) { calls.Add(1); return true, "" })
	}); f != "" {
		t.Errorf("failure %q for a property that holds", f)
	}
	if took := time.Since(begin); took < 100*time.Millisecond || calls.Load() < 3 {
		t.Errorf("returned after %s and %d checks, want the whole 100ms window and several checks", took, calls.Load())
	}
	calls.Store(0)
	f := run(t, func(tb testing.TB) {
		AssertUntil(tb, "the third check", time.Minute, func() (bool, string) { return calls.Add(1) < 3, "broke" })
	})
	if !strings.HasPrefix(f, "the third check stopped holding after ") || !strings.HasSuffix(f, ": broke") || calls.Load() != 3 {
		t.Errorf("failure %q after %d checks, want one at the third", f, calls.Load())
	}
}

func TestMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g"}, []string{"kind"})
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "c_total"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds"})
	reg.MustRegister(g, c, h)
	g.WithLabelValues("a").Set(1)
	g.WithLabelValues("b").Set(2)
	c.Add(3)
	h.Observe(0.1)
	h.Observe(0.2)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"g", map[string]string{"kind": "b"}, 2},
		{"g", map[string]string{"kind": "a"}, 1},
		{"c_total", nil, 3},
		{"h_seconds", nil, 2},
	} {
		if got := Metric(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	if f := run(t, func(tb testing.TB) { Metric(tb, reg, "g", map[string]string{"kind": "z"}) }); f == "" {
		t.Error("no failure for a missing series")
	}
}

func TestBuildBinary(t *testing.T) {
	t.Cleanup(RemoveBuilds)
	p := BuildBinary(t, "./internal/testenv/testdata/hello")
	if again := BuildBinary(t, "./internal/testenv/testdata/hello"); again != p {
		t.Errorf("second build at %s, want the first's %s", again, p)
	}
	if out, err := exec.Command(p).Output(); err != nil || string(out) != "hello\n" {
		t.Fatalf("run %s: %q, %v", p, out, err)
	}
	f, err := elf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Section(".interp") != nil {
		t.Errorf("%s has a dynamic loader: not static", p)
	}
	if _, err := Build("./internal/testenv/testdata/nope"); err == nil {
		t.Error("no error for a package that does not exist")
	}
	RemoveBuilds()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("%s left after RemoveBuilds: %v", p, err)
	}
}

// With PrebuiltEnv set, Build finds binaries by package path and never runs go (the v2
// virtual machine has no toolchain); a missing one is an error that says how to make it.
func TestBuildPrebuilt(t *testing.T) {
	RemoveBuilds()
	t.Cleanup(RemoveBuilds)
	dir := t.TempDir()
	t.Setenv(PrebuiltEnv, dir)
	want := filepath.Join(dir, "internal", "testenv", "testdata", "hello")
	if err := os.MkdirAll(filepath.Dir(want), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, []byte("#!/bin/sh\necho prebuilt\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := BuildBinary(t, "./internal/testenv/testdata/hello"); got != want {
		t.Errorf("prebuilt path %s, want %s", got, want)
	}
	for _, tc := range []struct {
		pkg   string
		flags []string
		msg   string
	}{
		{"./internal/testenv/testdata/nope", nil, "go build -o " + filepath.Join(dir, "internal/testenv/testdata/nope")},
		{"./internal/testenv/testdata/hello", []string{"-race"}, "build flags"},
	} {
		_, err := Build(tc.pkg, tc.flags...)
		if err == nil || !strings.Contains(err.Error(), tc.msg) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Build(%s, %q) = %v, want one line saying %q", tc.pkg, tc.flags, err, tc.msg)
		}
	}
	RemoveBuilds()
	if _, err := os.Stat(want); err != nil {
		t.Errorf("RemoveBuilds removed a prebuilt binary: %v", err)
	}
}
