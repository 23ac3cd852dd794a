package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseUpdateBlock(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "update.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := ParseJobSpec(data)
	if err != nil {
		t.Fatalf("ParseJobSpec: %v", err)
	}
	want := UpdatePolicy{MaxParallel: 2, Canary: 1, By: RolloutByRack, MinHealthy: Duration(5 * time.Second),
		Deadline: Duration(2 * time.Minute), AutoRevert: true}
	if j.Update != want {
		t.Errorf("update = %+v, want %+v", j.Update, want)
	}
	run, live := j.SplitEnv()
	if !reflect.DeepEqual(run, map[string]string{"MODE": "fast"}) || !reflect.DeepEqual(live, map[string]string{"LEVEL": "info"}) {
		t.Errorf("split env = %v, %v", run, live)
	}
	if e := (UpdatePolicy{}).Effective(); e.MaxParallel != 1 || e.By != RolloutByWorker || e.MinHealthy.Std() != DefaultMinHealthy || e.Deadline.Std() != DefaultDeadline {
		t.Errorf("defaults = %+v", e)
	}
}

func TestParseUpdateProblems(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "badupdate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ParseJobSpec(data)
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("want *ValidationError, got %v", err)
	}
	got := map[string]string{}
	for _, p := range ve.Problems {
		got[p.Path] = p.String()
	}
	for path, want := range map[string]string{
		"liveEnv[1]":         "STORMDOCK_ variables are set by stormdock itself (line 6)",
		"liveEnv[2]":         `"LEVEL" is listed twice (line 6)`,
		"update.maxParallel": "must not be negative (0 means 1) (line 8)",
		"update.canary":      "must be at most the job's 4 workers (line 9)",
		"update.by":          `must be worker, node, rack or dc, not "zone" (line 10)`,
		"update.deadline":    "must be longer than minHealthy (1m0s) (line 12)",
		"update.autoRevert":  "must be true or false",
		"update.speed":       "unknown field (line 14)",
	} {
		if !strings.Contains(got[path], want) {
			t.Errorf("problem for %s = %q, want it to contain %q\nall: %v", path, got[path], want, err)
		}
	}
}

func TestSameRunAndLive(t *testing.T) {
	base := WorkerAssignment{Key: WorkerKey{Job: "wc", Worker: 1}, Generation: 3, Workers: 4, Epoch: 1,
		Command: []string{"a"}, Env: map[string]string{"A": "1"}, LiveEnv: map[string]string{"L": "x"},
		Secrets: []SecretRef{{Name: "db", Version: 2}}}
	for _, tc := range []struct {
		name      string
		change    func(*WorkerAssignment)
		run, live bool
	}{
		{"nothing", func(*WorkerAssignment) {}, true, true},
		{"generation", func(w *WorkerAssignment) { w.Generation = 4 }, true, false},
		{"worker count", func(w *WorkerAssignment) { w.Workers, w.Epoch = 8, 2 }, true, false},
		{"live env", func(w *WorkerAssignment) { w.LiveEnv = map[string]string{"L": "y"} }, true, false},
		{"routers", func(w *WorkerAssignment) { w.Routers = []string{"http://r"} }, true, false},
		{"env", func(w *WorkerAssignment) { w.Env = map[string]string{"A": "2"} }, false, true},
		{"command", func(w *WorkerAssignment) { w.Command = []string{"b"} }, false, true},
		{"restart", func(w *WorkerAssignment) { w.Restart = 7 }, false, true},
		{"pinned image", func(w *WorkerAssignment) { w.Pinned = "r/x@sha256:1" }, false, true},
		// A secret's new version reaches the worker live (its file, then SIGHUP); another
		// set of secrets is another run.
		{"secret version", func(w *WorkerAssignment) { w.Secrets = []SecretRef{{Name: "db", Version: 3}} }, true, true},
		{"secret names", func(w *WorkerAssignment) { w.Secrets = []SecretRef{{Name: "api", Version: 2}} }, false, true},
		{"secret added", func(w *WorkerAssignment) {
			w.Secrets = []SecretRef{{Name: "db", Version: 2}, {Name: "api", Version: 1}}
		}, false, true},
	} {
		b := base
		b.Env, b.LiveEnv = map[string]string{"A": "1"}, map[string]string{"L": "x"}
		tc.change(&b)
		if got := base.SameRun(b); got != tc.run {
			t.Errorf("%s: SameRun = %v, want %v", tc.name, got, tc.run)
		}
		if got := base.SameLive(b); got != tc.live {
			t.Errorf("%s: SameLive = %v, want %v", tc.name, got, tc.live)
		}
	}
	if env := base.RunEnv(); !reflect.DeepEqual(env, map[string]string{"A": "1", "L": "x"}) {
		t.Errorf("RunEnv = %v", env)
	}
}

func TestHistoryKeepsCurrent(t *testing.T) {
	var h JobHistory
	for g := int64(1); g <= MaxHistory+5; g++ {
		h.Add(GenerationRecord{Generation: g}, 1)
	}
	if len(h.Generations) != MaxHistory {
		t.Fatalf("%d generations kept, want %d", len(h.Generations), MaxHistory)
	}
	if _, ok := h.Find(1); !ok {
		t.Errorf("generation 1 (kept) dropped")
	}
	if _, ok := h.Find(2); ok {
		t.Errorf("generation 2 kept over the cap")
	}
	if h.Latest() != MaxHistory+5 {
		t.Errorf("latest = %d", h.Latest())
	}
}
