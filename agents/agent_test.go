package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/process"
)

var stores = []string{"mem", "zk"}

// An assignment makes the agent run its workers under the launcher, with the worker
// contract's environment, and report them in one node record.
func TestAssignmentRunsWorkersWithEnv(t *testing.T) {
	for _, kind := range stores {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t, kind)
			reg := prometheus.NewRegistry()
			cfg := h.cfg
			cfg.Registerer = reg
			h.start(cfg, h.agentStore())

			mirrored := h.wa("mirror", 1, 7, "run")
			mirrored.Key.Link = "dc-a"
			mirrored.Output = ""
			h.assign(h.wa("wc", 0, 3, "run"), mirrored)
			rec := h.waitRecord("both workers running", 10*time.Second, allRunning("wc/0", "mirror@dc-a/1"))

			if rec.Node.Labels["isolation/process"] != "true" || rec.Node.Labels["disk"] != "ssd" {
				t.Errorf("labels = %v, want isolation/process=true and disk=ssd", rec.Node.Labels)
			}
			if len(rec.Isolation) != 1 || rec.Isolation[0] != cluster.IsolationProcess {
				t.Errorf("isolation = %v", rec.Isolation)
			}
			if rec.Health.State != cluster.HealthHealthy || rec.Agent == "" || rec.Node.Slots != 4 {
				t.Errorf("record = %+v", rec)
			}
			ports := map[string]bool{}
			for key, want := range map[string]map[string]string{
				"wc.0": {"STORMDOCK_JOB": "wc", "STORMDOCK_TENANT": "search", "STORMDOCK_WORKER": "0",
					"STORMDOCK_WORKERS": "3", "STORMDOCK_DC": "dc-a", "STORMDOCK_RACK": "r1",
					"STORMDOCK_NODE": nodeID, "STORMDOCK_LINK": "", "STORMDOCK_OUTPUT": "http://127.0.0.1:9/out",
					"STORMDOCK_GENERATION": "3"},
				"mirror.dc-a.1": {"STORMDOCK_JOB": "mirror", "STORMDOCK_WORKER": "1", "STORMDOCK_LINK": "dc-a",
					"STORMDOCK_OUTPUT": "", "STORMDOCK_GENERATION": "7"},
			} {
				var reps []helperReport
				testenv.Eventually(t, key+" report", 5*time.Second, func() bool { reps = h.reports(key); return len(reps) > 0 })
				if len(reps) != 1 {
					t.Fatalf("%s started %d times, want 1", key, len(reps))
				}
				env := reps[0].Env
				for k, v := range want {
					if got, ok := env[k]; !ok || got != v {
						t.Errorf("%s: %s = %q (set %v), want %q", key, k, got, ok, v)
					}
				}
				// Each worker has two ports of the node's range: STORMDOCK_PORT and
				// STORMDOCK_METRICS_PORT, none given twice.
				for _, v := range []string{"STORMDOCK_PORT", "STORMDOCK_METRICS_PORT"} {
					port, err := strconv.Atoi(env[v])
					if err != nil || port < agents.DefaultPortBase || port >= agents.DefaultPortBase+4 {
						t.Errorf("%s: %s = %q, want one of 6700..6703", key, v, env[v])
					}
					if ports[env[v]] {
						t.Errorf("%s: port %s given twice", key, env[v])
					}
					ports[env[v]] = true
				}
				// The worker runs under the launcher: the pid the record reports is its parent.
				st := states(rec)
				k := "wc/0"
				if key != "wc.0" {
					k = "mirror@dc-a/1"
				}
				if reps[0].PPID != st[k].PID {
					t.Errorf("%s: worker's parent is %d, record reports pid %d (the launcher)", key, reps[0].PPID, st[k].PID)
				}
			}
			testenv.Eventually(t, "metrics", 2*time.Second, func() bool {
				return testenv.Metric(t, reg, "stormdock_agent_workers", map[string]string{"state": "running"}) == 2
			})
			for kind, want := range map[string]float64{"total": 4, "used": 2, "free": 2, "throttled": 0} {
				if got := testenv.Metric(t, reg, "stormdock_agent_slots", map[string]string{"kind": kind}); got != want {
					t.Errorf("slots{kind=%s} = %v, want %v", kind, got, want)
				}
			}
			if got := testenv.Metric(t, reg, "stormdock_agent_worker_starts_total", nil); got != 2 {
				t.Errorf("starts = %v, want 2", got)
			}
			// The keeper's writes are counted on the agent's next look at its keeper.
			testenv.Eventually(t, "store writes counted", 5*time.Second, func() bool {
				return testenv.Metric(t, reg, "stormdock_agent_store_writes_total", nil) >= 1
			})
		})
	}
}

