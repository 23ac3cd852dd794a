package healthcheck

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestRealPressure creates real memory pressure in a 256 MiB parent cgroup: three workers
// allocate, the monitor withholds a slot when usage crosses the high mark, withholds all of
// them and evicts the worst offender when a runaway worker climbs towards the limit (before
// the kernel's OOM killer acts), keeps the slots withheld while usage stays above the low
// mark, and gives them back only after the hold time once memory is freed.
func TestRealPressure(t *testing.T) {
	const limit = 256 << 20
	cg := newTestCgroup(t, limit)
	loBig := startWorker(t, cg, "lo-big", 10, 32*mib)     // will run away
	loSmall := startWorker(t, cg, "lo-small", 10, 64*mib) // under its request
	hi := startWorker(t, cg, "hi", 100, 16*mib)           // furthest over its request, but important
	workers := []*allocWorker{loBig, loSmall, hi}

	prober, err := NewProber(ProbeOptions{CgroupParent: cg.rel})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var stopped []string
	var stoppedAt time.Time
	candidates := func(context.Context) ([]Candidate, error) {
		var cs []Candidate
		for _, w := range workers {
			if !w.alive() {
				continue
			}
			m, err := prober.Cgroup(w.cgroup)
			if err != nil {
				return nil, err
			}
			cs = append(cs, Candidate{ID: w.name, Priority: w.prio, Request: w.request, Usage: m.WorkingSet()})
		}
		return cs, nil
	}
	stop := func(_ context.Context, c Candidate) error {
		for _, w := range workers {
			if w.name == c.ID {
				w.kill() // returns once the process is gone and its memory freed
			}
		}
		mu.Lock()
		stopped, stoppedAt = append(stopped, c.ID), time.Now()
		mu.Unlock()
		return nil
	}

	cfg := DefaultConfig()
	cfg.CgroupParent = cg.rel
	cfg.HealthInterval = 50 * time.Millisecond
	cfg.MemLow, cfg.MemHigh, cfg.MemCritical = 0.30, 0.50, 0.80
	cfg.ThrottleHold = 800 * time.Millisecond
	cfg.EvictCooldown = 200 * time.Millisecond
	m, err := NewMonitor(cfg, Options{Slots: 4, Registerer: prometheus.NewRegistry(), Logger: testenv.Logger(t, slog.LevelInfo),
		Evict: &EvictHooks{Candidates: candidates, Stop: stop}})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)

	// 90 MiB of 256: 35%, between the marks.
	loSmall.set(t, 40)
	hi.set(t, 50)
	waitSample(t, m, "35% used", func(s Sample) bool { return s.CgroupUsed > 0.33 })
	if s := m.State(); s.Health != cluster.HealthHealthy {
		t.Fatalf("at 35%%: %+v", s)
	}
	if s := m.LastSample(); !s.CgroupPresent || s.Cgroup.Limit != limit || s.Source != SourceCgroup {
		t.Fatalf("the parent cgroup's limit must count as the node's memory: %+v", s)
	}

	// 130 MiB: 51%, over the high mark.
	loBig.set(t, 40)
	crossed := time.Now()
	s := next(t, m, "throttled", func(s NodeState) bool { return s.Health == cluster.HealthThrottled })
	t.Logf("figure: high mark crossed -> state change observed: %v (probe interval %v)", time.Since(crossed), cfg.HealthInterval)
	if s.Withheld < 1 || s.Withheld > 2 {
		t.Errorf("just over the high mark: withheld %d, want 1 (2 with runtime overhead)", s.Withheld)
	}
	// The chooser on real usage: among the priority-10 workers, the one furthest over its
	// request, though "hi" uses more and is further over.
	cs, err := candidates(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := ChooseVictim(cs); v.ID != "lo-big" {
		t.Errorf("chooser picked %s from %+v", v.ID, cs)
	}

	// The runaway: lo-big heads for 200 MiB at 100 MiB/s, which would take the parent to
	// 290 MiB, over its limit. The monitor must evict it past 80% (205 MiB).
	loBig.send(t, "grow 200 100")
	testenv.EventuallyWith(t, "an eviction", 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(stopped) > 0, fmt.Sprintf("sample %+v", m.LastSample())
	})
	mu.Lock()
	if !slices.Equal(stopped, []string{"lo-big"}) {
		t.Errorf("evicted %v, want [lo-big]", stopped)
	}
	evictedAt := stoppedAt
	mu.Unlock()
	if k := cg.oomKills(t); k != 0 {
		t.Fatalf("the kernel OOM-killed %d processes before the eviction", k)
	}
	if hits := cg.limitHits(t); hits != 0 {
		t.Errorf("the parent hit its limit %d times", hits)
	}
	if !loSmall.alive() || !hi.alive() {
		t.Fatal("a worker other than the victim died")
	}

	// Back to 90 MiB (35%): above the low mark, so every slot stays withheld.
	waitSample(t, m, "back under critical", func(s Sample) bool { return s.Used < 0.5 })
	if s := m.State(); s.Withheld != 4 || s.Health != cluster.HealthThrottled {
		t.Fatalf("after the eviction at 35%%: %+v", s)
	}
	testenv.AssertUntil(t, "every slot withheld above the low mark", cfg.ThrottleHold+200*time.Millisecond, func() (bool, string) {
		s := m.State()
		return s.Withheld == 4, fmt.Sprintf("released: %+v", s)
	})
	t.Logf("eviction at %v; no release while at %.1f%%", evictedAt.Format(time.StampMilli), 100*m.LastSample().Used)

	// Free 40 MiB: 50 MiB is 20%, below the low mark. Release only after the hold. The time
	// is taken before the command: usage goes below the mark while the worker frees, before
	// it answers (tens of milliseconds under emulation), and the hold counts from there.
	below := time.Now()
	loSmall.set(t, 0)
	s = next(t, m, "released", func(s NodeState) bool { return s.Health == cluster.HealthHealthy })
	held := time.Since(below)
	t.Logf("below low -> released after %v (hold %v)", held, cfg.ThrottleHold)
	if held < cfg.ThrottleHold {
		t.Errorf("released after %v, before the hold %v", held, cfg.ThrottleHold)
	}
	if s.Withheld != 0 {
		t.Errorf("released state %+v", s)
	}
	if k := cg.oomKills(t); k != 0 {
		t.Errorf("oom_kill %d at the end", k)
	}
}

