package agents_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/agenttest"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestConformance runs the agent protocol's checks, which the benchmarks' simulated agents
// pass too (agents/sim), against the real agent with the process driver: its workers are
// real processes in cgroups.
func TestConformance(t *testing.T) {
	var h *harness // the current check's: Worker is asked after Start
	agenttest.Run(t, testenv.ZKAddr(t), agenttest.Subject{
		Heartbeat:      heartbeat,
		SessionTimeout: sessionTimeout,
		Start: func(t *testing.T, node cluster.Node, open agenttest.Opener) func() {
			h = newHarness(t, "mem") // the driver, state directory and helper; the store is open's
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(20*time.Second))
			defer cancel()
			store, err := open(ctx, coord.Options{SessionTimeout: sessionTimeout, Logger: testenv.Logger(t, slog.LevelError)})
			if err != nil {
				t.Fatal(err)
			}
			cfg := h.cfg
			cfg.Node = node
			ra := h.start(cfg, store)
			return func() {
				if err := ra.stop(); err != nil {
					t.Errorf("agent Run: %v", err)
				}
				store.Close()
			}
		},
		Worker: func(k cluster.WorkerKey) cluster.WorkerAssignment {
			wa := h.wa(k.Job, k.Worker, 3, "run")
			wa.Key = k
			return wa
		},
	})
}