// A changed assignment starts and stops only the difference, and replaces a worker whose
// generation changed.
func TestAssignmentChangeTouchesOnlyTheDifference(t *testing.T) {
	h := newHarness(t, "mem")
	h.start(h.cfg, h.agentStore())
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"), h.wa("wc", 2, 1, "run"))
	before := states(h.waitRecord("3 workers", 10*time.Second, allRunning("wc/0", "wc/1", "wc/2")))
	for _, key := range []string{"wc.0", "wc.1", "wc.2"} {
		h.waitReports(key, 1) // the helpers are up and handle SIGTERM
	}

	// wc/0 stays, wc/1 gets a new generation that changes what it runs, wc/2 goes, wc/3
	// comes.
	changed1 := h.wa("wc", 1, 2, "run")
	changed1.Env["VERSION"] = "2"
	h.assign(h.wa("wc", 0, 1, "run"), changed1, h.wa("wc", 3, 1, "run"))
	after := states(h.waitRecord("new set", 10*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)
		return allRunning("wc/0", "wc/1", "wc/3")(rec) && st["wc/1"].Generation == 2
	}))
	if after["wc/0"].PID != before["wc/0"].PID {
		t.Errorf("unchanged worker wc/0 was restarted: pid %d -> %d", before["wc/0"].PID, after["wc/0"].PID)
	}
	if after["wc/1"].PID == before["wc/1"].PID {
		t.Errorf("wc/1 got a new generation but kept pid %d", after["wc/1"].PID)
	}
	for _, k := range []string{"wc/1", "wc/2"} {
		if alive(before[k].PID) {
			t.Errorf("%s's old launcher (pid %d) still runs", k, before[k].PID)
		}
	}
	// The stopped workers drained on SIGTERM.
	for _, key := range []string{"wc.1", "wc.2"} {
		if r := h.reports(key); len(r) == 0 || !h.terminated(key, r[0].PID) {
			t.Errorf("%s did not drain on SIGTERM", key)
		}
	}
	if n := len(h.reports("wc.0")); n != 1 {
		t.Errorf("wc/0 started %d times, want 1", n)
	}
	// A change of the run spec alone (same generation) replaces the worker too.
	changed := h.wa("wc", 0, 1, "run")
	changed.Env["EXTRA"] = "1"
	h.assign(changed, changed1, h.wa("wc", 3, 1, "run"))
	h.waitRecord("wc/0 replaced", 10*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)
		return allRunning("wc/0", "wc/1", "wc/3")(rec) && st["wc/0"].PID != after["wc/0"].PID
	})
	if st := states(h.waitRecord("others kept", time.Second, allRunning("wc/0", "wc/1", "wc/3"))); st["wc/1"].PID != after["wc/1"].PID || st["wc/3"].PID != after["wc/3"].PID {
		t.Errorf("workers whose assignment did not change were restarted")
	}
}

