package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Issue 14: stormdock across hosts. Each host is a network namespace of a lab (internal/netlab)
// with an address of its own; ZooKeeper, the masters and every node's agent run on hosts of
// their own, and partitions are cut inside a host's namespace. What must hold is checked from
// /proc and the cgroup tree, not through the project's API: who runs where, no worker twice
// beyond the fencing bound, a healed node never running a moved worker.

// labJobGrace is the jobs' gracePeriod in jobSpec.
const labJobGrace = 2 * time.Second

func plainLabSpec() labSpec {
	return labSpec{zkServers: 3, masters: []string{"m1", "m2"}, dcs: []string{"dc-a", "dc-b", "dc-c"}, perDC: 2,
		slots: 4, session: 2 * time.Second, reregisterGrace: 4 * time.Second}
}

func TestAcrossHostsPlainJob(t *testing.T) {
	lc := newLabCluster(t, plainLabSpec())
	const job, n = "wc", 12
	lc.submit(t, jobSpec(job, n))
	waitRunning(t, job, n, 60*time.Second)
	fence := watchFence(t, job, fencingBound(lc.Session, labJobGrace))

	t.Run("worker-host-cut", func(t *testing.T) {
		lc.cutAndMove(t, "a worker host cut", job, n, []string{busiestNode(job, "a")})
	})
	t.Run("dc-cut", func(t *testing.T) {
		lc.cutAndMove(t, "data center dc-b cut", job, n, []string{"b1", "b2"})
	})
	t.Run("master-host-cut", func(t *testing.T) {
		lc.cutLeadingMaster(t, job, n)
	})
	t.Run("zk-follower-host-cut", func(t *testing.T) {
		lc.cutZooKeeper(t, job, n, false)
	})
	t.Run("zk-leader-host-cut", func(t *testing.T) {
		lc.cutZooKeeper(t, job, n, true)
	})
	fence.check(t)
}

// busiestNode returns the node of a data center (by id prefix) that runs most of the job's
// workers.
func busiestNode(job, prefix string) string {
	count := map[string]int{}
	for _, p := range procsOf(job) {
		if strings.HasPrefix(p.node, prefix) {
			count[p.node]++
		}
	}
	best := ""
	for _, id := range sortedKeys(count) {
		if best == "" || count[id] > count[best] {
			best = id
		}
	}
	return best
}

