package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// rolloutWatch samples a job's worker processes from /proc (not the API) while a rollout
// runs: the most of its workers without a process at once, any index running as two
// processes, and when and where each index first ran as a new process.
type rolloutWatch struct {
	job     string
	workers int
	initial map[string]int // index -> pid before the rollout

	mu       sync.Mutex
	samples  int
	maxDown  int
	twice    []string
	replaced map[string]procWorker // index -> its first new process
	at       map[string]time.Time  // ... and when it was first seen
	stop     chan struct{}
	done     chan struct{}
}

func watchRollout(t testing.TB, job string, workers int) *rolloutWatch {
	w := &rolloutWatch{job: job, workers: workers, initial: map[string]int{}, replaced: map[string]procWorker{},
		at: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	for k, p := range procsOf(job) {
		w.initial[k] = p.pid
	}
	if len(w.initial) != workers {
		t.Fatalf("%s: %d worker processes before the rollout, want %d", job, len(w.initial), workers)
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			procs := workerProcs(job)
			now := time.Now()
			w.mu.Lock()
			w.samples++
			down := 0
			for i := range workers {
				k := fmt.Sprint(i)
				ps := procs[k]
				switch {
				case len(ps) == 0:
					down++
				case len(ps) > 1:
					w.twice = append(w.twice, fmt.Sprintf("%s: worker %s as %v", now.Format("15:04:05.000"), k, ps))
				case ps[0].pid != w.initial[k]:
					if _, ok := w.replaced[k]; !ok {
						w.replaced[k], w.at[k] = ps[0], now
					}
				}
			}
			w.maxDown = max(w.maxDown, down)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *rolloutWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// check ends the watch and fails the test when more than maxParallel workers were down at
// once, or an index ran twice.
func (w *rolloutWatch) check(t testing.TB, maxParallel int) {
	t.Helper()
	w.end()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.samples < 10 {
		t.Errorf("only %d samples of %s's processes", w.samples, w.job)
	}
	if w.maxDown > maxParallel {
		t.Errorf("%s: %d workers without a process at once, maxParallel %d", w.job, w.maxDown, maxParallel)
	}
	for _, s := range w.twice {
		t.Error("ran twice: " + s)
	}
}

// rackOrder checks from the processes that the racks were replaced one after another: the
// last replacement of a rack came before the first of the next.
func (w *rolloutWatch) rackOrder(t testing.TB, rackOf func(node string) string) []string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	first, last := map[string]time.Time{}, map[string]time.Time{}
	for k, p := range w.replaced {
		r := rackOf(p.node)
		if at := w.at[k]; first[r].IsZero() || at.Before(first[r]) {
			first[r] = at
		}
		if at := w.at[k]; at.After(last[r]) {
			last[r] = at
		}
	}
	racks := slices.SortedFunc(maps.Keys(first), func(a, b string) int { return first[a].Compare(first[b]) })
	for i := 1; i < len(racks); i++ {
		if !last[racks[i-1]].Before(first[racks[i]]) {
			t.Errorf("rack %s's first replacement (%s) came before rack %s's last (%s)", racks[i],
				first[racks[i]].Format("15:04:05.000"), racks[i-1], last[racks[i-1]].Format("15:04:05.000"))
		}
	}
	return racks
}

// rolloutCluster starts masters m1 (leading) and m2, and agents on nodes named dc-rack-n, and
// returns the admin client of m1 and m2.
func rolloutCluster(t testing.TB, dcs, racks, perRack, slots int) (*harness, *api.Client, *api.Client, func(string) string) {
	h := newHarness(t, 2*time.Second)
	cl := h.AdminClient(h.StartMaster("m1"))
	ctx := context.Background()
	testenv.Eventually(t, "m1 leads", 15*time.Second, func() bool { hl, err := cl.Health(ctx); return err == nil && hl.Leader })
	cl2 := h.AdminClient(h.StartMaster("m2"))
	n := 0
	for d := range dcs {
		for r := range racks {
			for i := range perRack {
				h.StartAgent(fmt.Sprintf("d%d-r%d-n%d", d, r, i), fmt.Sprintf("dc-%d", d), fmt.Sprintf("r%d", r), slots)
				n++
			}
		}
	}
	testenv.Eventually(t, fmt.Sprintf("%d nodes registered", n), 30*time.Second, func() bool { return len(h.NodeRecords()) == n })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	rackOf := func(node string) string { return node[:strings.LastIndexByte(node, '-')] }
	return h, cl, cl2, rackOf
}

// rolloutJob is a wordcount job of n workers; extra is added to the spec.
func rolloutJob(name string, n int, rate, extra string) []byte {
	return []byte(fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --rate, '%s']
placement: {spread: [dc, rack]}
gracePeriod: 2s
%s`, name, n, rate, extra))
}

func submitRunning(t testing.TB, cl *api.Client, spec []byte, name string, n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := cl.SubmitJob(ctx, spec); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, fmt.Sprintf("%d workers of %s running", n, name), time.Minute, func() bool { return len(procsOf(name)) == n })
}

// waitRolloutState waits until the job's rollout is in one of states, reading the API of
// whichever client answers.
func waitRolloutState(t testing.TB, timeout time.Duration, name string, states []string, cls ...*api.Client) cluster.Rollout {
	t.Helper()
	var ro cluster.Rollout
	testenv.EventuallyWith(t, fmt.Sprintf("rollout of %s %v", name, states), timeout, func() (bool, string) {
		for _, cl := range cls {
			st, err := cl.Job(context.Background(), name)
			if err != nil || st.Job.Rollout == nil {
				continue
			}
			ro = *st.Job.Rollout
			return slices.Contains(states, ro.State), ro.Summary()
		}
		return false, "no master answers"
	})
	return ro
}

// TestRolloutByRack: an update by rack replaces rack after rack, with at most maxParallel of
// the job's workers down at any moment and no index ever running twice (both sampled from
// the processes), and leaves another job's workers alone. The leading master is SIGKILLed
// mid-rollout: the standby finishes it within the same limits.
func TestRolloutByRack(t *testing.T) {
	h, cl, cl2, rackOf := rolloutCluster(t, 1, 3, 2, 4)
	ctx := context.Background()
	submitRunning(t, cl, rolloutJob("wc", 12, "1", ""), "wc", 12)
	submitRunning(t, cl, rolloutJob("other", 3, "1", ""), "other", 3)
	others := procsOf("other")

	watch := watchRollout(t, "wc", 12)
	up, err := cl.UpdateJob(ctx, "wc", rolloutJob("wc", 12, "2", "update: {by: rack, maxParallel: 2, minHealthy: 1s}\n"), api.PolicyOverrides{})
	if err != nil || !up.Changed {
		t.Fatalf("update: %+v, %v", up, err)
	}
	t0 := time.Now()
	testenv.Eventually(t, "the first rack replaced", time.Minute, func() bool {
		watch.mu.Lock()
		defer watch.mu.Unlock()
		return len(watch.replaced) >= 4
	})
	h.Master("m1").Kill()
	testenv.Eventually(t, "m2 leads", 15*time.Second, func() bool { hl, err := cl2.Health(ctx); return err == nil && hl.Leader })
	ro := waitRolloutState(t, 2*time.Minute, "wc", []string{cluster.RolloutDone, cluster.RolloutFailed}, cl2)
	t.Logf("figure: 12-worker update by rack (3 racks, maxParallel 2, minHealthy 1s) with the leader SIGKILLed mid-way: done in %s", time.Since(t0).Round(100*time.Millisecond))
	if ro.State != cluster.RolloutDone {
		t.Fatalf("rollout: %s", ro.Summary())
	}
	watch.check(t, 2)
	racks := watch.rackOrder(t, rackOf)
	if len(racks) != 3 || len(watch.replaced) != 12 {
		t.Errorf("replaced %d workers over racks %v, want 12 over 3", len(watch.replaced), racks)
	}
	t.Logf("figure: most wc workers down at once %d (maxParallel 2), racks in order %v", watch.maxDown, racks)
	// Every worker runs the new command; the other job's processes are the ones it had.
	for k, p := range procsOf("wc") {
		if !strings.Contains(p.cmd, "--rate 2") {
			t.Errorf("worker %s runs %q, want --rate 2", k, p.cmd)
		}
	}
	if now := procsOf("other"); !maps.EqualFunc(others, now, func(a, b procWorker) bool { return a.pid == b.pid }) {
		t.Errorf("job other's workers changed: %v -> %v", others, now)
	}
	st, err := cl2.Job(ctx, "wc")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range st.Workers {
		if w.Generation != 2 {
			t.Errorf("worker %d on generation %d, want 2", w.Worker, w.Generation)
		}
	}
}

// TestRolloutCanaryCrashLoopReverts: a canary that crash-loops fails the update, and
// autoRevert brings every worker back to the old generation; the workers never replaced
// keep their processes.
func TestRolloutCanaryCrashLoopReverts(t *testing.T) {
	_, cl, _, _ := rolloutCluster(t, 1, 2, 2, 4)
	ctx := context.Background()
	submitRunning(t, cl, rolloutJob("wc", 6, "1", ""), "wc", 6)
	before := procsOf("wc")
	watch := watchRollout(t, "wc", 6)
	bad := strings.Replace(string(rolloutJob("wc", 6, "1", "update: {canary: 1, autoRevert: true, minHealthy: 1s}\n")),
		"--rate, '1']", "--rate, '1', --input, /nonexistent/input]", 1)
	t0 := time.Now()
	if _, err := cl.UpdateJob(ctx, "wc", []byte(bad), api.PolicyOverrides{}); err != nil {
		t.Fatal(err)
	}
	ro := waitRolloutState(t, 2*time.Minute, "wc", []string{cluster.RolloutReverted}, cl)
	if !strings.Contains(ro.Reason, "crash-looping on generation 2") {
		t.Errorf("reverted for %q, want the canary's crash loop", ro.Reason)
	}
	testenv.Eventually(t, "6 workers running generation 1", time.Minute, func() bool {
		st, err := cl.Job(ctx, "wc")
		if err != nil || st.Summary.Running != 6 || st.Job.Generation != 1 {
			return false
		}
		for _, w := range st.Workers {
			if w.Generation != 1 {
				return false
			}
		}
		return len(procsOf("wc")) == 6
	})
	t.Logf("figure: crash-looping canary (6 workers) to every worker back on the old generation: %s", time.Since(t0).Round(100*time.Millisecond))
	watch.check(t, 1)
	changed := 0
	for k, p := range procsOf("wc") {
		if strings.Contains(p.cmd, "nonexistent") {
			t.Errorf("worker %s still runs the failed generation: %s", k, p.cmd)
		}
		if p.pid != before[k].pid {
			changed++
		}
	}
	if changed != 1 {
		t.Errorf("%d workers have new processes, want the canary alone", changed)
	}
}

// TestRolloutOperatorCommands drives a rollout through the CLI: canaries held until promote,
// pause, resume, history with the spec's diff, rollback and a rolling restart of one worker.
func TestRolloutOperatorCommands(t *testing.T) {
	h, cl, _, _ := rolloutCluster(t, 1, 2, 2, 4)
	ctx := context.Background()
	submitRunning(t, cl, rolloutJob("wc", 6, "1", ""), "wc", 6)
	tok, err := os.ReadFile(filepath.Join(h.Dir, "data", api.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	master := ""
	for _, p := range h.Masters() {
		if p.Name == "master-m1" {
			master = "http://" + p.Args[slices.Index(p.Args, "--api")+1]
		}
	}
	c := &cli{t: t, env: []string{"STORMDOCK_MASTER=" + master, "STORMDOCK_TOKEN=" + strings.TrimSpace(string(tok))}}
	dir := t.TempDir()
	spec := filepath.Join(dir, "wc.yaml")
	if err := os.WriteFile(spec, rolloutJob("wc", 6, "2", "env: {MODE: fast}\nupdate: {canary: 2, maxParallel: 2, minHealthy: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.refused("canary: must be at most the job's 6 workers", "job", "update", spec, "--canary", "7")
	out := c.ok("job", "update", spec, "--wait")
	if !strings.Contains(out, "generation 2 (from 1)") || !strings.Contains(out, "awaiting-promotion") || !strings.Contains(out, "stormdock job promote wc") {
		t.Fatalf("update --wait: %s", out)
	}
	if out := c.ok("job", "list"); !strings.Contains(out, "awaiting-promotion") {
		t.Errorf("job list shows no rollout: %s", out)
	}
	if out := c.ok("job", "status", "wc"); !strings.Contains(out, "rollout 1 (update 1 -> 2): awaiting-promotion") || !strings.Contains(out, "GEN") {
		t.Errorf("job status: %s", out)
	}
	gens := map[int64]int{}
	for _, w := range c.status("wc").Workers {
		gens[w.Generation]++
	}
	if gens[2] != 2 || gens[1] != 4 {
		t.Errorf("workers by generation %v, want 2 canaries on 2 and 4 on 1", gens)
	}
	c.ok("job", "pause", "wc")
	if out := c.ok("job", "promote", "wc"); !strings.Contains(out, "paused") {
		t.Errorf("promote of a paused rollout: %s", out)
	}
	if out := c.ok("job", "resume", "wc", "--wait"); !strings.Contains(out, "every worker on generation 2") {
		t.Fatalf("resume --wait: %s", out)
	}
	c.refused("no rollout in progress", "job", "pause", "wc")
	out = c.ok("job", "history", "wc")
	for _, want := range []string{"submitted", `command[4]: "1" -> "2"`, `env.MODE: (none) -> "fast"`, "admin"} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
	if out := c.ok("job", "rollback", "wc", "--wait"); !strings.Contains(out, "generation 3 (from 2)") || !strings.Contains(out, "every worker on generation 3") {
		t.Fatalf("rollback --wait: %s", out)
	}
	for k, p := range procsOf("wc") {
		if !strings.Contains(p.cmd, "--rate 1") {
			t.Errorf("after rollback worker %s runs %q", k, p.cmd)
		}
	}
	c.refused("no generation 9", "job", "rollback", "wc", "--to", "9")
	before := procsOf("wc")
	if out := c.ok("job", "restart", "wc", "--worker", "3", "--wait"); !strings.Contains(out, "rolling restart") {
		t.Fatalf("restart: %s", out)
	}
	after := procsOf("wc")
	for k, p := range after {
		if restarted := p.pid != before[k].pid; restarted != (k == "3") {
			t.Errorf("worker %s: pid %d -> %d after restarting worker 3", k, before[k].pid, p.pid)
		}
	}
	if after["3"].node != before["3"].node {
		t.Errorf("worker 3 restarted on %s, was on %s", after["3"].node, before["3"].node)
	}
	if st, err := cl.Job(ctx, "wc"); err != nil || st.Job.Generation != 3 {
		t.Errorf("restart changed the generation: %v, %v", st.Job.Generation, err)
	}
}

// TestScaleWordcountExactlyOnce: a running word count over a file of 50,000 lines is scaled
// from 4 to 8 to 3 workers mid-stream; its output holds every offset exactly once.
func TestScaleWordcountExactlyOnce(t *testing.T) {
	const lines = 50000
	h, cl, _, _ := rolloutCluster(t, 1, 2, 2, 4)
	ctx := context.Background()
	// Workers run as nobody: the directory is theirs to write (the output and its ledger).
	dir := filepath.Join(h.Dir, "stream")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	in, out := filepath.Join(dir, "input.txt"), filepath.Join(dir, "out.jsonl")
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, "line %d: the storm %s\n", i, strings.Repeat("dock ", i%5))
	}
	if err := os.WriteFile(in, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(`name: wc
tenant: e2e
workers: 4
resources: {memory: 64Mi, cpu: 0.2}
command: [stormdock, worker, wordcount, --input, %s, --output, %s, --rate, '700']
placement: {spread: [dc, rack]}
gracePeriod: 5s
`, in, out)
	submitRunning(t, cl, []byte(spec), "wc", 4)
	counted := func() (map[int64]int, int) {
		seen := map[int64]int{}
		b, _ := os.ReadFile(out)
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			var off int64
			if _, err := fmt.Sscanf(line, `{"offset":%d,`, &off); err == nil {
				seen[off]++
				n++
			}
		}
		return seen, n
	}
	progress := func(what string, want int) {
		testenv.EventuallyWith(t, what, 2*time.Minute, func() (bool, string) {
			_, n := counted()
			return n >= want, fmt.Sprintf("%d records", n)
		})
	}
	progress("a fifth of the stream counted", lines/5)
	if _, err := cl.ScaleJob(ctx, "wc", 8); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "8 workers", time.Minute, func() bool { return len(procsOf("wc")) == 8 })
	progress("half of the stream counted", lines/2)
	if _, err := cl.ScaleJob(ctx, "wc", 3); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "3 workers", time.Minute, func() bool { return len(procsOf("wc")) == 3 })
	testenv.EventuallyWith(t, "every offset counted", 3*time.Minute, func() (bool, string) {
		seen, n := counted()
		return len(seen) == lines, fmt.Sprintf("%d of %d offsets in %d records", len(seen), lines, n)
	})
	seen, n := counted()
	bad := 0
	for o := int64(0); o < lines; o++ {
		if seen[o] != 1 {
			if bad++; bad <= 10 {
				t.Errorf("offset %d counted %d times", o, seen[o])
			}
		}
	}
	if n != lines {
		t.Errorf("%d records for %d lines (%d offsets wrong)", n, lines, bad)
	}
	ledger, _ := os.ReadFile(out + ".ledger")
	t.Logf("figure: 50,000 lines scaled 4 -> 8 -> 3 mid-stream: %d records, %d offsets wrong; ledger:\n%s", n, bad, ledger)
}