// A change of what a worker can re-read (generation, worker count and epoch, live env)
// rewrites its live configuration and sends it SIGHUP; it is not restarted.
func TestLiveChangeReachesRunningWorker(t *testing.T) {
	h := newHarness(t, "mem")
	h.start(h.cfg, h.agentStore())
	w := h.wa("wc", 0, 1, "run")
	w.Epoch, w.LiveEnv = 1, map[string]string{"LEVEL": "info"}
	h.assign(w)
	before := states(h.waitRecord("wc/0 running", 10*time.Second, allRunning("wc/0")))["wc/0"]
	rep := h.waitReports("wc.0", 1)[0]
	var first cluster.WorkerConfig
	if b, err := os.ReadFile(rep.Env["STORMDOCK_CONFIG"]); err != nil || json.Unmarshal(b, &first) != nil || first.Env["LEVEL"] != "info" || first.Epoch != 1 {
		t.Errorf("live configuration at start: %+v (%v), want epoch 1 and LEVEL=info", first, err)
	}

	w.Generation, w.Workers, w.Epoch, w.LiveEnv = 2, 5, 2, map[string]string{"LEVEL": "debug"}
	w.Grace = cluster.Duration(3 * time.Second) // the agent's own: recorded, not signalled
	h.assign(w)
	var cfg cluster.WorkerConfig
	testenv.EventuallyWith(t, "a SIGHUP with the new configuration", 10*time.Second, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(h.helperDir, fmt.Sprintf("wc.0.%d.hup.1", rep.PID)))
		if err != nil {
			return false, err.Error()
		}
		return json.Unmarshal(b, &cfg) == nil, string(b)
	})
	want := cluster.WorkerConfig{Job: "wc", Worker: 0, Workers: 5, Epoch: 2, Generation: 2,
		Env: map[string]string{"HELPER_DIR": h.helperDir, "HELPER_MODE": "run", "HELPER_CRASH_AFTER": "100ms", "LEVEL": "debug"}}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("live configuration at SIGHUP = %+v, want %+v", cfg, want)
	}
	after := states(h.waitRecord("generation 2 reported", 10*time.Second, func(rec cluster.NodeRecord) bool {
		return allRunning("wc/0")(rec) && states(rec)["wc/0"].Generation == 2
	}))["wc/0"]
	if after.PID != before.PID || len(h.reports("wc.0")) != 1 {
		t.Errorf("wc/0 restarted by a live change: pid %d -> %d, %d starts", before.PID, after.PID, len(h.reports("wc.0")))
	}
	// A grace change alone is not the worker's business: no second signal.
	w.Grace = cluster.Duration(4 * time.Second)
	h.assign(w)
	w.LiveEnv = map[string]string{"LEVEL": "warn"}
	h.assign(w)
	testenv.Eventually(t, "the second SIGHUP", 10*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(h.helperDir, fmt.Sprintf("wc.0.%d.hup.2", rep.PID)))
		return err == nil
	})
	if _, err := os.Stat(filepath.Join(h.helperDir, fmt.Sprintf("wc.0.%d.hup.3", rep.PID))); err == nil {
		t.Errorf("a third SIGHUP: the grace change was signalled")
	}
}

// A crashing worker is restarted with a growing backoff, and its restarts are reported.
func TestCrashRestartsWithBackoff(t *testing.T) {
	h := newHarness(t, "mem")
	reg := prometheus.NewRegistry()
	cfg := h.cfg
	cfg.Registerer = reg
	cfg.RestartBackoff = 500 * time.Millisecond
	cfg.MaxBackoff = 10 * time.Second
	h.start(cfg, h.agentStore())
	h.assign(h.wa("crash", 0, 1, "crash"))
	rec := h.waitRecord("4 restarts", 30*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)["crash/0"]
		return st.Restarts >= 4
	})
	st := states(rec)["crash/0"]
	if st.RecentRestarts < 4 || st.LastExit != "exited with code 3" {
		t.Errorf("status = %+v, want recentRestarts >= 4 and lastExit \"exited with code 3\"", st)
	}
	reps := h.reports("crash.0")
	if len(reps) < 4 {
		t.Fatalf("%d starts, want >= 4", len(reps))
	}
	// The pauses between a worker's end and its next start double: 500ms, 1s, 2s. The reports'
	// times also hold the worker's run (100ms) and the start latency (which a loaded machine
	// stretches), so each gap must be at least its backoff, and the third must exceed the
	// first by about the backoffs' difference (1.5s).
	var gaps []time.Duration
	for i := 1; i < 4; i++ {
		gaps = append(gaps, reps[i].At.Sub(reps[i-1].At))
	}
	for i, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second} {
		if gaps[i] < want+100*time.Millisecond || gaps[i] > want+testenv.Timeout(3*time.Second) {
			t.Errorf("time between start %d and %d = %s, want the %s backoff plus the 100ms run and a start (all: %v)", i, i+1, gaps[i], want, gaps)
		}
	}
	if grow := gaps[2] - gaps[0]; grow < time.Second {
		t.Errorf("gaps %v grow by %s, want about 1.5s: no exponential backoff", gaps, grow)
	}
	if got := testenv.Metric(t, reg, "stormdock_agent_worker_restarts_total", nil); got < 4 {
		t.Errorf("restarts metric = %v, want >= 4", got)
	}
}

