package healthcheck

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkProbe is one memory probe: /proc/meminfo, /proc/pressure/memory, /proc/loadavg
// and, with a parent, its three cgroup files.
func BenchmarkProbe(b *testing.B) {
	b.Run("real-node", func(b *testing.B) {
		benchProbe(b, ProbeOptions{})
	})
	b.Run("real-node+v1-parent", func(b *testing.B) {
		cg := newTestCgroup(b, 256<<20)
		benchProbe(b, ProbeOptions{CgroupParent: cg.rel})
	})
	b.Run("fixture-v2-parent", func(b *testing.B) {
		benchProbe(b, ProbeOptions{ProcRoot: "testdata/proc", CgroupRoot: "testdata/cgroupv2", CgroupParent: "/agents/node2"})
	})
}

func benchProbe(b *testing.B, o ProbeOptions) {
	p, err := NewProber(o)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Probe(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMonitorCycle is what the monitor does every --health-interval on the real machine
// with a real v1 parent cgroup: probe, throttle, metrics, decide (no change to publish).
func BenchmarkMonitorCycle(b *testing.B) {
	cg := newTestCgroup(b, 256<<20)
	cfg := DefaultConfig()
	cfg.CgroupParent = cg.rel
	m, err := NewMonitor(cfg, Options{Slots: 8, Registerer: prometheus.NewRegistry(), Logger: testenv.Logger(b, slog.LevelInfo)})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s, err := m.probe.Probe()
		if err != nil {
			b.Fatal(err)
		}
		m.observe(s)
		m.evaluate()
	}
}

func BenchmarkThrottleObserve(b *testing.B) {
	tr := NewThrottle(Thresholds{High: 0.85, Low: 0.75, Critical: 0.95, Hold: 30 * time.Second})
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		tr.Observe(now.Add(time.Duration(i)*time.Millisecond), float64(i%100)/100, 8)
	}
}
