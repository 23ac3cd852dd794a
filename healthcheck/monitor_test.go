package healthcheck

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// dialProbe is a probe whose reading the test sets.
type dialProbe struct {
	mu     sync.Mutex
	used   float64
	probes int // calls so far: the monitor handles a probe's sample before it probes again
}

func (p *dialProbe) set(u float64) {
	p.mu.Lock()
	p.used = u
	p.mu.Unlock()
}

func (p *dialProbe) Probe() (Sample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes++
	return Sample{At: time.Now(), Used: p.used, NodeUsed: p.used, Source: SourceNode}, nil
}

func testConfig() Config {
	c := DefaultConfig()
	c.HealthInterval = 10 * time.Millisecond
	c.MemLow, c.MemHigh, c.MemCritical = 0.7, 0.8, 0.95
	c.ThrottleHold = 150 * time.Millisecond
	c.ScriptInterval = 20 * time.Millisecond
	c.ScriptTimeout = time.Second
	c.EvictCooldown = 10 * time.Millisecond
	c.CgroupParent = ""
	return c
}

// probed waits until p has been probed twice more: the monitor then has handled a sample
// taken after the call.
func (p *dialProbe) probed(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	n := p.probes
	p.mu.Unlock()
	testenv.Eventually(t, "two more probes", 5*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.probes >= n+2
	})
}

// next waits for the next published state that satisfies ok.
func next(t *testing.T, m *Monitor, what string, ok func(NodeState) bool) NodeState {
	t.Helper()
	timeout := testenv.Timeout(5 * time.Second)
	deadline := time.After(timeout)
	for {
		select {
		case s := <-m.Changes():
			if ok(s) {
				return s
			}
		case <-deadline:
			t.Fatalf("no state %s within %s; now %+v", what, timeout, m.State())
		}
	}
}