// A worker that exits by itself with the launcher's lapse status while its lease is fine
// gains nothing: it is a crash like any other, backed off and counted for the master.
func TestForgedLapseExitIsACrash(t *testing.T) {
	h := newHarness(t, "mem")
	cfg := h.cfg
	cfg.RestartBackoff = 100 * time.Millisecond
	h.start(cfg, h.agentStore())
	wa := h.wa("forge", 0, 1, "crash")
	wa.Env["HELPER_EXIT_CODE"] = strconv.Itoa(launcher.ExitLeaseLapsed)
	h.assign(wa)
	rec := h.waitRecord("2 restarts", 30*time.Second, func(rec cluster.NodeRecord) bool {
		return states(rec)["forge/0"].RecentRestarts >= 2
	})
	if st := states(rec)["forge/0"]; st.ExitReason != cluster.ExitCrashed || st.Lapses != 0 ||
		st.LastExit != fmt.Sprintf("exited with code %d", launcher.ExitLeaseLapsed) {
		t.Errorf("status = %+v, want a crash (exit %d), no lapse", st, launcher.ExitLeaseLapsed)
	}
}

// The agent's own stops (a rollout's replacement here; drains, moves and kills take the
// worker off the node, evictions are told apart as evicted) count no restart.
func TestAgentStopsAreNotCrashes(t *testing.T) {
	h := newHarness(t, "mem")
	h.start(h.cfg, h.agentStore())
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"))
	before := states(h.waitRecord("running", 10*time.Second, allRunning("wc/0", "wc/1")))
	next := h.wa("wc", 0, 2, "run")
	next.Restart = 1
	h.assign(next) // a restart rollout replaces wc/0; wc/1 moves off the node
	rec := h.waitRecord("wc/0 replaced, wc/1 gone", 15*time.Second, func(rec cluster.NodeRecord) bool {
		st, ok := states(rec)["wc/0"]
		return ok && len(rec.Workers) == 1 && st.State == cluster.WorkerRunning && st.Generation == 2 && st.PID != before["wc/0"].PID
	})
	if st := states(rec)["wc/0"]; st.Restarts != 0 || st.RecentRestarts != 0 || st.ExitReason != cluster.ExitStopped {
		t.Errorf("status = %+v, want no restart counted and exit reason %q", st, cluster.ExitStopped)
	}
}

// A new agent on the same state directory adopts the running workers: same pids, no restart.
func TestRestartedAgentAdoptsWorkers(t *testing.T) {
	h := newHarness(t, "mem")
	store := h.agentStore()
	first := h.start(h.cfg, store)
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"))
	before := states(h.waitRecord("running", 10*time.Second, allRunning("wc/0", "wc/1")))
	h.waitReports("wc.0", 1)
	h.waitReports("wc.1", 1)
	firstAgent := func() string { r, _, _ := h.record(); return r.Agent }()
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	// A second agent may not share the state directory while one runs: tested here by
	// running one and then trying another.
	h.drv.Close()
	h.drv = h.newDriver() // a new driver: the workers are no longer its children
	second := h.start(h.cfg, h.agentStore())
	rec := h.waitRecord("adopted", 10*time.Second, func(rec cluster.NodeRecord) bool {
		return rec.Agent != firstAgent && allRunning("wc/0", "wc/1")(rec)
	})
	after := states(rec)
	for _, k := range []string{"wc/0", "wc/1"} {
		if after[k].PID != before[k].PID || after[k].Restarts != 0 {
			t.Errorf("%s: pid %d -> %d, restarts %d: want adopted as is", k, before[k].PID, after[k].PID, after[k].Restarts)
		}
	}
	for _, key := range []string{"wc.0", "wc.1"} {
		if n := len(h.reports(key)); n != 1 {
			t.Errorf("%s started %d times, want 1", key, n)
		}
	}
	// Adopted workers keep their leases: they outlive more than a ttl.
	testenv.AssertUntil(t, "adopted workers running", 2*sessionTimeout, func() (bool, string) {
		for _, k := range []string{"wc/0", "wc/1"} {
			if !alive(before[k].PID) {
				return false, "adopted worker " + k + " stopped: its lease was not renewed"
			}
		}
		return true, ""
	})
	// And the new agent manages them: a removal stops the adopted worker.
	h.assign(h.wa("wc", 0, 1, "run"))
	h.waitRecord("wc/1 gone", 10*time.Second, allRunning("wc/0"))
	testenv.Eventually(t, "adopted wc/1 stopped", 5*time.Second, func() bool { return !alive(before["wc/1"].PID) })

	third, err := agents.New(h.cfg, store, agents.Driver{Isolation: cluster.IsolationProcess, Driver: h.drv})
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Run(context.Background()); !errors.Is(err, agents.ErrStateDirLocked) {
		t.Errorf("second agent on a state dir in use: err = %v, want ErrStateDirLocked", err)
	}
	_ = second
}

