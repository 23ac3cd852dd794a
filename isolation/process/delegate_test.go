package process_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/process"
)

// nobody is the unprivileged user the delegation tests run the driver as.
const nobody = 65534

// delegatedResult is what the "delegated" helper reports.
type delegatedResult struct {
	Err    string           `json:"err,omitempty"`
	Limits isolation.Limits `json:"limits"`
	Cgroup string           `json:"cgroup"` // the worker's /proc/PID/cgroup
	Left   bool             `json:"left"`   // anything left of the parent after stop
}

// runDelegated is the helper: a driver as an unprivileged user, on the cgroup parent the test
// delegated, starts a worker, reads its limits back, stops it and removes the parent.
func runDelegated() {
	var r delegatedResult
	defer func() {
		b, _ := json.Marshal(r)
		fmt.Print(string(b))
	}()
	parent := os.Getenv("CGROUP_PARENT")
	d, err := process.New(process.Config{CgroupParent: parent, StateDir: os.Getenv("STATE_DIR"), Logger: quietLogger()})
	if err != nil {
		r.Err = err.Error()
		return
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec := isolation.Spec{ID: "w", Job: "deleg", Command: []string{os.Getenv("HOG"), "sleep"},
		MemoryBytes: 48 * isolation.MiB, MilliCPU: 500, Pids: 77, LogDir: os.Getenv("STATE_DIR")}
	w, err := d.Start(ctx, spec)
	if err != nil {
		r.Err = err.Error()
		return
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", w.PID))
	r.Cgroup = string(b)
	if r.Limits, err = d.Limits(ctx, spec.ID); err != nil {
		r.Err = err.Error()
	}
	if _, err := d.Stop(ctx, spec.ID, 0); err != nil && r.Err == "" {
		r.Err = err.Error()
	}
	if err := d.RemoveParent(); err != nil && r.Err == "" {
		r.Err = "remove parent: " + err.Error()
	}
	for _, dir := range cgroupDirs(parent) {
		if _, err := os.Stat(dir); err == nil {
			r.Left = true
		}
	}
}

// As systemd hosts delegate: an agent that may write only a subtree of the hierarchy (its
// unit's cgroup) runs workers with a cgroup parent inside it, and writes nothing outside it;
// where it may not, it says what it needs in one line. The driver runs as an unprivileged
// user, so a write outside the subtree would fail the start.
func TestDelegatedSubtree(t *testing.T) {
	testenv.Cgroups(t)
	v2 := testenv.CgroupV2()
	tests := []struct {
		name string
		// leaf is the cgroup the agent runs in, below the unit (v2 only); parent is the
		// workers' cgroup parent.
		leaf, parent string
		// withhold: v2 controllers the cgroup above the unit does not give it; v1
		// hierarchies the unit is not delegated in.
		withhold []string
		// want is what the one-line error says on v2 (nothing: success), wantV1 on v1.
		want, wantV1 []string
	}{
		{name: "agent in a leaf, parent in the unit", leaf: "agent", parent: "workers"},
		{name: "parent nested deeper", leaf: "agent", parent: "workers/node-1"},
		// v2's "no internal processes" rule; v1 has none.
		{name: "agent in the unit itself", leaf: "", parent: "workers",
			want: []string{"isolation unavailable", "holds processes", "DelegateSubgroup=agent", "/workers"}},
		{name: "pids not delegated", leaf: "agent", parent: "workers", withhold: []string{"pids"},
			want:   []string{"isolation unavailable", "cannot enable pids", "+pids", "delegated to uid 65534"},
			wantV1: []string{"isolation unavailable", "pids", "run the agent as root", "delegated to uid 65534"}},
		{name: "parent outside the unit", leaf: "agent", parent: "../elsewhere",
			want:   []string{"isolation unavailable", "cannot create cgroup", "elsewhere", "delegated to uid 65534", "Delegate=yes"},
			wantV1: []string{"isolation unavailable", "cannot create cgroup", "elsewhere", "delegated to uid 65534"}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			unit := fmt.Sprintf("%s-deleg%d/unit", parent, i)
			wparent := path.Join(unit, tc.parent)
			want := tc.want
			if !v2 {
				want = tc.wantV1
			}
			testenv.Delegate(t, unit, nobody, tc.withhold...)
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			bins, state := testenv.Shared(t, nobody, self, hog)
			cmd := exec.Command(bins[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=delegated", "CGROUP_PARENT="+wparent, "STATE_DIR="+state, "HOG="+bins[1])
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			// Born in the agent's cgroup, as a unit's main process is (systemd:
			// DelegateSubgroup=); v1 moves a process between any cgroups its owner may write.
			if v2 && tc.leaf != "" {
				dir := filepath.Join(testenv.CgroupRoot, unit, tc.leaf)
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				testenv.ChownCgroup(t, dir, nobody)
			}
			defer testenv.StartIn(t, cmd, path.Join(unit, tc.leaf))()
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v\n%s", err, out)
			}
			var r delegatedResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("helper said %q: %v", out, err)
			}
			if len(want) > 0 {
				t.Logf("as uid %d: %s", nobody, r.Err)
				for _, w := range want {
					if !strings.Contains(r.Err, w) {
						t.Errorf("error %q does not say %q", r.Err, w)
					}
				}
				if r.Err == "" || strings.Contains(r.Err, "\n") {
					t.Errorf("error %q: want one line", r.Err)
				}
				return
			}
			if r.Err != "" {
				t.Fatalf("as uid %d in a delegated subtree: %s", nobody, r.Err)
			}
			if r.Limits.MemoryBytes != 48*isolation.MiB || r.Limits.Pids != 77 || r.Limits.MilliCPU() != 500 {
				t.Errorf("limits read back: %+v", r.Limits)
			}
			if !strings.Contains(r.Cgroup, wparent+"/w\n") {
				t.Errorf("worker ran in %q, want %s/w", r.Cgroup, wparent)
			}
			if r.Left {
				t.Errorf("cgroup parent %s left after stop and RemoveParent", wparent)
			}
		})
	}
}