func waitSample(t *testing.T, m *Monitor, what string, ok func(Sample) bool) {
	t.Helper()
	testenv.EventuallyWith(t, "a sample "+what, 5*time.Second, func() (bool, string) {
		s := m.LastSample()
		return ok(s), fmt.Sprintf("%+v", s)
	})
}

// TestRealCrossingLatency measures, with the default probe interval and a real cgroup, the
// time from memory crossing the high mark to the monitor publishing the throttled state. The
// agent adds one coordination-store write to reach the master; the goal for the whole path is
// under a second.
func TestRealCrossingLatency(t *testing.T) {
	const limit = 256 << 20
	cg := newTestCgroup(t, limit)
	w := startWorker(t, cg, "w", 0, 0)
	cfg := DefaultConfig() // 250ms interval
	cfg.CgroupParent = cg.rel
	cfg.MemLow, cfg.MemHigh, cfg.MemCritical = 0.30, 0.50, 0.90
	cfg.ThrottleHold = 0
	m, err := NewMonitor(cfg, Options{Slots: 4, Logger: testenv.Logger(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)
	var lat []time.Duration
	for range 8 {
		w.set(t, 120) // 47%: just under the mark
		waitSample(t, m, "under the mark", func(s Sample) bool { return s.CgroupUsed > 0.45 && s.CgroupUsed < 0.5 })
		if s := m.State(); s.Health != cluster.HealthHealthy {
			next(t, m, "healthy", func(s NodeState) bool { return s.Health == cluster.HealthHealthy })
		}
		// Cross at a random phase of the probe ticker, as real pressure would: right after
		// a probe the wait is a whole interval, right before it next to nothing. The pause is
		// the random phase under test.
		time.Sleep(time.Duration(rand.Int64N(int64(cfg.HealthInterval))))
		w.set(t, 136) // 53%: the crossing happens inside this one step of 16 MiB
		crossed := time.Now()
		next(t, m, "throttled", func(s NodeState) bool { return s.Health == cluster.HealthThrottled })
		lat = append(lat, time.Since(crossed))
		w.set(t, 0)
		next(t, m, "healthy", func(s NodeState) bool { return s.Health == cluster.HealthHealthy })
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	t.Logf("figure: high mark crossed -> throttled state published, interval %v, %d runs: min %v median %v mean %v max %v",
		cfg.HealthInterval, len(lat), lat[0], lat[len(lat)/2], sum/time.Duration(len(lat)), lat[len(lat)-1])
	// The goal is the interval plus 250ms; the bound has room for a loaded machine, which
	// can hold up the monitor's goroutine, and catches a monitor that misses probes.
	if worst := lat[len(lat)-1]; worst > cfg.HealthInterval+testenv.Timeout(time.Second) {
		t.Errorf("worst latency %v, want under interval %v + 1s (the goal: + 250ms)", worst, cfg.HealthInterval)
	}
}

// TestRealCgroupPressure holds a real parent cgroup's workers over its memory.high (cgroup
// v2), where the kernel reclaims and then throttles every allocation: the parent's own
// memory.pressure records the stall, and the monitor reports it. v1 has no per-cgroup
// pressure, and the probe says so rather than report zero.
func TestRealCgroupPressure(t *testing.T) {
	cg := newTestCgroup(t, 256<<20)
	w := startWorker(t, cg, "w", 0, 0)
	reg := prometheus.NewRegistry()
	cfg := DefaultConfig()
	cfg.CgroupParent = cg.rel
	cfg.HealthInterval = 50 * time.Millisecond
	m, err := NewMonitor(cfg, Options{Slots: 4, Registerer: reg, Logger: testenv.Logger(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	startMonitor(t, m)
	w.set(t, 40)
	waitSample(t, m, "with the parent's usage", func(s Sample) bool { return s.CgroupPresent && s.Cgroup.Usage >= 40<<20 })
	if cg.mode == ModeV1 {
		if s := m.LastSample(); s.HasCgroupPSI {
			t.Fatalf("cgroup v1 has no per-cgroup pressure, yet the sample has %+v", s.CgroupPSI)
		}
		return
	}
	before := m.LastSample()
	if !before.HasCgroupPSI {
		t.Fatalf("no memory.pressure read from the v2 parent: %+v", before)
	}
	// memory.high just under what the worker will hold: 2 MiB over it, each allocation
	// returns to user space through reclaim and a penalty sleep, both counted as stall.
	high := before.Cgroup.Usage + 1<<20
	writeFile(t, cg.dir(cg.rel)+"/memory.high", strconv.FormatUint(high, 10))
	t.Cleanup(func() { _ = os.WriteFile(cg.dir(cg.rel)+"/memory.high", []byte("max"), 0) })
	begin := time.Now()
	w.set(t, 42)
	took := time.Since(begin)
	var after Sample
	waitSample(t, m, "the stall counted", func(s Sample) bool {
		after = s
		return s.CgroupPSI.SomeTotal > before.CgroupPSI.SomeTotal
	})
	stall := time.Duration(after.CgroupPSI.SomeTotal-before.CgroupPSI.SomeTotal) * time.Microsecond
	t.Logf("figure: 2 MiB over memory.high took %v to allocate; the parent's memory.pressure counted %v of stall", took.Round(time.Millisecond), stall.Round(time.Millisecond))
	if stall < 10*time.Millisecond {
		t.Errorf("parent's stall %v for an allocation throttled for %v", stall, took)
	}
	// The 10 s average follows within a few of the kernel's 2 s updates, and so does the gauge.
	testenv.EventuallyWith(t, "the pressure gauge above zero", 10*time.Second, func() (bool, string) {
		g := testenv.Metric(t, reg, "stormdock_agent_cgroup_memory_pressure_some_avg10_ratio", nil)
		return g > 0, fmt.Sprintf("gauge %v, sample %+v", g, m.LastSample().CgroupPSI)
	})
}
