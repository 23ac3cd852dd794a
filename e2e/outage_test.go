package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Issue 13's outages: running workers survive the loss of the store's quorum, a paused or
// restarted store, an agent restart and the loss of every master; only placement stops until
// they return. Each case checks, from /proc rather than the project's own API, that the same
// worker processes run before and after and that no worker ever ran twice, and measures how
// soon after recovery the cluster scales a job.

// outageCluster is a running job on three nodes, with two masters, on a harness's store.
type outageCluster struct {
	h       *harness
	masters []string // API URLs
	job     string
	workers int
	watch   *fenceWatch
}

func startOutageCluster(t *testing.T, h *harness, workers int) *outageCluster {
	t.Helper()
	oc := &outageCluster{h: h, job: "wc", workers: workers}
	oc.masters = []string{h.StartMaster("m1"), h.StartMaster("m2")}
	for i := 1; i <= 3; i++ {
		h.StartAgent(fmt.Sprintf("n%d", i), "dc-a", fmt.Sprintf("r%d", i), 4)
	}
	cl := h.AdminClient(oc.masters[0])
	ctx := context.Background()
	testenv.EventuallyWith(t, "3 nodes", 30*time.Second, func() (bool, string) {
		ns, err := cl.Nodes(ctx)
		return err == nil && len(ns) == 3, fmt.Sprintf("%d nodes, %v", len(ns), err)
	})
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec(oc.job, workers)); err != nil {
		t.Fatal(err)
	}
	oc.waitWorkers(t, workers)
	oc.watch = watchFence(t, oc.job, 0) // nothing is fenced in these outages
	// A scrape before any outage, as Prometheus' would be: the master then knows the
	// scrape token's hash when the store is out (see unavailable).
	if status, body := getMetrics(t, oc.masters[0], h.MetricsToken()); status != http.StatusOK {
		t.Fatalf("/metrics with the scrape token: %d %s", status, body)
	}
	return oc
}

// waitWorkers waits until n workers of the job run, one process each, from /proc.
func (oc *outageCluster) waitWorkers(t *testing.T, n int) map[string]procWorker {
	t.Helper()
	var ps map[string]procWorker
	testenv.EventuallyWith(t, fmt.Sprintf("%d workers of %s running", n, oc.job), 60*time.Second, func() (bool, string) {
		ps = procsOf(oc.job)
		all := workerProcs(oc.job)
		return len(ps) == n && len(all) == n, fmt.Sprintf("%d single, %d in all", len(ps), len(all))
	})
	return ps
}

// scale sets the job's worker count through any master that answers, retrying until one
// takes it, and returns when it did.
func (oc *outageCluster) scale(t *testing.T, n int) time.Time {
	t.Helper()
	var last error
	var when time.Time
	testenv.EventuallyWith(t, fmt.Sprintf("a master scaling %s to %d", oc.job, n), 60*time.Second, func() (bool, string) {
		for _, url := range oc.masters {
			cl := oc.h.AdminClient(url)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := cl.ScaleJob(ctx, oc.job, n)
			cancel()
			if err == nil {
				when = time.Now()
				return true, ""
			}
			last = err
		}
		return false, fmt.Sprint(last)
	})
	return when
}

// recovered checks the invariants after an outage: the same worker processes as before, and
// a scale-out and back that works. It returns the time from recovery to the scaled-out
// workers running.
func (oc *outageCluster) recovered(t *testing.T, name string, before map[string]procWorker, recovery time.Time) {
	t.Helper()
	now := procsOf(oc.job)
	stopped := 0
	for k, p := range before {
		if now[k].pid != p.pid {
			stopped++
			t.Errorf("%s: worker %s was %+v before, %+v after: it was stopped or moved", name, k, p, now[k])
		}
	}
	oc.scale(t, oc.workers+1)
	after := oc.waitWorkers(t, oc.workers+1)
	took := time.Since(recovery)
	oc.scale(t, oc.workers)
	oc.waitWorkers(t, oc.workers)
	for k, p := range before {
		if after[k].pid != p.pid {
			t.Errorf("%s: scaling out touched worker %s (%+v -> %+v)", name, k, p, after[k])
		}
	}
	t.Logf("figure: %s: workers stopped %d of %d; recovery to a scale-out running %s", name, stopped, len(before), took.Round(time.Millisecond))
}

