package agents

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/healthcheck"
)

// HealthMonitor runs the node's health checks for an agent: it is the agent's Health, and
// it evicts through the agent when memory reaches the critical mark. Create it, pass it as
// Config.Health, Attach the agent, then Run it.
type HealthMonitor struct {
	m       *healthcheck.Monitor
	log     *slog.Logger
	changed chan struct{}

	mu    sync.Mutex
	agent *Agent
	state healthcheck.NodeState
}

// NewHealthMonitor builds the monitor for a node of slots worker slots.
func NewHealthMonitor(cfg healthcheck.Config, slots int, reg prometheus.Registerer, log *slog.Logger) (*HealthMonitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	prober, err := healthcheck.NewProber(healthcheck.ProbeOptions{CgroupParent: cfg.CgroupParent})
	if err != nil {
		return nil, fmt.Errorf("agent: health probe: %w", err)
	}
	h := &HealthMonitor{log: log, changed: make(chan struct{}, 1)}
	h.m, err = healthcheck.NewMonitor(cfg, healthcheck.Options{
		Slots: slots, Probe: prober, Registerer: reg, Logger: log,
		Evict: &healthcheck.EvictHooks{Candidates: h.candidates, Stop: h.evict},
	})
	if err != nil {
		return nil, fmt.Errorf("agent: health monitor: %w", err)
	}
	h.state = h.m.State()
	return h, nil
}

// Attach names the agent whose workers the monitor may evict.
func (h *HealthMonitor) Attach(a *Agent) {
	h.mu.Lock()
	h.agent = a
	h.mu.Unlock()
}

func (h *HealthMonitor) attached() *Agent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.agent
}

func (h *HealthMonitor) candidates(ctx context.Context) ([]healthcheck.Candidate, error) {
	a := h.attached()
	if a == nil {
		return nil, nil
	}
	vs, err := a.Victims(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]healthcheck.Candidate, len(vs))
	for i, v := range vs {
		out[i] = healthcheck.Candidate{ID: v.ID, Priority: v.Priority, Request: v.Request, Usage: v.Usage}
	}
	return out, nil
}

func (h *HealthMonitor) evict(ctx context.Context, c healthcheck.Candidate) error {
	a := h.attached()
	if a == nil {
		return fmt.Errorf("agent: no agent attached to evict %s", c.ID)
	}
	return a.Evict(ctx, c.ID)
}

// State is the node's health as the agent publishes it.
func (h *HealthMonitor) State() cluster.NodeHealth {
	h.mu.Lock()
	s := h.state
	h.mu.Unlock()
	reason := s.Reason
	if s.Script != "" && s.Output != "" {
		reason += ": " + s.Output
	}
	return cluster.NodeHealth{State: s.Health, Reason: reason, Throttled: s.Withheld}
}

// Changed signals a change of State.
func (h *HealthMonitor) Changed() <-chan struct{} { return h.changed }

// Run probes until ctx is done. When a failing script marks the node unhealthy and the
// operator asked for it (--health-kill-workers), it evicts every running worker.
func (h *HealthMonitor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		errc <- h.m.Run(ctx)
	}()
	for {
		select {
		case <-ctx.Done():
			return <-errc
		case err := <-errc:
			return err
		case s := <-h.m.Changes():
			h.mu.Lock()
			h.state = s
			h.mu.Unlock()
			select {
			case h.changed <- struct{}{}:
			default:
			}
			if s.KillWorkers && s.Health == cluster.HealthUnhealthy {
				h.evictAll(ctx)
			}
		}
	}
}

func (h *HealthMonitor) evictAll(ctx context.Context) {
	a := h.attached()
	if a == nil {
		return
	}
	vs, err := a.Victims(ctx)
	if err != nil {
		return
	}
	for _, v := range vs {
		if err := a.Evict(ctx, v.ID); err != nil {
			h.log.Warn("evict on unhealthy node", "worker", v.ID, "err", err)
		}
	}
}
