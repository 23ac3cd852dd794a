package agents_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestLeaseTTLIsTheGrantedSession: on a ZooKeeper that grants at most 2s sessions
// (maxSessionTimeout=2000, tickTime=500), an agent asking for 8s runs its workers with a
// 2s lease ttl, and its node record shows both values; cut off from the store's leader, its
// worker stops with the granted session's lease. With the requested 8s a node cut off kept
// its workers 6s after the master moved them (measured here with the grant hidden from the
// agent: stopped 7.7s after the cut, against 1.8 to 2.0s with it).
func TestLeaseTTLIsTheGrantedSession(t *testing.T) {
	srv := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond, MaxSessionTimeout: 2 * time.Second})
	h := newHarness(t, "mem") // the driver, state directory and helper; the store is replaced
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	const asked = 8 * time.Second
	h.kind, h.zkURL = "zk", srv.URL(fmt.Sprintf("/granted-%x", rand.Uint64()))
	logger := testenv.Logger(t, slog.LevelError)
	open := func() coord.Store {
		s, err := coord.Open(ctx, h.zkURL, coord.Options{SessionTimeout: asked, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	h.store = open()
	cfg := h.cfg
	cfg.SessionTimeout, cfg.StoreURL = asked, h.zkURL
	store := &agents.SyncCut{Store: open()}
	h.start(cfg, store)
	h.assign(h.wa("wc", 0, 1, "run"))
	rec := h.waitRecord("the worker running", 15*time.Second, allRunning("wc/0"))
	if rec.SessionTimeout.Std() != 2*time.Second || rec.SessionRequested.Std() != asked {
		t.Errorf("node record: sessionTimeout %v, sessionRequested %v; want 2s granted of 8s asked", rec.SessionTimeout, rec.SessionRequested)
	}
	pid := 0
	for _, w := range rec.Workers {
		if w.Key == (cluster.WorkerKey{Job: "wc", Worker: 0}) {
			pid = w.PID
		}
	}
	ttl, err := launcherTTL(pid)
	if err != nil {
		t.Fatal(err)
	}
	if ttl != 2*time.Second {
		t.Errorf("worker's lease ttl %v, want the granted 2s (8s asked)", ttl)
	}

	// The node cut off from the store's leader (its keeper's syncs fail while the servers
	// answer probes: no "store down" leniency): the worker stops when the granted session's
	// lease lapses, as the masters, which see the session expire after 2s, move it.
	cut := time.Now()
	store.Cut.Store(true)
	testenv.EventuallyWith(t, "the worker stopped with its lease", 30*time.Second, func() (bool, string) {
		if alive(pid) {
			return false, fmt.Sprintf("wc/0 (pid %d) runs %s after its keeper was cut off", pid, time.Since(cut).Round(time.Millisecond))
		}
		return true, ""
	})
	t.Logf("figure: the worker stopped %s after its keeper was cut off (granted session 2s of 8s asked, grace 2s)",
		time.Since(cut).Round(time.Millisecond))
}

// launcherTTL finds the lease launcher among pid and its ancestors and returns its --ttl.
func launcherTTL(pid int) (time.Duration, error) {
	for p := pid; p > 1; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			return 0, err
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "--ttl" && i+1 < len(args) {
				return time.ParseDuration(args[i+1])
			}
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if p, err = strconv.Atoi(f[1]); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("no lease launcher above pid %d", pid)
}
