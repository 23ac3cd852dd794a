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

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestLeaseTTLIsTheGrantedSession: on a ZooKeeper that grants at most 2s sessions
// (maxSessionTimeout=2000, tickTime=500), an agent asking for 8s runs its workers with a
// 2s lease ttl, and its node record shows both values. With the requested 8s a node cut
// off would keep its workers 6s after the master moved them.
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
	h.start(cfg, open())
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