func startMonitor(t *testing.T, m *Monitor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

func TestMonitorMemoryThrottle(t *testing.T) {
	probe := &dialProbe{used: 0.5}
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(testConfig(), Options{Slots: 8, Probe: probe, Registerer: reg, Logger: testenv.Logger(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)

	probe.set(0.85) // ceil(8 * 0.05/0.15) = 3
	s := next(t, m, "throttled", func(s NodeState) bool { return s.Health == cluster.HealthThrottled })
	if s.Withheld != 3 || s.Available() != 5 || !strings.Contains(s.Reason, "high-water") {
		t.Errorf("throttled state %+v", s)
	}
	if g := testenv.Metric(t, reg, "stormdock_agent_slots_withheld", nil); g != 3 {
		t.Errorf("withheld gauge %v", g)
	}
	if g := testenv.Metric(t, reg, "stormdock_agent_health_state", map[string]string{"state": "throttled"}); g != 1 {
		t.Errorf("health_state{throttled} %v", g)
	}
	var n cluster.Node
	s.Apply(&n)
	if n.Throttled != 3 || n.Unschedulable {
		t.Errorf("applied %+v", n)
	}

	probe.set(0.75) // between the marks: nothing changes
	probe.probed(t)
	if st := m.State(); st.Withheld != 3 {
		t.Errorf("between the marks: %+v", st)
	}
	below := time.Now()
	probe.set(0.5)
	s = next(t, m, "healthy", func(s NodeState) bool { return s.Health == cluster.HealthHealthy })
	if held := time.Since(below); held < 150*time.Millisecond {
		t.Errorf("released after %v, hold is 150ms", held)
	}
	if s.Withheld != 0 || m.LastSample().Used != 0.5 {
		t.Errorf("healthy state %+v", s)
	}

	m.SetSlots(4)
	s = next(t, m, "4 slots", func(s NodeState) bool { return s.Slots == 4 })
	if s.Health != cluster.HealthHealthy {
		t.Errorf("after SetSlots: %+v", s)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Error("second Run: no error")
	}
}

func TestMonitorScripts(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	verdict := filepath.Join(state, "verdict")
	if err := os.WriteFile(verdict, []byte("fine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeScript(t, dir, "check-disk", "cat "+verdict)
	cfg := testConfig()
	cfg.HealthDir = dir
	cfg.KillWorkersOnUnhealthy = true
	reg := prometheus.NewRegistry()
	probe := &dialProbe{used: 0.1}
	m, err := NewMonitor(cfg, Options{Slots: 6, Probe: probe, Registerer: reg, Logger: testenv.Logger(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)
	set := func(s string) {
		// Replace, never rewrite in place: the script may be reading it.
		tmp := verdict + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, verdict); err != nil {
			t.Fatal(err)
		}
	}

	set("ERROR /data is read-only\n")
	s := next(t, m, "unhealthy", func(s NodeState) bool { return s.Health == cluster.HealthUnhealthy })
	if s.Script != "check-disk" || s.Output != "ERROR /data is read-only" || s.Withheld != 6 || !s.KillWorkers {
		t.Errorf("unhealthy state %+v", s)
	}
	var n cluster.Node
	s.Apply(&n)
	if !n.Unschedulable || n.Throttled != 6 {
		t.Errorf("applied %+v", n)
	}
	if g := testenv.Metric(t, reg, "stormdock_agent_health_script_failures_total", map[string]string{"script": "check-disk"}); g < 1 {
		t.Errorf("script failures %v", g)
	}

	set("WARN inode use 91%\n")
	s = next(t, m, "warned", func(s NodeState) bool { return s.Health == cluster.HealthThrottled })
	if s.Withheld != 3 || s.Script != "check-disk" || s.KillWorkers || !strings.Contains(s.Reason, "warns") {
		t.Errorf("warn state %+v", s)
	}
	// Memory pressure above the warning's share wins.
	probe.set(0.9) // ceil(6 * 0.1/0.15) = 4
	s = next(t, m, "memory over warn", func(s NodeState) bool { return s.Withheld == 4 })
	if s.Script != "" || !strings.Contains(s.Reason, "memory") {
		t.Errorf("memory+warn state %+v", s)
	}

	set("ok\n")
	probe.set(0.1)
	next(t, m, "healthy", func(s NodeState) bool { return s.Health == cluster.HealthHealthy })
}

// TestMonitorEvicts: above the critical mark the monitor calls the agent's stop hook, lowest
// priority first, and counts it.
func TestMonitorEvicts(t *testing.T) {
	node := &fakeNode{total: 1000 * mib, workers: map[string]Candidate{
		"hi": {ID: "hi", Priority: 10, Request: 100 * mib, Usage: 500 * mib},
		"lo": {ID: "lo", Priority: 1, Request: 100 * mib, Usage: 460 * mib},
	}} // 96%
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(testConfig(), Options{Slots: 2, Probe: node, Registerer: reg, Logger: testenv.Logger(t, slog.LevelInfo),
		Evict: &EvictHooks{Candidates: node.candidates, Stop: node.stop}})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)
	s := next(t, m, "all withheld", func(s NodeState) bool { return s.Withheld == 2 })
	if s.Health != cluster.HealthThrottled || !strings.Contains(s.Reason, "critical") {
		t.Errorf("critical state %+v", s)
	}
	testenv.Eventually(t, "an eviction", 5*time.Second, func() bool {
		return testenv.Metric(t, reg, "stormdock_agent_memory_evictions_total", nil) >= 1
	})
	// More probes, by the evictor after its cooldown and by the monitor: 50% now, nothing
	// more to evict.
	node.mu.Lock()
	probes := node.probes
	node.mu.Unlock()
	testenv.Eventually(t, "three more probes", 5*time.Second, func() bool {
		node.mu.Lock()
		defer node.mu.Unlock()
		return node.probes >= probes+3
	})
	node.mu.Lock()
	defer node.mu.Unlock()
	if len(node.stopped) != 1 || node.stopped[0] != "lo" {
		t.Errorf("stopped %v, want [lo]", node.stopped)
	}
}

func TestNewMonitorErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMonitor(testConfig(), Options{Probe: &dialProbe{}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMonitor(testConfig(), Options{Probe: &dialProbe{}, Registerer: reg}); err == nil {
		t.Error("same registry twice: no error")
	}
	bad := testConfig()
	bad.MemLow = 0.9
	if _, err := NewMonitor(bad, Options{Probe: &dialProbe{}}); err == nil {
		t.Error("bad config: no error")
	}
	if _, err := NewMonitor(testConfig(), Options{Probe: &dialProbe{}, Evict: &EvictHooks{}}); err == nil {
		t.Error("empty eviction hooks: no error")
	}
	if _, err := NewMonitor(testConfig(), Options{Probe: &dialProbe{}, Slots: -1}); err == nil {
		t.Error("negative slots: no error")
	}
}