// When the node's session expires the agent does not trust the assignment it has: it acts
// again only on one the master stamped with the node's new session. Then it keeps the workers
// still assigned to it, with the same pids, and stops those the master moved meanwhile.
// Cut off from a store that serves others, the node's workers stop once their leases lapse,
// at about the time the master re-places them, and run again when it is back.
func TestSessionExpiryKeepsWhatIsStillAssigned(t *testing.T) {
	t.Run("mem", func(t *testing.T) {
		h := newHarness(t, "mem")
		store := h.agentStore()
		h.start(h.cfg, store)
		h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"))
		before := states(h.waitRecord("running", 10*time.Second, allRunning("wc/0", "wc/1")))
		_, oldEntry, _ := h.record()
		// While the node's session was lost the master moved wc/1 elsewhere; it stamps the
		// node's assignment once it sees the node back.
		h.setAssigned(h.wa("wc", 0, 1, "run"))
		if err := h.srv.ExpireSession(store.SessionID()); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "wc/1 stopped", 10*time.Second, func() bool { return !alive(before["wc/1"].PID) })
		rec := h.waitRecord("record back with wc/0 only", 10*time.Second, func(rec cluster.NodeRecord) bool {
			return len(rec.Workers) == 1 && allRunning("wc/0")(rec)
		})
		if got := states(rec)["wc/0"].PID; got != before["wc/0"].PID || !alive(got) {
			t.Errorf("wc/0 runs as pid %d, was %d: a worker still assigned to the node was restarted", got, before["wc/0"].PID)
		}
		if _, e, _ := h.record(); e.Owner != store.SessionID() || e.Owner == oldEntry.Owner || e.CreateRev == oldEntry.CreateRev {
			t.Errorf("record owned by session %x (created at %d), want re-created by the new session %x (old: %x at %d)",
				e.Owner, e.CreateRev, store.SessionID(), oldEntry.Owner, oldEntry.CreateRev)
		}
	})
	t.Run("zk", func(t *testing.T) {
		h := newHarness(t, "zk")
		store := h.agentStore()
		h.start(h.cfg, store)
		h.assign(h.wa("wc", 0, 1, "run"))
		before := states(h.waitRecord("running", 10*time.Second, allRunning("wc/0")))
		oldSession := store.SessionID()

		// A partition: the node cannot reach ZooKeeper, which serves others. Its keeper stops
		// renewing the lease; the launcher stops the worker when the session would expire,
		// without waiting to learn of the expiry.
		cut := time.Now()
		h.dialer.Cut()
		testenv.Eventually(t, "worker stopped during the partition", 3*sessionTimeout+3*time.Second, func() bool {
			return !alive(before["wc/0"].PID)
		})
		stoppedAfter := time.Since(cut)
		t.Logf("worker stopped %s after the partition began", stoppedAfter.Round(time.Millisecond))
		if stoppedAfter < sessionTimeout/2 {
			t.Errorf("worker stopped %s after the partition began: before any session could expire", stoppedAfter)
		}
		// The node is gone for the master.
		testenv.Eventually(t, "node entry gone", 10*time.Second, func() bool { _, _, ok := h.record(); return !ok })
		h.dialer.Heal()
		rec := h.waitRecord("record back, worker restarted", 15*time.Second, func(rec cluster.NodeRecord) bool {
			return allRunning("wc/0")(rec) && states(rec)["wc/0"].PID != before["wc/0"].PID
		})
		if store.SessionID() == oldSession {
			t.Error("session was not renewed")
		}
		// The launcher stopped the worker for its lapsed lease: not the worker's failure.
		if st := states(rec)["wc/0"]; st.Restarts != 0 || st.RecentRestarts != 0 || st.ExitReason != cluster.ExitLeaseLapsed ||
			st.Lapses < 1 || !strings.Contains(st.LastExit, "not counted as a crash") {
			t.Errorf("status = %+v, want no restarts counted, exit reason %q and a lapse", st, cluster.ExitLeaseLapsed)
		}
	})
}