// hold keeps an outage going for d (the outage's length is what is under test, not a wait
// for evidence), checking every half second on the way that the workers keep running. It is
// not scaled by testenv.Timeout: a longer outage under CI tests nothing more.
func (oc *outageCluster) hold(t *testing.T, name string, d time.Duration, before map[string]procWorker) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		now := workerProcs(oc.job)
		for k, p := range before {
			if len(now[k]) != 1 || now[k][0].pid != p.pid {
				t.Fatalf("%s: worker %s (%+v) changed during the outage, %s in: now %+v", name, k, p, d-time.Until(end), now[k])
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// unavailable checks that a master that cannot reach the store says so at once.
func (oc *outageCluster) unavailable(t *testing.T, name string) {
	t.Helper()
	cl := oc.h.AdminClient(oc.masters[0])
	testenv.EventuallyWith(t, name+": the API says the store is unavailable", 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		// Within the call's 3s: a master that hung would end in the deadline instead.
		_, err := cl.Jobs(ctx)
		return errors.Is(err, api.ErrUnavailable) && strings.HasPrefix(err.Error(), "store unavailable: "), fmt.Sprint(err)
	})
	// /metrics still answers the scrape token (its hash as last read: the figures of an
	// outage matter most), and still refuses a caller without it.
	if status, body := getMetrics(t, oc.masters[0], oc.h.MetricsToken()); status != http.StatusOK || !strings.Contains(body, "stormdock_master_store_connected") {
		t.Errorf("%s: /metrics with the scrape token: %d %.300s", name, status, body)
	}
	if status, body := getMetrics(t, oc.masters[0], ""); status != http.StatusUnauthorized || strings.Contains(body, oc.job) {
		t.Errorf("%s: anonymous /metrics: %d %.300s", name, status, body)
	}
}

func TestOutagesOnEnsemble(t *testing.T) {
	h := newEnsembleHarness(t, 3, 2*time.Second)
	oc := startOutageCluster(t, h, 6)
	servers := h.Ens.Servers()
	serving := func(what string) time.Time {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(60*time.Second))
		defer cancel()
		if err := h.Ens.WaitServing(ctx); err != nil {
			t.Fatalf("%s: the ensemble does not serve again: %v", what, err)
		}
		return time.Now()
	}

	t.Run("1-leader-killed", func(t *testing.T) {
		before := oc.waitWorkers(t, oc.workers)
		leader := h.Ens.Leader()
		leader.Kill()
		rec := serving("leader killed")
		leader.Restart()
		serving("leader restarted")
		oc.recovered(t, "leader server SIGKILLed", before, rec)
	})
	t.Run("2-quorum-lost-60s", func(t *testing.T) {
		before := oc.waitWorkers(t, oc.workers)
		down := servers[:2]
		if l := h.Ens.Leader(); l != nil && l != servers[0] && l != servers[1] {
			down = []*zktest.Server{servers[0], l}
		}
		for _, s := range down {
			s.Kill()
		}
		defer func() { // on failure too: the next cases need the ensemble
			for _, s := range down {
				if !s.Running() {
					s.Restart()
				}
			}
		}()
		oc.unavailable(t, "quorum lost")
		oc.hold(t, "two of three servers SIGKILLed", 60*time.Second, before)
		for _, s := range down {
			s.Restart()
		}
		rec := serving("quorum back")
		oc.recovered(t, "two of three servers SIGKILLed for 60s", before, rec)
	})
	t.Run("3-all-paused-30s", func(t *testing.T) {
		before := oc.waitWorkers(t, oc.workers)
		for _, s := range servers {
			s.Pause()
		}
		resumed := false
		defer func() {
			if !resumed {
				for _, s := range servers {
					s.Resume()
				}
			}
		}()
		oc.unavailable(t, "all paused")
		oc.hold(t, "every server SIGSTOPped", 30*time.Second, before)
		for _, s := range servers {
			s.Resume()
		}
		resumed = true
		rec := serving("resumed")
		oc.recovered(t, "every server SIGSTOPped for 30s", before, rec)
	})
	t.Run("5-agent-restarted-after-20s", func(t *testing.T) {
		before := oc.waitWorkers(t, oc.workers)
		var node string
		for _, p := range before {
			node = p.node
			break
		}
		p := h.Agent(node)
		p.Kill()
		oc.hold(t, "agent SIGKILLed", 20*time.Second, before)
		h.StartAgent(node, p.Args[6], p.Args[8], 4)
		cl := h.AdminClient(oc.masters[0])
		var rec time.Time
		testenv.Eventually(t, "the restarted agent healthy again", 30*time.Second, func() bool {
			ns, err := cl.Nodes(context.Background())
			for _, n := range ns {
				if n.ID == node && n.Health == cluster.HealthHealthy && err == nil {
					rec = time.Now()
					return true
				}
			}
			return false
		})
		oc.recovered(t, "an agent SIGKILLed and started again 20s later", before, rec)
	})
	t.Run("6-masters-gone-60s", func(t *testing.T) {
		before := oc.waitWorkers(t, oc.workers)
		ms := slices.Collect(maps.Values(h.Masters()))
		for _, m := range ms {
			m.Kill()
		}
		oc.hold(t, "every master SIGKILLed", 60*time.Second, before)
		oc.masters = []string{h.StartMaster("m1"), h.StartMaster("m2")}
		var rec time.Time
		testenv.Eventually(t, "a master leading again", 30*time.Second, func() bool {
			for _, url := range oc.masters {
				if hl, err := h.AdminClient(url).Health(context.Background()); err == nil && hl.Leader {
					rec = time.Now()
					return true
				}
			}
			return false
		})
		oc.recovered(t, "every master SIGKILLed for 60s (from a master leading again)", before, rec)
	})
	oc.watch.check(t)
}

