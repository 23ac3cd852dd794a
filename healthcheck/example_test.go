package healthcheck_test

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/healthcheck"
)

// How the agent embeds the monitor: protect itself, build the monitor from its flags, hook
// eviction to its driver, and publish every change of state at once.
func ExampleMonitor() {
	ctx := context.Background()
	cfg := healthcheck.DefaultConfig() // in the agent: filled from the CLI's flags
	if err := healthcheck.ProtectAgent(""); err != nil {
		slog.Warn("agent not protected from the OOM killer", "err", err)
	}
	prober, err := healthcheck.NewProber(healthcheck.ProbeOptions{CgroupParent: cfg.CgroupParent})
	if err != nil {
		return
	}
	m, err := healthcheck.NewMonitor(cfg, healthcheck.Options{
		Slots:      8,
		Probe:      prober,
		Registerer: prometheus.NewRegistry(),
		Evict: &healthcheck.EvictHooks{
			Candidates: func(ctx context.Context) ([]healthcheck.Candidate, error) {
				// For each running worker: its job's priority and memory request, and the
				// working set of its cgroup, prober.Cgroup(driver.CgroupPath(id)).
				return nil, nil
			},
			Stop: func(ctx context.Context, c healthcheck.Candidate) error {
				// driver.Stop(ctx, c.ID), returning once the worker has exited.
				return nil
			},
		},
	})
	if err != nil {
		return
	}
	go func() { _ = m.Run(ctx) }()
	node := cluster.Node{ID: "node-1", Slots: 8}
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-m.Changes():
			s.Apply(&node) // Throttled, Unschedulable
			// re-register node in the coordination store now; if s.KillWorkers, stop workers.
		}
	}
}
