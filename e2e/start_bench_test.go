package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkStartSixteen measures issue 21's figures for one agent with 16 slots (process
// driver, cgroups, a real ZooKeeper, the default 1s heartbeat): from the master's write of
// the node's assignment to the node record showing all 16 workers running, both as a client
// of the store sees them, and the wall time of `stormdock job submit --wait` of the job.
// Each iteration submits a job of 16 sleeping workers, then kills it. Run it alone:
//
//	CI=true go test -run '^$' -bench StartSixteen -benchtime 5x ./e2e/
func BenchmarkStartSixteen(b *testing.B) {
	const slots = 16
	h := newHarness(b, 2*time.Second)
	url := h.startMaster("m1")
	cl := h.client(url)
	ctx := context.Background()
	testenv.Eventually(b, "m1 leads", 30*time.Second, func() bool { hl, err := cl.Health(ctx); return err == nil && hl.Leader })
	h.startAgent("n1", "dc-a", "r1", slots, "--heartbeat", "1s")
	testenv.Eventually(b, "the node registered", 30*time.Second, func() bool { return len(h.nodeRecords()) == 1 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		b.Fatal(err)
	}
	var toRunning, submitWait []time.Duration
	b.ResetTimer()
	for i := range b.N {
		job := fmt.Sprintf("s%d", i)
		spec := filepath.Join(h.dir, job+".yaml")
		if err := os.WriteFile(spec, []byte(fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 16Mi, cpu: 0.1}
command: [/bin/sleep, "100000"]
gracePeriod: 1s
`, job, slots)), 0o644); err != nil {
			b.Fatal(err)
		}
		seen := h.watchStart(b, job, slots)
		cmd := exec.Command(binary, "job", "submit", "--wait", spec, "--master", url)
		cmd.Env = append(os.Environ(), "STORMDOCK_DATA="+filepath.Join(h.dir, "data"))
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("job submit --wait: %v\n%s", err, out)
		}
		submitWait = append(submitWait, time.Since(t0))
		st := <-seen
		toRunning = append(toRunning, st.running.Sub(st.assigned))
		b.StopTimer()
		if _, err := cl.KillJob(ctx, job, 0); err != nil {
			b.Fatal(err)
		}
		testenv.Eventually(b, job+" stopped", time.Minute, func() bool {
			for _, rec := range h.nodeRecords() {
				for _, w := range rec.Workers {
					if w.Key.Job == job {
						return false
					}
				}
			}
			return true
		})
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(median(toRunning).Seconds(), "assigned-to-running-s")
	b.ReportMetric(median(submitWait).Seconds(), "submit-wait-s")
	b.Logf("figure: one agent, %d slots, %d runs: assignment written -> all %d running %v (median %v); job submit --wait %v (median %v)",
		slots, b.N, slots, rounded(toRunning), median(toRunning).Round(time.Millisecond), rounded(submitWait), median(submitWait).Round(time.Millisecond))
}

// startSeen is when a job's assignment reached the store and when the node record first
// showed all its workers running, as a store client saw each.
type startSeen struct{ assigned, running time.Time }

// watchStart watches node n1's assignment and record until job's n workers run on it.
func (h *harness) watchStart(tb testing.TB, job string, n int) <-chan startSeen {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	assign, err := h.store.Watch(ctx, cluster.AssignmentsKey+"/n1")
	if err != nil {
		tb.Fatal(err)
	}
	node, err := h.store.Watch(ctx, cluster.NodesKey+"/n1")
	if err != nil {
		tb.Fatal(err)
	}
	out := make(chan startSeen, 1)
	go func() {
		defer cancel()
		var st startSeen
		for st.assigned.IsZero() || st.running.IsZero() {
			select {
			case <-ctx.Done():
				close(out)
				return
			case ev := <-assign:
				var na cluster.NodeAssignment
				if st.assigned.IsZero() && ev.Exists && json.Unmarshal(ev.Entry.Value, &na) == nil &&
					slices.ContainsFunc(na.Workers, func(w cluster.WorkerAssignment) bool { return w.Key.Job == job }) {
					st.assigned = time.Now()
				}
			case ev := <-node:
				var rec cluster.NodeRecord
				if st.running.IsZero() && ev.Exists && json.Unmarshal(ev.Entry.Value, &rec) == nil {
					running := 0
					for _, w := range rec.Workers {
						if w.Key.Job == job && w.State == cluster.WorkerRunning {
							running++
						}
					}
					if running == n {
						st.running = time.Now()
					}
				}
			}
		}
		out <- st
	}()
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
