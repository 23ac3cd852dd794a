package master_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// tally is what the simulated agents of these tests run, as their hooks tell: which worker
// indexes run where, the most of a job's workers down at once, any index running twice, and
// every replacement.
type tally struct {
	mu       sync.Mutex
	running  map[cluster.WorkerKey]map[string]bool // worker -> nodes running it
	jobs     map[string]int                        // job -> its workers, for down counts
	maxDown  map[string]int
	twice    []string
	stops    map[string]map[cluster.WorkerKey]int // job -> workers stopped (replacements and removals), how often
	replaced []replacement
	// pull is how long a pre-pull takes; early lists workers stopped for an image their node
	// had not reported ready.
	pull  time.Duration
	ready map[string]map[string]bool // node -> images ready
	early []string
}

type replacement struct {
	key  cluster.WorkerKey
	node string
	at   time.Time
}

func newTally() *tally {
	return &tally{running: map[cluster.WorkerKey]map[string]bool{}, jobs: map[string]int{}, maxDown: map[string]int{}, stops: map[string]map[cluster.WorkerKey]int{},
		ready: map[string]map[string]bool{}}
}

// set records that node runs (or stopped running) k, and checks the invariants.
func (s *tally) set(k cluster.WorkerKey, node string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[k] == nil {
		s.running[k] = map[string]bool{}
	}
	if on {
		s.running[k][node] = true
		if len(s.running[k]) > 1 {
			s.twice = append(s.twice, fmt.Sprintf("%s on %v", k, slices.Sorted(maps.Keys(s.running[k]))))
		}
	} else {
		delete(s.running[k], node)
		if s.stops[k.Job] == nil {
			s.stops[k.Job] = map[cluster.WorkerKey]int{}
		}
		s.stops[k.Job][k]++
	}
	for job, n := range s.jobs {
		down := 0
		for i := range n {
			if len(s.running[cluster.WorkerKey{Job: job, Worker: i}]) == 0 {
				down++
			}
		}
		s.maxDown[job] = max(s.maxDown[job], down)
	}
}

// runningOf counts the workers of job running somewhere.
func (s *tally) runningOf(job string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, nodes := range s.running {
		if k.Job == job && len(nodes) > 0 {
			n++
		}
	}
	return n
}

// watchJob starts counting a job's down workers (once it runs whole).
func (s *tally) watchJob(job string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs[job], s.maxDown[job], s.stops[job] = n, 0, nil
	s.replaced = slices.DeleteFunc(s.replaced, func(r replacement) bool { return r.key.Job == job })
}

// simNode starts a simulated agent for n: it stops a worker (taking stop) before starting
// its replacement (taking start), pulls images ahead (taking s.pull), reports what it runs
// as an agent does, and a worker whose command contains "crash" crash-loops. s hears it.
func simNode(tc *clustertest.Sim, n cluster.Node, s *tally, stop, start time.Duration) *coord.Embedded {
	crash := func(_ string, w cluster.WorkerAssignment) *sim.Failure {
		if strings.Contains(strings.Join(w.Command, " "), "crash") {
			return &sim.Failure{Restarts: master.RolloutCrashRestarts, Exit: "exited with code 3"}
		}
		return nil
	}
	return tc.Agent(n, sim.Config{Behavior: sim.Behavior{Start: start, Stop: stop, Pull: s.pull, Fail: crash}, Hooks: s.hooks()})
}

