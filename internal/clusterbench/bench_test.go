package clusterbench_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/clusterbench"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestBenchCluster runs a small `stormdock bench cluster` (200 simulated nodes, 2,000
// workers) against a real master and a ZooKeeper of its own, and checks what it must get
// right whatever the machine's speed: every worker acknowledged running exactly once, and a
// rack's loss moving that rack's workers and no other. Its times are logged, not checked.
func TestBenchCluster(t *testing.T) {
	// 200 sessions from one address: over ZooKeeper's default of 60 per address.
	zk := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond, MaxClientCnxns: 0, Heap: "512m"})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(5*time.Minute))
	defer cancel()
	var progress strings.Builder
	rep, err := clusterbench.Run(ctx, clusterbench.Config{
		Store: "zk://" + zk.Addr(), Nodes: 200, Workers: 2000, Jobs: 20, DCs: 4, Racks: 5, Slots: 16,
		Heartbeat: 200 * time.Millisecond, Churn: 0.2, SessionTimeout: 5 * time.Second,
		Steady: 2 * time.Second, Poll: time.Second, Pollers: 10, Settle: testenv.Timeout(2 * time.Minute),
		Progress: &progress,
	})
	t.Log("progress:\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("figure: small bench cluster report:\n%s", b)

	if rep.Submit.Left != 0 || rep.Submit.Workers != 2000 {
		t.Errorf("submit: %d of %d workers not acknowledged", rep.Submit.Left, rep.Submit.Workers)
	}
	// Read from the leader's /metrics with the scrape token: none would mean the scrape was refused.
	if rep.Submit.Reconciles == 0 {
		t.Errorf("submit: no reconciles read from the master's /metrics")
	}
	if rep.StartedTwice != 0 {
		t.Errorf("%d workers started more than once", rep.StartedTwice)
	}
	if rep.Rack.Workers == 0 || rep.Rack.Left != 0 {
		t.Errorf("rack loss: %d workers on the rack, %d not running elsewhere", rep.Rack.Workers, rep.Rack.Left)
	}
	if rep.Rack.OthersMoved != 0 || rep.Rack.OthersRestarted != 0 {
		t.Errorf("rack loss moved %d and restarted %d workers of other racks", rep.Rack.OthersMoved, rep.Rack.OthersRestarted)
	}
	if rep.DC == nil || rep.DC.Workers == 0 || rep.DC.Left != 0 {
		t.Errorf("dc loss: %+v", rep.DC)
	}
	if rep.Poll.Errors != 0 || rep.Poll.Requests == 0 {
		t.Errorf("API pollers: %d requests, %d errors", rep.Poll.Requests, rep.Poll.Errors)
	}
	if rep.Store.LargestAssign == 0 || rep.Store.LargestAssign > 1<<20 {
		t.Errorf("largest assignment %d bytes", rep.Store.LargestAssign)
	}
}

// TestBenchClusterRefusesCappedServer: a ZooKeeper that caps connections per address below
// the agents' sessions is refused with a line saying what to change.
func TestBenchClusterRefusesCappedServer(t *testing.T) {
	zk := zktest.Start(t, zktest.Options{MaxClientCnxns: 60})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(time.Minute))
	defer cancel()
	_, err := clusterbench.Run(ctx, clusterbench.Config{Store: "zk://" + zk.Addr(), Nodes: 200, Workers: 2000, DCs: 4, Racks: 5, Slots: 16})
	if err == nil || !strings.Contains(err.Error(), "maxClientCnxns=0") {
		t.Fatalf("err = %v, want one naming maxClientCnxns", err)
	}
}
