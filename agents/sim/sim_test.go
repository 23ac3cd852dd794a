package sim_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/agenttest"
	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestConformance runs the agent protocol's checks, which the real agent passes too
// (agents/conformance_test.go), against a simulated agent.
func TestConformance(t *testing.T) {
	const heartbeat = 100 * time.Millisecond
	agenttest.Run(t, testenv.ZKAddr(t), agenttest.Subject{
		Heartbeat:      heartbeat,
		SessionTimeout: 2 * time.Second,
		Start: func(t *testing.T, node cluster.Node, open agenttest.Opener) func() {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(20*time.Second))
			defer cancel()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			a, err := sim.Start(ctx, sim.Config{Heartbeat: heartbeat, Churn: 0.5, Logger: log, Open: func(ctx context.Context) (coord.Store, error) {
				return open(ctx, coord.Options{SessionTimeout: 2 * time.Second, BufferSize: sim.DefaultBufferSize, Logger: log})
			}}, node)
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := a.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
		},
		Worker: func(k cluster.WorkerKey) cluster.WorkerAssignment {
			return cluster.WorkerAssignment{Key: k, Generation: 3, Tenant: "search", Workers: 3, Isolation: cluster.IsolationProcess,
				Command: []string{"true"}, Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}, Grace: cluster.Duration(time.Second)}
		},
	})
}
