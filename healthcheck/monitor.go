package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/cluster"
)

// EvictHooks connect the monitor to the agent's workers. Without them the monitor throttles
// but never evicts.
type EvictHooks struct {
	// Candidates lists the running workers with priority, request and current usage.
	Candidates func(ctx context.Context) ([]Candidate, error)
	// Stop stops one worker and returns once it has exited.
	Stop func(ctx context.Context, c Candidate) error
	// Max bounds evictions per episode above the critical mark; 0 means no bound.
	Max int
}

// Options are the monitor's collaborators. Only Slots is required.
type Options struct {
	// Slots is the node's configured worker slot count (see SetSlots).
	Slots int
	// Logger receives every state change; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers none (the metrics still work).
	Registerer prometheus.Registerer
	// Probe replaces the real prober (tests); when nil one is built from ProcRoot,
	// CgroupRoot (empty: the machine's) and Config.CgroupParent.
	Probe                Probe
	ProcRoot, CgroupRoot string
	// Evict enables eviction above the critical mark.
	Evict *EvictHooks
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Monitor probes memory, runs the health scripts, and keeps the node's NodeState. Run it in
// a goroutine of its own; read State or watch Changes.
type Monitor struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	probe    Probe
	evict    *EvictHooks
	scripts  *ScriptRunner
	metrics  *metrics
	throttle *Throttle // owned by the Run goroutine
	source   string    // owned by the Run goroutine
	cgSource string    // "cgroup <parent>", made once rather than on every probe

	changes chan NodeState
	poke    chan struct{}
	started atomic.Bool

	mu     sync.Mutex
	state  NodeState
	sample Sample
	slots  int
}

// NewMonitor validates cfg and builds a monitor; it reads the memory files once to prove
// they are there.
func NewMonitor(cfg Config, o Options) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if o.Slots < 0 {
		return nil, fmt.Errorf("healthcheck: slots %d must not be negative", o.Slots)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Evict != nil && (o.Evict.Candidates == nil || o.Evict.Stop == nil) {
		return nil, errors.New("healthcheck: eviction hooks need both Candidates and Stop")
	}
	m := &Monitor{
		cfg:      cfg,
		log:      o.Logger.With("component", "healthcheck"),
		now:      o.Now,
		probe:    o.Probe,
		evict:    o.Evict,
		throttle: NewThrottle(cfg.Thresholds()),
		changes:  make(chan NodeState, 1),
		poke:     make(chan struct{}, 1),
		slots:    o.Slots,
		source:   SourceNode,
		cgSource: "cgroup " + cfg.CgroupParent,
	}
	if m.probe == nil {
		p, err := NewProber(ProbeOptions{ProcRoot: o.ProcRoot, CgroupRoot: o.CgroupRoot, CgroupParent: cfg.CgroupParent, Now: o.Now})
		if err != nil {
			return nil, fmt.Errorf("healthcheck: %w", err)
		}
		m.probe = p
	}
	met, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	m.metrics = met
	if cfg.HealthDir != "" {
		m.scripts = &ScriptRunner{Dir: cfg.HealthDir, Interval: cfg.ScriptInterval, Timeout: cfg.ScriptTimeout,
			Logger: m.log, OnResult: func(r ScriptResult) {
				if r.Status == ScriptError {
					met.scriptFailures.WithLabelValues(r.Name).Inc()
				}
			}}
	}
	m.state = NodeState{Health: cluster.HealthHealthy, Slots: o.Slots, Reason: "not probed yet", Since: o.Now()}
	return m, nil
}

// State returns the current node state.
func (m *Monitor) State() NodeState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state
}

// LastSample returns the latest successful memory probe.
func (m *Monitor) LastSample() Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sample
}

// Changes delivers each new NodeState as it happens. It holds one state: a reader that falls
// behind gets the latest, never a stale one, and the monitor never blocks on it.
func (m *Monitor) Changes() <-chan NodeState { return m.changes }

// SetSlots changes the node's slot count (the agent was reconfigured); the state is
// recomputed at once.
func (m *Monitor) SetSlots(n int) {
	m.mu.Lock()
	m.slots = max(n, 0)
	m.mu.Unlock()
	select {
	case m.poke <- struct{}{}:
	default:
	}
}