func TestOutageSingleServerRestart(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	oc := startOutageCluster(t, h, 6)
	before := procsOf(oc.job)
	h.ZK.Stop()
	oc.unavailable(t, "server stopped")
	oc.hold(t, "the only server stopped", 60*time.Second, before)
	h.ZK.Restart()
	oc.recovered(t, "the only server stopped for 60s and restarted on its data (from the restart's return)", before, time.Now())
	oc.watch.check(t)
}

// The other side: a node cut off from a store that serves everyone else (its agent and its
// keeper SIGSTOPped) loses its workers to other nodes, and its own copies stop by themselves
// about when its session expires; an agent killed and never restarted hands its workers over
// once the restart grace is over, after its own copies stopped.
func TestNodeCutOffAndAgentGone(t *testing.T) {
	h := newHarness(t, time.Second)
	// A short re-registration window: the test cuts a node off soon after the masters start.
	h.StartMaster("m1", "--reregister-grace", "1s")
	url := h.StartMaster("m2", "--reregister-grace", "1s")
	h.StartAgent("n1", "dc-a", "r1", 4)
	h.StartAgent("n2", "dc-a", "r2", 4, "--restart-grace", "4s")
	h.StartAgent("n3", "dc-a", "r3", 4)
	h.StartAgent("n4", "dc-a", "r4", 4)
	cl := h.AdminClient(url)
	ctx := context.Background()
	testenv.Eventually(t, "4 nodes", 30*time.Second, func() bool { ns, err := cl.Nodes(ctx); return err == nil && len(ns) == 4 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", 8)); err != nil {
		t.Fatal(err)
	}
	oc := &outageCluster{h: h, job: "wc", workers: 8}
	oc.waitWorkers(t, 8)
	// A cut-off node's copy stops when its lease lapses, about when the master starts its
	// replacement; it may outlive that by the launcher's check and the worker's exit.
	watch := watchFence(t, "wc", 500*time.Millisecond)

	// n1 loses its work to the others and stops its own copies by itself.
	moveOff := func(name, node string, act func()) {
		t.Helper()
		before := procsOf("wc")
		var own []procWorker
		for _, p := range before {
			if p.node == node {
				own = append(own, p)
			}
		}
		if len(own) == 0 {
			t.Fatalf("%s: no worker on %s to move", name, node)
		}
		start := time.Now()
		act()
		var ownGone, replaced time.Duration
		testenv.EventuallyWith(t, name+": workers running elsewhere, own copies stopped", 60*time.Second, func() (bool, string) {
			gone := true
			for _, p := range own {
				if clustertest.Alive(p.pid) {
					gone = false
				}
			}
			if gone && ownGone == 0 {
				ownGone = time.Since(start)
			}
			now := procsOf("wc")
			elsewhere := 0
			for _, p := range now {
				if p.node != node {
					elsewhere++
				}
			}
			if elsewhere == 8 && replaced == 0 {
				replaced = time.Since(start)
			}
			return ownGone > 0 && replaced > 0, fmt.Sprintf("own copies gone %v, %d of 8 elsewhere", gone, elsewhere)
		})
		t.Logf("figure: %s: own copies stopped after %s, every worker running elsewhere after %s",
			name, ownGone.Round(time.Millisecond), replaced.Round(time.Millisecond))
	}
	moveOff("node cut off (agent and keeper SIGSTOPped, 1s session)", "n1", func() { h.SignalNode("n1", syscall.SIGSTOP) })
	h.SignalNode("n1", syscall.SIGCONT)
	// Back, n1 runs none of the moved workers, not even for a moment (the watch checks).
	testenv.Eventually(t, "n1 back", 30*time.Second, func() bool {
		n, ok := nodeView(ctx, cl, "n1")
		return ok && n.Health == cluster.HealthHealthy
	})

	agent := h.Agent("n2")
	moveOff("agent of n2 SIGKILLed for good (restart grace 4s)", "n2", func() { agent.Kill() })
	testenv.Eventually(t, "n2's keeper gone", 30*time.Second, func() bool { return h.KeeperPID("n2") == 0 })
	watch.check(t)
}