// fakeHealth is a Health whose state the test sets.
type fakeHealth struct {
	mu sync.Mutex
	h  cluster.NodeHealth
	ch chan struct{}
}

func (f *fakeHealth) State() cluster.NodeHealth {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.h
}

func (f *fakeHealth) Changed() <-chan struct{} { return f.ch }

func (f *fakeHealth) set(h cluster.NodeHealth) {
	f.mu.Lock()
	f.h = h
	f.mu.Unlock()
	select {
	case f.ch <- struct{}{}:
	default:
	}
}

// Steady workers cause no writes; changes are written at once but at most one per 100ms
// however fast they come; a health change is published at once.
func TestWritesBounded(t *testing.T) {
	h := newHarness(t, "mem")
	counting := &countingStore{Store: h.agentStore()}
	health := &fakeHealth{h: cluster.NodeHealth{State: cluster.HealthHealthy}, ch: make(chan struct{}, 1)}
	cfg := h.cfg
	cfg.Heartbeat = 200 * time.Millisecond
	cfg.Health = health
	h.start(cfg, counting)
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"))
	h.waitRecord("running", 10*time.Second, allRunning("wc/0", "wc/1"))
	// The first memory samples may change the record once more (a helper under the small
	// launcher may round to 0 and change nothing): wait until two sample rounds began, by
	// when the first one's readings are published.
	calls0 := h.usageCalls.Load()
	testenv.Eventually(t, "memory sampled", 10*time.Second, func() bool { return h.usageCalls.Load() >= calls0+2*2 })

	// Steady workers: heartbeats write nothing, so the evidence that they happened is the
	// memory samples, one round per agents' sampleEvery (5) heartbeats: three rounds span at
	// least 10 heartbeats.
	const beats = 10
	start, calls := counting.writes.Load(), h.usageCalls.Load()
	testenv.Eventually(t, "three memory sample rounds", 10*time.Second, func() bool { return h.usageCalls.Load() >= calls+3*2 })
	steady := counting.writes.Load() - start
	t.Logf("steady workers: %d store writes over %d+ heartbeats", steady, beats)
	if steady > 1 {
		t.Errorf("%d writes over %d+ heartbeats with nothing changing, want at most 1 (a memory reading crossing a MiB); last records:\n%s",
			steady, beats, strings.Join(counting.lastValues(int(steady)+1), "\n"))
	}

	// Worker churn: a crash-looping worker changes state all the time (it crashes 100ms
	// after each start, restarted after 100ms at first); still at most one write per 100ms
	// throughout (three more: the agent's burst after a quiet while, and a write under way).
	h.assign(h.wa("wc", 0, 1, "run"), h.wa("wc", 1, 1, "run"), h.wa("crash", 0, 1, "crash"))
	start = counting.writes.Load()
	began := time.Now()
	const minWrite = 100 * time.Millisecond
	testenv.AssertUntil(t, "at most one write per 100ms", beats*cfg.Heartbeat, func() (bool, string) {
		n := counting.writes.Load() - start
		elapsed := time.Since(began)
		if most := int64(elapsed/minWrite) + 3; n > most {
			return false, fmt.Sprintf("%d writes in %s, want at most %d (one per %s)", n, elapsed, most, minWrite)
		}
		return true, ""
	})
	churn := counting.writes.Load() - start
	t.Logf("crash-looping worker: %d store writes over %s", churn, time.Since(began).Round(time.Millisecond))
	if churn == 0 {
		t.Errorf("no writes over %d+ heartbeats with a changing worker", beats)
	}

	// Throttling should reach the master in under a second, whatever the heartbeat: the time
	// is logged; the bound only catches a hang (a loaded machine can take longer).
	begin := time.Now()
	health.set(cluster.NodeHealth{State: cluster.HealthThrottled, Reason: "memory pressure", Throttled: 2})
	rec := h.waitRecord("throttling published", 5*time.Second, func(rec cluster.NodeRecord) bool {
		return rec.Health.Throttled == 2 && rec.Node.Throttled == 2
	})
	t.Logf("throttling published after %s", time.Since(begin).Round(time.Millisecond))
	if rec.Health.State != cluster.HealthThrottled || rec.Health.Reason != "memory pressure" {
		t.Errorf("health = %+v", rec.Health)
	}
}

