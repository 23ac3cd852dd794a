package master

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// stepFixture is a job of workers spread over racks, for stepRollout.
type stepFixture struct {
	ro      cluster.Rollout
	workers []rolloutWorker
	now     time.Time
	ready   map[string]string // node -> "" ready, "pulling", or a failure
}

func newStepFixture(n, racks int, pol cluster.UpdatePolicy) *stepFixture {
	f := &stepFixture{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	f.ro = cluster.Rollout{ID: 1, Kind: cluster.RolloutUpdate, From: 1, To: 2, State: cluster.RolloutRunning, Policy: pol.Effective()}
	for i := range n {
		node := fmt.Sprintf("n%d", i)
		rack := fmt.Sprintf("dc/r%d", i%racks)
		if pol.By == cluster.RolloutByWorker || pol.By == "" {
			rack = ""
		}
		f.workers = append(f.workers, rolloutWorker{key: cluster.WorkerKey{Job: "wc", Worker: i}, node: node, planned: node,
			needs: true, domain: rack, status: &cluster.WorkerStatus{State: cluster.WorkerRunning, Generation: 1, Since: f.now.Add(-time.Hour)}})
	}
	return f
}

func (f *stepFixture) step() rolloutStep {
	in := rolloutIn{workers: slices.Clone(f.workers), gen: f.ro.To, ready: func(node string) (bool, string) {
		switch why := f.ready[node]; why {
		case "":
			return true, ""
		case "pulling":
			return false, ""
		default:
			return false, why
		}
	}}
	for i := range in.workers {
		if s := in.workers[i].status; s != nil {
			c := *s
			in.workers[i].status = &c
		}
	}
	st := stepRollout(f.ro, in, f.now)
	f.ro = st.next
	return st
}

// agents plays the agents for what the step admitted: each admitted worker is replaced
// (down for a moment, then running the target since now).
func (f *stepFixture) replace(down bool) {
	for _, fl := range f.ro.InFlight {
		w := &f.workers[fl.Key.Worker]
		if !w.needs {
			continue
		}
		w.needs = false
		if down {
			w.status = &cluster.WorkerStatus{State: cluster.WorkerStopping, Generation: 1}
		} else {
			w.status = &cluster.WorkerStatus{State: cluster.WorkerRunning, Generation: f.ro.To, Since: f.now}
		}
	}
}

func inFlightKeys(ro cluster.Rollout) []int {
	var out []int
	for _, f := range ro.InFlight {
		out = append(out, f.Key.Worker)
	}
	slices.Sort(out)
	return out
}

// By rack: one rack after the other, at most maxParallel at once, each replacement healthy
// after minHealthy before the next is admitted, and the rack's last one before the next rack.
func TestStepByRack(t *testing.T) {
	f := newStepFixture(9, 3, cluster.UpdatePolicy{By: cluster.RolloutByRack, MaxParallel: 2, MinHealthy: cluster.Duration(10 * time.Second)})
	var racks []string
	for range 100 {
		st := f.step()
		if st.fail != "" {
			t.Fatalf("failed: %s", st.fail)
		}
		if len(f.ro.InFlight) > 2 {
			t.Fatalf("%d in flight, maxParallel 2: %v", len(f.ro.InFlight), inFlightKeys(f.ro))
		}
		for _, fl := range f.ro.InFlight {
			if d := f.workers[fl.Key.Worker].domain; d != f.ro.Domain {
				t.Fatalf("worker %d of %s in flight during batch %s", fl.Key.Worker, d, f.ro.Domain)
			}
		}
		if len(racks) == 0 || racks[len(racks)-1] != f.ro.Domain {
			racks = append(racks, f.ro.Domain)
		}
		if f.ro.State == cluster.RolloutDone {
			break
		}
		f.replace(false)
		f.now = f.now.Add(5 * time.Second)
	}
	if f.ro.State != cluster.RolloutDone {
		t.Fatalf("rollout %s, want done", f.ro.Summary())
	}
	if want := []string{"dc/r0", "dc/r1", "dc/r2", ""}; !slices.Equal(racks, want) {
		t.Errorf("racks in order %v, want %v", racks, want)
	}
	if f.ro.Batch != 3 || f.ro.Healthy != 9 || f.ro.Total != 9 {
		t.Errorf("done rollout: %s", f.ro.Summary())
	}
}

// A worker already down (crashed) counts against maxParallel: nothing more is admitted
// until it runs again.
func TestStepDownWorkersCount(t *testing.T) {
	f := newStepFixture(4, 1, cluster.UpdatePolicy{MaxParallel: 1})
	f.workers[3].needs = false
	f.workers[3].status = &cluster.WorkerStatus{State: cluster.WorkerBackoff, Generation: 2}
	f.step()
	if len(f.ro.InFlight) != 0 {
		t.Fatalf("admitted %v while a worker is down with maxParallel 1", inFlightKeys(f.ro))
	}
	// A pending worker that is itself down is replaced at once: it costs nothing more.
	f.workers[2].status = &cluster.WorkerStatus{State: cluster.WorkerBackoff, Generation: 1}
	f.step()
	if got := inFlightKeys(f.ro); !slices.Equal(got, []int{2}) {
		t.Fatalf("in flight %v, want [2] (down already)", got)
	}
}

// A worker whose agent has not reported it running yet may be running (reports lag): it
// counts as down for the limit, and is not replaced as if it were down (found end to end: an
// update right after a submit took four workers down with maxParallel 2).
func TestStepUnreportedWorkersAreNotFree(t *testing.T) {
	f := newStepFixture(6, 1, cluster.UpdatePolicy{MaxParallel: 2})
	for i := range 4 {
		f.workers[i].status = &cluster.WorkerStatus{State: cluster.WorkerStarting, Generation: 1}
	}
	f.workers[4].status = nil
	f.step()
	if got := inFlightKeys(f.ro); len(got) != 0 {
		t.Fatalf("in flight %v while 5 workers are not reported running, maxParallel 2", got)
	}
	for i := range 5 {
		f.workers[i].status = &cluster.WorkerStatus{State: cluster.WorkerRunning, Generation: 1, Since: f.now}
	}
	f.step()
	if got := inFlightKeys(f.ro); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("in flight %v, want [0 1]", got)
	}
}

