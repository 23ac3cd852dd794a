package process_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// BenchmarkStart is where a process worker's start goes: one start, or a burst of 16 at
// once (as an agent starts an assignment), through stormdock-shim or through the whole
// stormdock binary as its own shim (a build without stormdock-shim, and every start before
// it existed), with or without the lease launcher (which every agent's worker runs under).
// Per start it reports the wall time of Start (of the whole burst, for bursts) and the cpu
// of the driver's own process, for workers that sleep, and the median of each step of the
// driver's start (see the driver's "start phases" log); then the cpu of everything that ran
// in the worker's process tree for a worker of /bin/true, from the start to its exit (shim,
// launcher, true: the driver reaps them, so they are this process's RUSAGE_CHILDREN), and
// that less /bin/true's own, run alone. user=tenant runs the worker as a tenant's uid (the
// shim's switch, the log's owner), user=driver as the driver (compare them with benchstat
// -col /user):
//
//	go test -run '^$' -bench 'Start$' -benchtime 20x ./isolation/process/
func BenchmarkStart(b *testing.B) {
	testenv.Cgroups(b)
	full := testenv.BuildBinary(b, "./cmd/stormdock")
	leaseDir := b.TempDir()
	// A tenant's uid reaches the lease, as an agent's state directory is reachable.
	for d := leaseDir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			b.Fatal(err)
		}
	}
	lease := filepath.Join(leaseDir, "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	// user=tenant: the worker runs as a tenant's uid, as every agent's worker does (the
	// shim's switch and the log's owner); user=driver: as the driver itself.
	users := []struct {
		name string
		u    *isolation.User
	}{{"driver", nil}, {"tenant", &isolation.User{UID: 300000, GID: 300000}}}
	for _, n := range []int{1, 16} {
		for _, bin := range []struct{ name, path string }{{"stormdock-shim", shimBin}, {"stormdock", full}} {
			for _, launched := range []bool{false, true} {
				for _, user := range users {
					name := fmt.Sprintf("burst=%d/shim=%s/launcher=%v/user=%s", n, bin.name, launched, user.name)
					b.Run(name, func(b *testing.B) {
						var launch []string
						if launched {
							launch = []string{bin.path, "launch", "--lease", lease, "--ttl", "1h", "--"}
						}
						benchStart(b, bin.path, n, launch, user.u)
					})
				}
			}
		}
	}
}

func benchStart(b *testing.B, shim string, n int, launch []string, user *isolation.User) {
	sleep := append(slices.Clone(launch), "/bin/sleep", "100000")
	trueCmd := append(slices.Clone(launch), "/bin/true")
	phases := &phaseLog{steps: map[string][]time.Duration{}}
	d, err := process.New(process.Config{CgroupParent: parent, StateDir: b.TempDir(), Shim: shim,
		Logger: slog.New(phases)})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	dir := b.TempDir()
	var walls, workerCPU []time.Duration
	var self time.Duration
	makeSpecs := func(i int, cmd []string) []isolation.Spec {
		specs := make([]isolation.Spec, n)
		for j := range specs {
			specs[j] = isolation.Spec{ID: fmt.Sprintf("bench-start-%d-%d-%d", benchSeq.Add(1), i, j), Command: cmd,
				MemoryBytes: 64 * isolation.MiB, MilliCPU: 500, LogDir: dir, User: user}
		}
		return specs
	}
	for i := 0; b.Loop(); i++ {
		specs := makeSpecs(i, sleep)
		cpu0 := selfCPU()
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for j, s := range specs {
			wg.Go(func() { _, errs[j] = d.Start(ctx, s) })
		}
		wg.Wait()
		walls = append(walls, time.Since(t0))
		self += selfCPU() - cpu0
		b.StopTimer()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		for _, s := range specs {
			if _, err := d.Stop(ctx, s.ID, 0); err != nil {
				b.Fatal(err)
			}
		}
		// The same starts of /bin/true: what their process trees cost, once reaped.
		specs = makeSpecs(i, trueCmd)
		cpu0 = childrenCPU()
		for _, s := range specs {
			wg.Go(func() {
				if _, err := d.Start(ctx, s); err == nil {
					_, _ = d.Wait(ctx, s.ID)
				}
			})
		}
		wg.Wait()
		workerCPU = append(workerCPU, (childrenCPU()-cpu0)/time.Duration(n))
		for _, s := range specs {
			if _, err := d.Stop(ctx, s.ID, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	starts := len(walls) * n
	trueAlone := trueCPU(b)
	b.ReportMetric(ms(drivertest.Percentile(walls, 50)), "wall-ms")
	b.ReportMetric(ms(drivertest.Percentile(workerCPU, 50)-trueAlone), "tree-cpu-ms/start")
	b.ReportMetric(ms(self/time.Duration(starts)), "driver-cpu-ms/start")
	b.Logf("figure: %s: %d runs: wall p50 %.1f ms p99 %.1f ms; driver cpu %.2f ms per start; the worker's process tree to /bin/true's exit p50 %.2f ms of cpu, %.2f ms without true's own (%.2f ms); start phases p50: %s",
		b.Name(), len(walls), ms(drivertest.Percentile(walls, 50)), ms(drivertest.Percentile(walls, 99)), ms(self/time.Duration(starts)),
		ms(drivertest.Percentile(workerCPU, 50)), ms(drivertest.Percentile(workerCPU, 50)-trueAlone), ms(trueAlone), phases.summary())
}

// childrenCPU is the cpu of this process's children that it has reaped.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// trueCPU is the median cpu of /bin/true run alone.
func trueCPU(b *testing.B) time.Duration {
	var ds []time.Duration
	for range 20 {
		c0 := childrenCPU()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, childrenCPU()-c0)
	}
	return drivertest.Percentile(ds, 50)
}

var benchSeq atomic.Int64

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// selfCPU is the cpu this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// phaseLog collects the driver's "start phases" log records.
type phaseLog struct {
	mu    sync.Mutex
	steps map[string][]time.Duration
	order []string
}

func (p *phaseLog) Enabled(context.Context, slog.Level) bool { return true }
func (p *phaseLog) WithAttrs([]slog.Attr) slog.Handler       { return p }
func (p *phaseLog) WithGroup(string) slog.Handler            { return p }
func (p *phaseLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "start phases" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		if d, err := time.ParseDuration(a.Value.String()); err == nil {
			if _, ok := p.steps[a.Key]; !ok {
				p.order = append(p.order, a.Key)
			}
			p.steps[a.Key] = append(p.steps[a.Key], d)
		}
		return true
	})
	return nil
}

func (p *phaseLog) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for _, k := range p.order {
		ds := slices.Clone(p.steps[k])
		parts = append(parts, fmt.Sprintf("%s %.2f ms (max %.1f)", k, ms(drivertest.Percentile(ds, 50)), ms(slices.Max(ds))))
	}
	return strings.Join(parts, ", ")
}