// A health change is published within 100ms even with a long heartbeat, and flapping is
// bounded to one write per 100ms (after a first burst of the agent's three).
func TestHealthPublishedImmediately(t *testing.T) {
	h := newHarness(t, "mem")
	counting := &countingStore{Store: h.agentStore()}
	health := &fakeHealth{h: cluster.NodeHealth{State: cluster.HealthHealthy}, ch: make(chan struct{}, 1)}
	cfg := h.cfg
	cfg.Heartbeat = 10 * time.Second
	cfg.Health = health
	h.start(cfg, counting)
	h.waitRecord("registered", 5*time.Second, func(cluster.NodeRecord) bool { return true })
	for i := 1; i <= 3; i++ {
		begin := time.Now()
		health.set(cluster.NodeHealth{State: cluster.HealthThrottled, Throttled: i})
		// Published at once, not at the next heartbeat (10 s away); the bound is loose so that
		// a loaded machine does not fail it, and the time is logged.
		h.waitRecord("throttled "+strconv.Itoa(i), 5*time.Second, func(rec cluster.NodeRecord) bool { return rec.Node.Throttled == i })
		t.Logf("throttling %d published after %s", i, time.Since(begin))
	}
	// Flapping: 50 changes, one per 10ms, make at most one write per 100ms (one more for the
	// last change), however long a loaded machine takes for them.
	start := counting.writes.Load()
	begin := time.Now()
	for i := 0; i < 50; i++ {
		health.set(cluster.NodeHealth{State: cluster.HealthThrottled, Throttled: 10 + i%2})
		time.Sleep(10 * time.Millisecond) // the flapping under test: a change every 10ms
	}
	// A last, different state: once it is in the record, every earlier write has been made
	// (one writer, in order).
	health.set(cluster.NodeHealth{State: cluster.HealthThrottled, Throttled: 12})
	h.waitRecord("the last change published", 5*time.Second, func(rec cluster.NodeRecord) bool { return rec.Node.Throttled == 12 })
	took := time.Since(begin)
	n := counting.writes.Load() - start
	t.Logf("%d writes for 50 health changes in %s", n, took.Round(time.Millisecond))
	if most := int64(took/(100*time.Millisecond)) + 3; n > most {
		t.Errorf("%d writes for 50 health changes in %s, want at most %d (one per 100ms)", n, took.Round(time.Millisecond), most)
	}
}

// gatedDriver counts the driver starts under way, and holds each until n of them are under
// way at once (or every one of the total it expects has begun): starts made one after
// another would never get past it. Past the gate, the k-th start is held k*stagger more, so
// that the starts of one burst end apart from each other, as they do on a busy node.
type gatedDriver struct {
	isolation.Driver

	mu       sync.Mutex
	cond     *sync.Cond
	n, total int // the gate: n at once, total expected
	stagger  time.Duration
	entered  int
	passed   int
	running  int
	most     int // the most starts under way at once
}