// Canaries go first and are held until promoted.
func TestStepCanary(t *testing.T) {
	f := newStepFixture(6, 1, cluster.UpdatePolicy{Canary: 2, MaxParallel: 3, MinHealthy: cluster.Duration(time.Second)})
	f.step()
	if got := inFlightKeys(f.ro); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("canaries in flight %v, want [0 1]", got)
	}
	f.replace(false)
	f.now = f.now.Add(2 * time.Second)
	f.step()
	if f.ro.State != cluster.RolloutCanary || len(f.ro.InFlight) != 0 {
		t.Fatalf("after healthy canaries: %s, want awaiting-promotion", f.ro.Summary())
	}
	f.step()
	if len(f.ro.InFlight) != 0 {
		t.Fatalf("admitted %v before promotion", inFlightKeys(f.ro))
	}
	f.ro.State, f.ro.Promoted = cluster.RolloutRunning, true
	f.step()
	if got := inFlightKeys(f.ro); !slices.Equal(got, []int{2, 3, 4}) || f.ro.Batch != 2 {
		t.Fatalf("after promotion: in flight %v batch %d, want [2 3 4] in batch 2", got, f.ro.Batch)
	}
}

// A replacement that crash-loops fails the update at once; one that never gets healthy
// fails it at its deadline.
func TestStepFailures(t *testing.T) {
	f := newStepFixture(3, 1, cluster.UpdatePolicy{Deadline: cluster.Duration(time.Minute)})
	f.step()
	f.workers[0].needs = false
	f.workers[0].status = &cluster.WorkerStatus{State: cluster.WorkerBackoff, Generation: 2, RecentRestarts: rolloutCrashRestarts, LastExit: "exited with code 3"}
	st := f.step()
	if !strings.Contains(st.fail, "worker wc/0 is crash-looping on generation 2") || !strings.Contains(st.fail, "exited with code 3") {
		t.Fatalf("fail = %q, want worker wc/0 crash-looping", st.fail)
	}

	f = newStepFixture(3, 1, cluster.UpdatePolicy{Deadline: cluster.Duration(time.Minute)})
	f.step()
	f.workers[0].needs = false
	f.workers[0].status = &cluster.WorkerStatus{State: cluster.WorkerPulling, Generation: 2}
	f.now = f.now.Add(30 * time.Second)
	if st := f.step(); st.fail != "" || st.wake.IsZero() {
		t.Fatalf("before the deadline: fail %q, wake %v", st.fail, st.wake)
	}
	f.now = f.now.Add(31 * time.Second)
	if st := f.step(); !strings.Contains(st.fail, "not healthy within the deadline of 1m0s (pulling)") {
		t.Fatalf("fail = %q, want the deadline", st.fail)
	}
}

// Nothing is stopped before its node has the new image; a pull that failed fails the
// update.
func TestStepWaitsForPrepull(t *testing.T) {
	f := newStepFixture(2, 1, cluster.UpdatePolicy{MaxParallel: 2})
	f.ready = map[string]string{"n0": "pulling"}
	st := f.step()
	if got := inFlightKeys(f.ro); !slices.Equal(got, []int{1}) {
		t.Fatalf("in flight %v, want [1]: n0 is still pulling", got)
	}
	if !st.prepull["n0"] || !st.prepull["n1"] {
		t.Fatalf("prepull on %v, want n0 and n1", st.prepull)
	}
	f.ready["n0"] = "image r/x@sha256:1 could not be pulled on node n0: denied"
	if st := f.step(); !strings.Contains(st.fail, "could not be pulled on node n0") {
		t.Fatalf("fail = %q", st.fail)
	}
}

// A paused rollout admits nothing; its replacements in flight still finish.
func TestStepPaused(t *testing.T) {
	f := newStepFixture(4, 1, cluster.UpdatePolicy{MaxParallel: 1, MinHealthy: cluster.Duration(time.Second)})
	f.step()
	f.ro.State = cluster.RolloutPaused
	f.replace(false)
	f.now = f.now.Add(2 * time.Second)
	f.step()
	if len(f.ro.InFlight) != 0 || f.ro.State != cluster.RolloutPaused {
		t.Fatalf("paused: %s", f.ro.Summary())
	}
	f.step()
	if len(f.ro.InFlight) != 0 {
		t.Fatalf("paused rollout admitted %v", inFlightKeys(f.ro))
	}
}