// hooks are the simulated agents' hooks that keep the tally.
func (s *tally) hooks() sim.Hooks {
	return sim.Hooks{
		Running: func(node string, w cluster.WorkerAssignment) {
			s.set(w.Key, node, true)
			s.mu.Lock()
			s.replaced = append(s.replaced, replacement{key: w.Key, node: node, at: time.Now()})
			s.mu.Unlock()
		},
		Stopping: func(node string, w cluster.WorkerAssignment, next *cluster.WorkerAssignment) {
			if next == nil || next.Pinned == "" || next.Pinned == w.Pinned {
				return
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.ready[node][next.Pinned] {
				s.early = append(s.early, fmt.Sprintf("%s on %s stopped before %s was pulled there", w.Key, node, next.Pinned))
			}
		},
		Stopped: func(node string, k cluster.WorkerKey) { s.set(k, node, false) },
		Pulled: func(node, ref string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.ready[node] == nil {
				s.ready[node] = map[string]bool{}
			}
			s.ready[node][ref] = true
		},
	}
}

// rolloutCluster is 3 racks of 2 nodes with simulated agents, a master, an API client, a
// 12-worker job wc and a 3-worker job other, all running.
func rolloutCluster(t *testing.T, masters int) (*clustertest.Sim, *tally, []*master.Master, []*coord.Embedded, *api.Client) {
	tc := clustertest.NewSim(t)
	var ms []*master.Master
	var cs []*coord.Embedded
	for i := range masters {
		m, c, _ := tc.Master(fmt.Sprintf("m%d", i+1))
		ms, cs = append(ms, m), append(cs, c)
		if i == 0 {
			testenv.Eventually(t, "m1 leads", 5*time.Second, m.Leader)
		}
	}
	s := newTally()
	for _, n := range clustertest.Nodes(1, 3, 2) {
		simNode(tc, n, s, 40*time.Millisecond, 20*time.Millisecond)
	}
	testenv.Eventually(t, "the master sees 6 nodes", 5*time.Second, func() bool { return len(ms[0].MirrorView().Nodes()) == 6 })
	token := api.NewToken()
	if _, err := tc.Admin.Create(tc.Ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	cl := apiClient(tc, ms, token)
	if err := cl.CreateTenant(tc.Ctx, cluster.Tenant{Name: "search", MaxPriority: 10}); err != nil {
		t.Fatal(err)
	}
	for job, n := range map[string]int{"wc": 12, "other": 3} {
		if _, err := cl.SubmitJob(tc.Ctx, []byte(rolloutSpec(job, n, "sleep 1000", ""))); err != nil {
			t.Fatal(err)
		}
	}
	for job, n := range map[string]int{"wc": 12, "other": 3} {
		testenv.Eventually(t, job+" running", 10*time.Second, func() bool {
			st, err := cl.Job(tc.Ctx, job)
			return err == nil && st.Summary.Running == n && st.Summary.Stopping == 0
		})
		s.watchJob(job, n)
	}
	return tc, s, ms, cs, cl
}

// apiClient serves the API of every master through one URL that goes to the first one alive.
func apiClient(tc *clustertest.Sim, ms []*master.Master, token string) *api.Client {
	h := httpapi.New(ms[len(ms)-1], httpapi.Config{}) // any master serves the API
	srv := newTestServer(tc.T, h)
	cl, err := api.NewClient(srv, token)
	if err != nil {
		tc.T.Fatal(err)
	}
	return cl
}

func rolloutSpec(name string, workers int, command, update string) string {
	spec := fmt.Sprintf("name: %s\ntenant: search\nworkers: %d\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [%s]\nplacement: {spread: [dc, rack]}\n",
		name, workers, strings.Join(strings.Fields(command), ", "))
	if update != "" {
		spec += "update: " + update + "\n"
	}
	return spec
}

func waitRollout(t *testing.T, cl *api.Client, job string, states ...string) cluster.Rollout {
	t.Helper()
	var ro cluster.Rollout
	testenv.EventuallyWith(t, fmt.Sprintf("rollout of %s %v", job, states), 20*time.Second, func() (bool, string) {
		st, err := cl.Job(context.Background(), job)
		if err != nil || st.Job.Rollout == nil {
			return false, fmt.Sprint(err)
		}
		ro = *st.Job.Rollout
		return slices.Contains(states, ro.State), ro.Summary()
	})
	return ro
}

// An update by rack replaces rack after rack, never more than maxParallel of the job's
// workers down and never a worker twice, and leaves the other job alone.
func TestRolloutByRack(t *testing.T) {
	tc, s, _, _, cl := rolloutCluster(t, 1)
	spec := rolloutSpec("wc", 12, "sleep 2000", "{by: rack, maxParallel: 2, minHealthy: 150ms}")
	up, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{})
	if err != nil || !up.Changed || up.Job.Generation != 2 || up.Job.Rollout.To != 2 {
		t.Fatalf("update: %+v, %v", up, err)
	}
	ro := waitRollout(t, cl, "wc", cluster.RolloutDone)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxDown["wc"] > 2 || s.maxDown["wc"] == 0 {
		t.Errorf("at most %d of wc's workers down at once, want 1-2 (maxParallel 2)", s.maxDown["wc"])
	}
	if len(s.twice) > 0 {
		t.Errorf("workers ran twice: %v", s.twice)
	}
	if len(s.stops["other"]) != 0 {
		t.Errorf("job other had workers stopped: %v", s.stops["other"])
	}
	// Racks one after the other: every replacement of a rack is done before the next
	// rack's first.
	rackOf := func(node string) string { return node[:len(node)-2] } // n-0-R-i
	var order []string
	last := map[string]time.Time{}
	first := map[string]time.Time{}
	for _, r := range s.replaced {
		if r.key.Job != "wc" {
			continue
		}
		rk := rackOf(r.node)
		if len(order) == 0 || order[len(order)-1] != rk {
			order = append(order, rk)
		}
		if _, ok := first[rk]; !ok {
			first[rk] = r.at
		}
		last[rk] = r.at
	}
	if len(order) != 3 {
		t.Fatalf("racks replaced in order %v, want each once", order)
	}
	for i := 1; i < len(order); i++ {
		if !last[order[i-1]].Before(first[order[i]]) {
			t.Errorf("rack %s began before rack %s ended", order[i], order[i-1])
		}
	}
	if ro.Batch != 3 || ro.Healthy != 12 {
		t.Errorf("rollout done as %s", ro.Summary())
	}
	st, err := cl.Job(tc.Ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range st.Workers {
		if w.Generation != 2 || w.State != cluster.WorkerRunning {
			t.Errorf("worker %d: generation %d %s, want 2 running", w.Worker, w.Generation, w.State)
		}
	}
}

// A change that no worker runs differently (the priority) makes a generation that every
// worker takes live: the rollout is done with nothing stopped.
func TestRolloutUnchangedWorkersStay(t *testing.T) {
	tc, s, _, _, cl := rolloutCluster(t, 1)
	spec := rolloutSpec("wc", 12, "sleep 1000", "") + "priority: 5\n"
	if _, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	testenv.Eventually(t, "every worker on generation 2", 5*time.Second, func() bool {
		st, err := cl.Job(tc.Ctx, "wc")
		if err != nil {
			return false
		}
		for _, w := range st.Workers {
			if w.Generation != 2 {
				return false
			}
		}
		return true
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stops["wc"]) != 0 {
		t.Errorf("workers stopped by a change none of them runs: %v", s.stops["wc"])
	}
	// The same spec again changes nothing.
	up, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{})
	if err != nil || up.Changed || up.Job.Generation != 2 {
		t.Errorf("same spec again: changed %v generation %d, %v", up.Changed, up.Job.Generation, err)
	}
}

// A crash-looping canary fails the update, and autoRevert brings every worker back to the
// generation before.
func TestRolloutCanaryCrashReverts(t *testing.T) {
	tc, s, _, _, cl := rolloutCluster(t, 1)
	spec := rolloutSpec("wc", 12, "crash now", "{canary: 1, autoRevert: true, minHealthy: 100ms}")
	if _, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	ro := waitRollout(t, cl, "wc", cluster.RolloutReverted)
	if ro.Kind != cluster.RolloutRevert || ro.To != 1 || !strings.Contains(ro.Reason, "crash-looping on generation 2") {
		t.Errorf("revert: %s", ro.Summary())
	}
	st, err := cl.Job(tc.Ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	if st.Job.Generation != 1 || strings.Join(st.Job.Spec.Command, " ") != "sleep 1000" {
		t.Errorf("job after revert: generation %d command %v", st.Job.Generation, st.Job.Spec.Command)
	}
	testenv.Eventually(t, "every worker running generation 1", 5*time.Second, func() bool {
		st, err := cl.Job(tc.Ctx, "wc")
		if err != nil || st.Summary.Running != 12 {
			return false
		}
		for _, w := range st.Workers {
			if w.Generation != 1 {
				return false
			}
		}
		return true
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.stops["wc"]) != 1 {
		t.Errorf("workers of wc stopped: %v, want the canary alone", s.stops["wc"])
	}
}

// Pause stops a rollout between replacements, resume continues it, canaries wait for
// promote, rollback goes back with a new generation, and history shows each.
func TestRolloutOperatorActions(t *testing.T) {
	tc, _, _, _, cl := rolloutCluster(t, 1)
	ctx := tc.Ctx
	if _, err := cl.RolloutAction(ctx, "wc", desired.ActionPause); err == nil || !strings.Contains(err.Error(), "no rollout in progress") {
		t.Fatalf("pause without a rollout: %v", err)
	}
	spec := rolloutSpec("wc", 12, "sleep 2000", "{canary: 2, maxParallel: 3, minHealthy: 100ms}")
	if _, err := cl.UpdateJob(ctx, "wc", []byte(spec), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	ro := waitRollout(t, cl, "wc", cluster.RolloutCanary)
	if len(ro.Canaries) != 2 || ro.Healthy != 2 {
		t.Errorf("awaiting promotion: %s", ro.Summary())
	}
	if _, err := cl.RolloutAction(ctx, "wc", desired.ActionPause); err != nil {
		t.Fatal(err)
	}
	// Promoted while paused: still paused.
	if rec, err := cl.RolloutAction(ctx, "wc", desired.ActionPromote); err != nil || rec.Rollout.State != cluster.RolloutPaused || !rec.Rollout.Promoted {
		t.Fatalf("promoted while paused: %s, %v", rec.Rollout.Summary(), err)
	}
	if _, err := cl.RolloutAction(ctx, "wc", desired.ActionResume); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	if _, err := cl.RolloutAction(ctx, "wc", desired.ActionPromote); err == nil {
		t.Fatal("promote of a finished rollout accepted")
	}

	// Back to generation 1's spec, as generation 3.
	back, err := cl.RollbackJob(ctx, "wc", 0, api.PolicyOverrides{MaxParallel: ptr(4)})
	if err != nil || back.Job.Generation != 3 || strings.Join(back.Job.Spec.Command, " ") != "sleep 1000" ||
		back.Job.Rollout.Kind != cluster.RolloutRollback || back.Job.Rollout.Policy.MaxParallel != 4 {
		t.Fatalf("rollback: %+v, %v", back, err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	if _, err := cl.RollbackJob(ctx, "wc", 9, api.PolicyOverrides{}); err == nil || !strings.Contains(err.Error(), "no generation 9") {
		t.Fatalf("rollback to an unknown generation: %v", err)
	}
	h, err := cl.JobHistory(ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	if h.Current != 3 || len(h.Generations) != 3 {
		t.Fatalf("history: %+v", h)
	}
	g2 := h.Generations[1]
	if g2.Kind != "update" || g2.Who != "admin" || !slices.ContainsFunc(g2.Changes, func(c api.SpecChange) bool {
		return c.Field == "command[1]" && c.From == "1000" && c.To == "2000"
	}) || !slices.ContainsFunc(g2.Changes, func(c api.SpecChange) bool { return c.Field == "update.canary" && c.From == "" && c.To == "2" }) {
		t.Errorf("generation 2 in history: %+v", g2)
	}
	if g3 := h.Generations[2]; g3.Kind != "rollback" || !slices.ContainsFunc(g3.Changes, func(c api.SpecChange) bool { return c.Field == "command[1]" && c.To == "1000" }) {
		t.Errorf("generation 3 in history: %+v", g3)
	}

	// A rolling restart of one worker replaces it alone, in place.
	before, _ := cl.Job(ctx, "wc")
	rec, err := cl.RestartJob(ctx, "wc", api.RestartRequest{Workers: []int{5}})
	if err != nil || rec.Rollout.Kind != cluster.RolloutRestart || rec.Generation != 3 {
		t.Fatalf("restart: %+v, %v", rec.Rollout, err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	after, _ := cl.Job(ctx, "wc")
	if before.Workers[5].Node != after.Workers[5].Node {
		t.Errorf("restarted worker moved: %s -> %s", before.Workers[5].Node, after.Workers[5].Node)
	}
	if _, err := cl.RestartJob(ctx, "wc", api.RestartRequest{Workers: []int{12}}); err == nil || !strings.Contains(err.Error(), "has workers 0 to 11") {
		t.Fatalf("restart of worker 12: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// A leader that dies in the middle of a rollout leaves it to the standby, which finishes it
// within the same limits.
func TestRolloutContinuesOnNewLeader(t *testing.T) {
	tc, s, ms, cs, cl := rolloutCluster(t, 2)
	spec := rolloutSpec("wc", 12, "sleep 2000", "{maxParallel: 2, minHealthy: 200ms}")
	if _, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a few workers replaced", 10*time.Second, func() bool {
		st, err := cl.Job(tc.Ctx, "wc")
		return err == nil && st.Job.Rollout.Healthy >= 3
	})
	if ms[1].Leader() {
		t.Fatal("m2 leads already")
	}
	cs[0].Crash()
	testenv.Eventually(t, "m2 leads", 5*time.Second, ms[1].Leader)
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxDown["wc"] > 2 || len(s.twice) > 0 {
		t.Errorf("across the failover: at most %d down (maxParallel 2), twice: %v", s.maxDown["wc"], s.twice)
	}
}

func newTestServer(t testing.TB, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A rollout to a new image has it pulled ahead on every node of the workers it replaces,
// and stops no worker before its node reports the image ready.
func TestRolloutPrepullsBeforeStop(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	testenv.Eventually(t, "m1 leads", 5*time.Second, m.Leader)
	s := newTally()
	s.pull = 300 * time.Millisecond
	nodes := clustertest.Nodes(1, 2, 2)
	for i := range nodes {
		nodes[i].Labels = map[string]string{"isolation/docker": "true"}
		simNode(tc, nodes[i], s, 20*time.Millisecond, 10*time.Millisecond)
	}
	testenv.Eventually(t, "the master sees 4 nodes", 5*time.Second, func() bool { return len(m.MirrorView().Nodes()) == 4 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	spec := clustertest.Spec("wc", 6)
	spec.Isolation, spec.Command, spec.Image = cluster.IsolationDocker, []string{"/w"}, "127.0.0.1:5000/w:1"
	spec.Update = cluster.UpdatePolicy{MaxParallel: 2, MinHealthy: cluster.Duration(50 * time.Millisecond)}
	pin := &cluster.ImagePin{Generation: 1, Image: spec.Image, Ref: "127.0.0.1:5000/w@sha256:1", Digest: "sha256:1"}
	if _, err := desired.SubmitJobPinned(tc.Ctx, tc.Admin, spec, pin); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "6 workers running", 5*time.Second, func() bool { return s.runningOf("wc") == 6 })
	s.watchJob("wc", 6)
	next := *spec
	next.Image = "127.0.0.1:5000/w:2"
	pin2 := &cluster.ImagePin{Image: next.Image, Ref: "127.0.0.1:5000/w@sha256:2", Digest: "sha256:2"}
	rec, changed, err := desired.UpdateJob(tc.Ctx, tc.Admin, "wc", desired.Change{Spec: &next, Pin: pin2, Who: "test"})
	if err != nil || !changed || rec.Image.Generation != 2 {
		t.Fatalf("update: %+v, %v, %v", rec.Image, changed, err)
	}
	testenv.Eventually(t, "the rollout done", 15*time.Second, func() bool {
		j, ok := m.MirrorView().Jobs()["wc"]
		return ok && j.Record().Rollout != nil && j.Record().Rollout.State == cluster.RolloutDone
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.early {
		t.Error(e)
	}
	pulled := 0
	for _, imgs := range s.ready {
		if imgs[pin2.Ref] {
			pulled++
		}
	}
	if pulled == 0 || s.maxDown["wc"] > 2 {
		t.Errorf("image pulled on %d nodes, at most %d workers down", pulled, s.maxDown["wc"])
	}
	// Done: nothing is pulled ahead any more.
	testenv.Eventually(t, "the pre-pull lists emptied", 5*time.Second, func() bool {
		names, _ := tc.Admin.Children(tc.Ctx, cluster.AssignmentsKey)
		for _, n := range names {
			e, err := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+n)
			var a cluster.NodeAssignment
			if err != nil || json.Unmarshal(e.Value, &a) != nil || len(a.Prepull) > 0 {
				return false
			}
		}
		return true
	})
}

// A change of a key listed in liveEnv, and a scale, reach the workers live: no worker is
// stopped, and their assignments carry the new value and the worker count's epoch.
func TestLiveEnvAndScaleAreLive(t *testing.T) {
	tc, s, _, _, cl := rolloutCluster(t, 1)
	spec := rolloutSpec("wc", 12, "sleep 1000", "{maxParallel: 4, minHealthy: 50ms}") + "env: {LEVEL: info, MODE: a}\nliveEnv: [LEVEL]\n"
	if _, err := cl.UpdateJob(tc.Ctx, "wc", []byte(spec), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone) // env MODE is new: every worker replaced
	s.watchJob("wc", 12)
	if _, err := cl.UpdateJob(tc.Ctx, "wc", []byte(strings.Replace(spec, "LEVEL: info", "LEVEL: debug", 1)), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, cl, "wc", cluster.RolloutDone)
	if _, err := cl.ScaleJob(tc.Ctx, "wc", 10); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "assignments with LEVEL=debug and epoch 2", 5*time.Second, func() (bool, string) {
		names, _ := tc.Admin.Children(tc.Ctx, cluster.AssignmentsKey)
		n := 0
		for _, node := range names {
			e, _ := tc.Admin.Get(tc.Ctx, cluster.AssignmentsKey+"/"+node)
			var a cluster.NodeAssignment
			_ = json.Unmarshal(e.Value, &a)
			for _, w := range a.Workers {
				if w.Key.Job != "wc" {
					continue
				}
				if w.LiveEnv["LEVEL"] != "debug" || w.Env["MODE"] != "a" || w.Env["LEVEL"] != "" || w.Epoch != 2 || w.Workers != 10 || w.Generation != 3 {
					return false, fmt.Sprintf("%s: %+v", w.Key, w)
				}
				n++
			}
		}
		return n == 10, fmt.Sprintf("%d workers", n)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.stops["wc"] {
		if k.Worker < 10 {
			t.Errorf("worker %s stopped by a live change", k)
		}
	}
}