func newGatedDriver(d isolation.Driver) *gatedDriver {
	g := &gatedDriver{Driver: d}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// expect sets the gate for the next total starts.
func (d *gatedDriver) expect(n, total int, stagger time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n, d.total, d.stagger, d.entered, d.passed = n, total, stagger, 0, 0
}

func (d *gatedDriver) Start(ctx context.Context, spec isolation.Spec) (isolation.Worker, error) {
	d.mu.Lock()
	d.entered++
	d.running++
	d.most = max(d.most, d.running)
	d.cond.Broadcast()
	for d.running < d.n && d.entered < d.total {
		d.cond.Wait()
	}
	hold := time.Duration(d.passed) * d.stagger
	d.passed++
	d.mu.Unlock()
	time.Sleep(hold) // the stagger under test: starts of one burst ending apart
	defer func() {
		d.mu.Lock()
		d.running--
		d.mu.Unlock()
	}()
	return d.Driver.Start(ctx, spec)
}

// An assignment's workers start concurrently, never more at once than the node has slots,
// and their start is reported as it happens, in one write of the node record, not at the
// next heartbeat (an hour away here).
func TestStartsConcurrentBoundedReportedAtOnce(t *testing.T) {
	h := newHarness(t, "mem")
	counting := &countingStore{Store: h.agentStore()}
	cfg := h.cfg
	cfg.Heartbeat = time.Hour
	cfg.Node.Slots = 4
	gate := newGatedDriver(h.drv)
	a, err := agents.New(cfg, counting, agents.Driver{Isolation: cluster.IsolationProcess, Driver: gate})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	})
	h.waitRecord("registered", 10*time.Second, func(cluster.NodeRecord) bool { return true })

	// One worker per slot: they start at once (the gate holds each until all four are under
	// way), end 150ms apart, and one write says they all run.
	var ws []cluster.WorkerAssignment
	var keys []string
	add := func(n int) {
		for range n {
			i := len(ws)
			ws = append(ws, h.wa("wc", i, 1, "run"))
			keys = append(keys, "wc/"+strconv.Itoa(i))
		}
	}
	add(cfg.Node.Slots)
	gate.expect(cfg.Node.Slots, cfg.Node.Slots, 150*time.Millisecond)
	before := counting.writes.Load()
	begin := time.Now()
	h.assign(ws...)
	h.waitRecord("all running", testenv.Timeout(30*time.Second), allRunning(keys...))
	took := time.Since(begin)
	writes := counting.writes.Load() - before
	t.Logf("figure: %d workers assigned -> reported running after %s, in %d node record writes", len(ws), took.Round(time.Millisecond), writes)
	if writes != 1 {
		t.Errorf("%d node record writes for one burst of %d starts, want 1:\n%s", writes, len(ws), strings.Join(counting.lastValues(int(writes)), "\n"))
	}

	// Twice as many new workers as slots: they start in waves of at most the node's slots.
	add(2 * cfg.Node.Slots)
	gate.expect(cfg.Node.Slots, 2*cfg.Node.Slots, 0)
	h.assign(ws...)
	h.waitRecord("all running", testenv.Timeout(30*time.Second), allRunning(keys...))
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if gate.most != cfg.Node.Slots {
		t.Errorf("at most %d starts at once, want the node's %d slots", gate.most, cfg.Node.Slots)
	}
}

// An isolation whose engine did not answer at the agent's start (Config.LateIsolation) is
// not offered, its workers are refused with the reason, and once AddDriver brings it the
// node offers it and runs them, without a restart of the agent.
func TestLateIsolation(t *testing.T) {
	h := newHarness(t, "mem")
	cfg := h.cfg
	cfg.LateIsolation = []string{cluster.IsolationDocker}
	ra := h.start(cfg, h.agentStore())
	late := h.wa("late", 0, 1, "run")
	late.Isolation = cluster.IsolationDocker // started through a second process driver standing in for docker
	h.assign(h.wa("wc", 0, 1, "run"), late)
	h.waitRecord("the process worker running, the late one refused", 10*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)
		return slices.Equal(rec.Isolation, []string{cluster.IsolationProcess}) && st["wc/0"].State == cluster.WorkerRunning &&
			strings.Contains(st["late/0"].LastExit, "isolation not offered")
	})
	d, err := process.New(process.Config{CgroupParent: h.cgParent, StateDir: filepath.Join(h.stateDir, "late"), Shim: shimBin,
		Logger: testenv.Logger(t, slog.LevelError)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ra.a.AddDriver(ctx, agents.Driver{Isolation: cluster.IsolationProcess, Driver: d}, nil); err == nil {
		t.Error("AddDriver took an isolation that is not late")
	}
	if err := ra.a.AddDriver(ctx, agents.Driver{Isolation: cluster.IsolationDocker, Driver: d}, nil); err != nil {
		t.Fatal(err)
	}
	// The stand-in runs no docker spec (its program is the image's /stormdock): that the
	// start reached it, and failed there, shows the agent uses it.
	h.waitRecord("both isolations offered, the late worker started through the added driver", 15*time.Second, func(rec cluster.NodeRecord) bool {
		st := states(rec)
		return slices.Equal(rec.Isolation, []string{cluster.IsolationDocker, cluster.IsolationProcess}) &&
			st["wc/0"].State == cluster.WorkerRunning && strings.Contains(st["late/0"].LastExit, "exec /stormdock")
	})
}
