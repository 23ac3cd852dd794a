package master_test

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
)

// TestLeaderAfterZooKeeperStall stalls the ZooKeeper server past the session timeout, as a
// starved machine does: every session expires at once. Afterwards exactly one master leads
// again.
func TestLeaderAfterZooKeeperStall(t *testing.T) {
	zk := zktest.Start(t, zktest.Options{TickTime: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var stores []coord.Store
	defer func() {
		cancel()
		wg.Wait()
		for _, s := range stores {
			s.Close()
		}
	}()
	var masters []*master.Master
	for _, id := range []string{"m1", "m2"} {
		s, err := coord.Open(ctx, zk.URL("/stall"), coord.Options{SessionTimeout: time.Second, Logger: stallLog(id)})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
		m, err := master.New(s, master.Config{ID: id, Logger: stallLog(id)})
		if err != nil {
			t.Fatal(err)
		}
		masters = append(masters, m)
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Run(ctx) }()
	}
	leaders := func() int {
		n := 0
		for _, m := range masters {
			if m.Leader() {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, "one leader", 15*time.Second, func() bool { return leaders() == 1 })
	for round := range 3 {
		zk.Pause()
		time.Sleep(3 * time.Second) // the stall under test: three session timeouts
		zk.Resume()
		testenv.Eventually(t, "one leader again after the stall", 20*time.Second, func() bool { return leaders() == 1 })
		t.Logf("round %d: one leader again", round)
	}
}

func stallLog(id string) *slog.Logger {
	if os.Getenv("STALL_LOG") == "" {
		return quiet
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("who", id)
}