// cutAndMove cuts the hosts of nodes (each still reaching the others of the list, as a data
// center cut off keeps its own network) and checks that their workers run elsewhere, that
// their own copies stop and that every other worker keeps its process. It then heals them and
// checks that none of them runs a moved worker again, not even for a moment: a scale-out puts
// new workers on the healed nodes (evidence that their agents act on their assignments
// again), and no moved worker's cgroup was made there since the cut.
func (lc *labCluster) cutAndMove(t *testing.T, name, job string, n int, nodes []string) {
	t.Helper()
	ctx := context.Background()
	before := procsOf(job)
	cut := map[string]bool{}
	var hosts []*netlab.Host
	for _, id := range nodes {
		cut[id] = true
		hosts = append(hosts, lc.node(id).host)
	}
	own := map[string]procWorker{}
	for k, p := range before {
		if cut[p.node] {
			own[k] = p
		}
	}
	if len(own) == 0 {
		t.Fatalf("%s: no worker on %v to move", name, nodes)
	}
	starts := map[string]*cgroupStarts{}
	for _, id := range nodes {
		starts[id] = watchStarts(t, lc.harness, id)
	}

	start := time.Now()
	for i, h := range hosts {
		if err := h.Cut(ctx, slices.Delete(slices.Clone(hosts), i, i+1)...); err != nil {
			t.Fatal(err)
		}
	}
	healed := false
	heal := func() {
		for _, h := range hosts {
			if err := h.Heal(ctx); err != nil {
				t.Error(err)
			}
		}
		healed = true
	}
	defer func() {
		if !healed {
			heal()
		}
	}()

	var ownGone, replaced time.Duration
	testenv.EventuallyWith(t, name+": every worker running outside the cut hosts, their own copies stopped", 90*time.Second, func() (bool, string) {
		gone := 0
		for _, p := range own {
			if !clustertest.Alive(p.pid) {
				gone++
			}
		}
		if gone == len(own) && ownGone == 0 {
			ownGone = time.Since(start)
		}
		outside := 0
		for _, ps := range workerProcs(job) {
			if slices.ContainsFunc(ps, func(p procWorker) bool { return !cut[p.node] }) {
				outside++
			}
		}
		if outside == n && replaced == 0 {
			replaced = time.Since(start)
		}
		return ownGone > 0 && replaced > 0, fmt.Sprintf("%d of %d own copies stopped, %d of %d workers running outside", gone, len(own), outside, n)
	})
	t.Logf("figure: %s (%d workers on it): own copies stopped after %s, replacements running after %s",
		name, len(own), ownGone.Round(time.Millisecond), replaced.Round(time.Millisecond))
	now := waitRunning(t, job, n, 30*time.Second, nodes...)
	for k, p := range before {
		if _, moved := own[k]; !moved && now[k].pid != p.pid {
			t.Errorf("%s: worker %s on %s, not on a cut host, was disturbed (%+v -> %+v)", name, k, p.node, p, now[k])
		}
	}

	healAt := time.Now()
	heal()
	defer lc.tryScale(job, n) // put the job back if this case fails below
	lc.waitHealthy(t, nodes...)
	// One new worker per data center: the emptiest racks are the healed nodes', so each gets
	// one, which shows that its agent acts on assignments again.
	more := n + len(lc.spec.dcs)
	lc.scale(t, job, more)
	testenv.EventuallyWith(t, name+": the healed nodes running new workers", 90*time.Second, func() (bool, string) {
		ps := procsOf(job)
		var missing []string
		for _, id := range nodes {
			if !slices.ContainsFunc(sortedKeys(ps), func(k string) bool { return ps[k].node == id }) {
				missing = append(missing, id)
			}
		}
		return len(ps) == more && len(missing) == 0, fmt.Sprintf("%d of %d running; none yet on %v", len(ps), more, missing)
	})
	t.Logf("figure: %s: healed to new workers running on the healed nodes: %s", name, time.Since(healAt).Round(time.Millisecond))
	for _, id := range nodes {
		for _, s := range starts[id].since(start) {
			for k := range own {
				if s.name == workerCgroup(id, job, k) {
					t.Errorf("%s: healed node %s started moved worker %s at %s (healed at %s)", name, id, k,
						s.at.Format("15:04:05.000"), healAt.Format("15:04:05.000"))
				}
			}
		}
	}
	for k, ps := range workerProcs(job) {
		if _, moved := own[k]; moved {
			for _, p := range ps {
				if cut[p.node] {
					t.Errorf("%s: moved worker %s runs on healed node %s: %+v", name, k, p.node, p)
				}
			}
		}
	}
	lc.scale(t, job, n)
	waitRunning(t, job, n, 60*time.Second)
}

