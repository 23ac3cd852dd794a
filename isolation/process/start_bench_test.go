package process_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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

// BenchmarkStart is where a process worker's start goes: one start, or a burst of 16 at
// once (as an agent starts an assignment), through stormdock-shim or through the whole
// stormdock binary as its own shim (a build without stormdock-shim, and every start before
// it existed), with or without the lease launcher (which every agent's worker runs under),
// around /bin/sleep. Per start it reports the wall time (of the whole burst, for bursts),
// the cpu the worker's cgroup used until its program slept (shim, launcher and sleep's own
// start: what runs in every worker's process tree), the cpu of the driver's own process, and
// the median of each step of the driver's start (see the driver's "start phases" log):
//
//	go test -run '^$' -bench Start -benchtime 20x ./isolation/process/
func BenchmarkStart(b *testing.B) {
	testenv.Cgroups(b)
	full := testenv.BuildBinary(b, "./cmd/stormdock")
	lease := filepath.Join(b.TempDir(), "lease")
	if err := os.WriteFile(lease, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 16} {
		for _, bin := range []struct{ name, path string }{{"stormdock-shim", shimBin}, {"stormdock", full}} {
			for _, launched := range []bool{false, true} {
				name := fmt.Sprintf("burst=%d/shim=%s/launcher=%v", n, bin.name, launched)
				b.Run(name, func(b *testing.B) {
					cmd := []string{"/bin/sleep", "100000"}
					if launched {
						cmd = append([]string{bin.path, "launch", "--lease", lease, "--ttl", "1h", "--"}, cmd...)
					}
					benchStart(b, bin.path, n, cmd)
				})
			}
		}
	}
}

func benchStart(b *testing.B, shim string, n int, cmd []string) {
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
	for i := 0; b.Loop(); i++ {
		specs := make([]isolation.Spec, n)
		for j := range specs {
			specs[j] = isolation.Spec{ID: fmt.Sprintf("bench-start-%d-%d-%d", benchSeq.Add(1), i, j), Command: cmd,
				MemoryBytes: 64 * isolation.MiB, MilliCPU: 500, LogDir: dir}
		}
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
			workerCPU = append(workerCPU, settledCPU(b, d, s.ID))
		}
		for _, s := range specs {
			if _, err := d.Stop(ctx, s.ID, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	starts := len(workerCPU)
	b.ReportMetric(ms(drivertest.Percentile(walls, 50)), "wall-ms")
	b.ReportMetric(ms(drivertest.Percentile(workerCPU, 50)), "worker-cpu-ms/start")
	b.ReportMetric(ms(self/time.Duration(starts)), "driver-cpu-ms/start")
	b.Logf("figure: %s: %d runs: wall p50 %.1f ms p99 %.1f ms; worker cgroup cpu p50 %.2f ms per start; driver cpu %.2f ms per start; start phases p50: %s",
		b.Name(), len(walls), ms(drivertest.Percentile(walls, 50)), ms(drivertest.Percentile(walls, 99)),
		ms(drivertest.Percentile(workerCPU, 50)), ms(self/time.Duration(starts)), phases.summary())
}

var benchSeq atomic.Int64

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// selfCPU is the cpu this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// settledCPU waits until every process of the worker sleeps in its program (/bin/sleep, under
// the launcher or not), then reads the cpu its cgroup used.
func settledCPU(b *testing.B, d *process.Driver, id string) time.Duration {
	ctx := context.Background()
	testenv.Eventually(b, id+" asleep", 10*time.Second, func() bool {
		ps, err := d.Processes(ctx, id)
		if err != nil || len(ps) == 0 {
			return false
		}
		sleeping := false
		for _, p := range ps {
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/comm")
			stat, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
			i := strings.LastIndexByte(string(stat), ')')
			if i < 0 || i+2 >= len(stat) || stat[i+2] != 'S' {
				return false
			}
			sleeping = sleeping || strings.TrimSpace(string(comm)) == "sleep"
		}
		return sleeping
	})
	u, err := d.Usage(ctx, id)
	if err != nil {
		b.Fatal(err)
	}
	return u.CPU
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