// Run probes every HealthInterval and runs the scripts until ctx ends, then stops every
// goroutine it started (killing running scripts) and returns nil. It may be called once.
func (m *Monitor) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("healthcheck: Monitor.Run called twice")
	}
	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel below: goroutines are told to stop, then awaited
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var scriptUpdates <-chan struct{}
	if m.scripts != nil {
		scriptUpdates = m.scripts.Updates()
		wg.Go(func() {
			if err := m.scripts.Run(ctx); err != nil {
				m.log.Error("health scripts stopped", "err", err)
			}
		})
	}
	evictDone := make(chan error, 1)
	evicting := false
	var evictAgain time.Time // after a failed episode, wait before trying again
	failing := false

	tick := time.NewTicker(m.cfg.HealthInterval)
	defer tick.Stop()
	for {
		s, err := m.probe.Probe()
		switch {
		case err != nil:
			m.metrics.probeErrors.Inc()
			if !failing { // once per streak: a broken file should not flood the log
				m.log.Error("memory probe failed; keeping the last state", "err", err)
			}
			failing = true
		default:
			if failing {
				m.log.Info("memory probe works again")
			}
			failing = false
			m.observe(s)
			if s.Used >= m.cfg.MemCritical && m.evict != nil && !evicting && !m.now().Before(evictAgain) {
				evicting = true
				wg.Go(func() { evictDone <- m.runEviction(ctx) })
			}
		}
		m.evaluate()

		// Wait for the next tick; script results and slot changes are decided at once.
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
				break wait
			case <-scriptUpdates:
				m.evaluate()
			case <-m.poke:
				m.evaluate()
			case err := <-evictDone:
				evicting = false
				if err != nil {
					evictAgain = m.now().Add(max(evictRetry, m.cfg.EvictCooldown))
				}
			}
		}
	}
}

func (m *Monitor) observe(s Sample) {
	if s.At.IsZero() { // a Probe that does not stamp its samples: the hold needs times
		s.At = m.now()
	}
	m.mu.Lock()
	slots := m.slots
	prevPresent := m.sample.CgroupPresent
	first := m.sample.At.IsZero()
	m.sample = s
	m.mu.Unlock()
	if s.CgroupPresent != prevPresent || first {
		if s.CgroupPresent {
			m.log.Info("probing workers' parent cgroup", "parent", m.cfg.CgroupParent, "limit", s.Cgroup.Limit)
		} else if m.cfg.CgroupParent != "" {
			m.log.Info("workers' parent cgroup not there (yet); node-level memory only", "parent", m.cfg.CgroupParent)
		}
	}
	m.source = SourceNode
	if s.Source == SourceCgroup {
		m.source = m.cgSource
	}
	m.throttle.Observe(s.At, s.Used, slots)
	m.metrics.observe(s)
}

// evaluate recomputes the state from the throttle and the scripts, and publishes a change.
func (m *Monitor) evaluate() {
	m.mu.Lock()
	slots, used := m.slots, m.sample.Used
	m.mu.Unlock()
	var scripts []ScriptResult
	if m.scripts != nil {
		scripts = m.scripts.Results()
	}
	// A slot count lowered since the last probe must not leave more withheld than exist.
	withheld := min(m.throttle.Withheld(), slots)
	mem := memView{withheld: withheld, used: used, source: m.source, th: m.cfg.Thresholds(), releaseAt: m.throttle.ReleaseAt()}
	ns := decide(slots, mem, scripts, m.cfg.WarnWithhold, m.cfg.KillWorkersOnUnhealthy)

	m.mu.Lock()
	prev := m.state
	if prev.same(ns) {
		m.mu.Unlock()
		return
	}
	ns.Since = m.now()
	describe(&ns, mem)
	m.state = ns
	m.mu.Unlock()

	level := slog.LevelWarn
	if ns.Health == cluster.HealthHealthy {
		level = slog.LevelInfo
	}
	m.log.Log(context.Background(), level, "node health changed",
		"health", ns.Health, "from", prev.Health, "withheld", ns.Withheld, "was_withheld", prev.Withheld,
		"slots", ns.Slots, "reason", ns.Reason, "script", ns.Script, "kill_workers", ns.KillWorkers,
		"mem_used", round3(ns.MemUsed))
	m.metrics.withheld.Set(float64(ns.Withheld))
	m.metrics.setHealth(ns.Health)
	// One slot, latest wins: drop a state nobody read yet, then put the new one. Run is the
	// only sender, so nothing can slip in between.
	select {
	case <-m.changes:
	default:
	}
	m.changes <- ns
}

// evictRetry is the pause after an eviction episode that failed (nothing left to evict, a
// stop that failed), so that the monitor does not retry and log it on every probe.
const evictRetry = 5 * time.Second

func (m *Monitor) runEviction(ctx context.Context) error {
	e := &Evictor{
		Critical:   m.cfg.MemCritical,
		Cooldown:   m.cfg.EvictCooldown,
		Max:        m.evict.Max,
		Probe:      m.probe,
		Candidates: m.evict.Candidates,
		Stop:       m.evict.Stop,
		Logger:     m.log,
		OnEvict:    func(Candidate, Sample) { m.metrics.evictions.Inc() },
	}
	evicted, err := e.Run(ctx)
	if err != nil && ctx.Err() == nil {
		m.log.Error("eviction stopped", "evicted", len(evicted), "err", err)
		return err
	}
	return nil
}