// cutLeadingMaster cuts the host of the master that leads: the standby on another host leads,
// no worker is disturbed, and the job scales through it; healed, the old leader follows.
func (lc *labCluster) cutLeadingMaster(t *testing.T, job string, n int) {
	t.Helper()
	ctx := context.Background()
	var leader string
	testenv.EventuallyWith(t, "one master leading", 30*time.Second, func() (bool, string) {
		ls := lc.leaders()
		if len(ls) == 1 {
			leader = ls[0]
		}
		return len(ls) == 1, fmt.Sprint(ls)
	})
	standby := lc.spec.masters[0]
	if standby == leader {
		standby = lc.spec.masters[1]
	}
	before := procsOf(job)
	host := lc.masterHost(leader)
	start := time.Now()
	if err := host.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = host.Heal(ctx)
		}
	}()
	testenv.EventuallyWith(t, "the standby "+standby+" leading", 60*time.Second, func() (bool, string) {
		ls := lc.leaders()
		return slices.Contains(ls, standby), fmt.Sprint(ls)
	})
	t.Logf("figure: leading master's host cut (%s, session %s): standby %s leading after %s", leader, lc.Session, standby, time.Since(start).Round(time.Millisecond))
	// The standby takes requests and the workers obey it; nobody else was disturbed.
	defer lc.tryScale(job, n)
	lc.scale(t, job, n+1)
	after := waitRunning(t, job, n+1, 60*time.Second)
	for k, p := range before {
		if after[k].pid != p.pid {
			t.Errorf("master host cut: worker %s disturbed (%+v -> %+v)", k, p, after[k])
		}
	}
	lc.scale(t, job, n)
	waitRunning(t, job, n, 60*time.Second)

	if err := host.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	healed = true
	// Back, the old leader follows: exactly one master leads, the standby.
	testenv.EventuallyWith(t, "after the heal, one leader and the old one answering as a follower", 60*time.Second, func() (bool, string) {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		hl, err := lc.client(leader).Health(hctx)
		ls := lc.leaders()
		return err == nil && !hl.Leader && len(ls) == 1, fmt.Sprintf("leaders %v, old leader: %v", ls, err)
	})
}

// cutZooKeeper cuts the host of a ZooKeeper follower (or of the leader): the ensemble serves
// on, every node keeps or regains a live session, and every worker runs, once. How many
// workers changed process is a figure (goal 0), not an assertion: it depends on how fast
// clients find another server.
func (lc *labCluster) cutZooKeeper(t *testing.T, job string, n int, leader bool) {
	t.Helper()
	ctx := context.Background()
	ens := lc.Ens
	lead := ens.Leader()
	if lead == nil {
		t.Fatal("the ensemble has no leader")
	}
	victim := lead
	what := "ZooKeeper leader's host cut"
	if !leader {
		what = "ZooKeeper follower's host cut"
		for _, s := range ens.Servers() {
			if s != lead {
				victim = s
				break
			}
		}
	}
	host := victim.Host().(*netlab.Host)
	before := procsOf(job)
	sessions := lc.sessions()
	start := time.Now()
	if err := host.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = host.Heal(ctx)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, testenv.Timeout(60*time.Second))
	defer cancel()
	if leader {
		testenv.Eventually(t, "a new ZooKeeper leader", 60*time.Second, func() bool {
			l := ens.Leader()
			return l != nil && l != victim
		})
	}
	if err := ens.WaitServing(wctx); err != nil {
		t.Fatalf("%s: the ensemble does not serve: %v", what, err)
	}
	serving := time.Since(start)
	// Evidence that every node has been answered since any lease from before the cut would
	// have lapsed: a worker that was going to stop has stopped by then.
	lc.keepersAnsweredSince(t, start.Add(lc.Session), 60*time.Second)
	now := procsOf(job)
	changed := 0
	for k, p := range before {
		if now[k].pid != p.pid {
			changed++
		}
	}
	lost := 0
	for id, s := range lc.sessions() {
		if s != sessions[id] {
			lost++
		}
	}
	t.Logf("figure: %s (%s): ensemble serving after %s; workers changed %d of %d (goal 0); node sessions lost %d of %d",
		what, victim, serving.Round(time.Millisecond), changed, len(before), lost, len(lc.nodes))
	waitRunning(t, job, n, 60*time.Second)

	if err := host.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	healed = true
	testenv.EventuallyWith(t, "every server serving after the heal", 60*time.Second, func() (bool, string) {
		var states []string
		for _, s := range ens.Servers() {
			mctx, cancel := context.WithTimeout(ctx, time.Second)
			m, err := s.Mode(mctx)
			cancel()
			if err != nil {
				return false, fmt.Sprintf("%s: %v", s, err)
			}
			states = append(states, m)
		}
		return true, strings.Join(states, ",")
	})
	waitRunning(t, job, n, 60*time.Second)
}
