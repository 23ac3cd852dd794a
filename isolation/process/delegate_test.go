package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
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

// unprivileged copies this test binary and the hog where an unprivileged user may run them,
// and makes a state directory that user may write.
func unprivileged(t *testing.T) (bin, hogCopy, state string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "stormdock-deleg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for src, dst := range map[string]*string{self: &bin, hog: &hogCopy} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		*dst = filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(*dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	state = filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return bin, hogCopy, state
}

// delegate makes the cgroup unit and hands it to uid nobody as systemd's Delegate=yes does:
// the directory and the files that create children, move processes and enable controllers
// (files of cgroups created below belong to their creator). On v2 the cgroups above enable
// the worker controllers for their children, as systemd enables them for a delegated unit,
// except those in withhold; on v1 the hierarchies named in withhold stay root's.
func delegate(t *testing.T, unit string, withhold ...string) {
	t.Helper()
	t.Cleanup(func() { removeCgroups("/" + strings.Split(strings.Trim(unit, "/"), "/")[0]) })
	if isV2() {
		dir := "/sys/fs/cgroup"
		for _, part := range strings.Split(strings.Trim(unit, "/"), "/") {
			var give []string
			for _, c := range []string{"cpu", "memory", "pids"} {
				if !slices.Contains(withhold, c) {
					give = append(give, "+"+c)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(give, " ")), 0); err != nil {
				t.Fatalf("enable controllers in %s, as systemd does: %v", dir, err)
			}
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
		}
		chownCgroup(t, dir)
		return
	}
	for _, dir := range cgroupDirs(unit) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(dir, "/sys/fs/cgroup/cpuset/") {
			// A v1 cpuset runs nothing until it has cpus and memory nodes, each level a
			// subset of the one above.
			for d := "/sys/fs/cgroup/cpuset"; d != dir; {
				d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0])
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuset", f))
					if err := os.WriteFile(filepath.Join(d, f), v, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if !slices.ContainsFunc(withhold, func(c string) bool { return strings.HasPrefix(dir, "/sys/fs/cgroup/"+c+"/") }) {
			chownCgroup(t, dir)
		}
	}
}

// chownCgroup gives uid nobody what systemd gives a delegate.
func chownCgroup(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control", "tasks"} {
		if err := os.Chown(filepath.Join(dir, f), nobody, nobody); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

func isV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// As systemd hosts delegate: an agent that may write only a subtree of the hierarchy (its
// unit's cgroup) runs workers with a cgroup parent inside it, and writes nothing outside it;
// where it may not, it says what it needs in one line. The driver runs as an unprivileged
// user, so a write outside the subtree would fail the start.
func TestDelegatedSubtree(t *testing.T) {
	testenv.Cgroups(t)
	v2 := isV2()
	tests := []struct {
		name string
		// leaf is the cgroup the agent runs in, below the unit (v2 only: v1 moves a process
		// between any cgroups its owner may write); parent is the workers' cgroup parent.
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
			delegate(t, unit, tc.withhold...)
			bin, hogCopy, state := unprivileged(t)
			cmd := exec.Command(bin, "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=delegated", "CGROUP_PARENT="+wparent, "STATE_DIR="+state, "HOG="+hogCopy)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			if v2 {
				// Born in the agent's cgroup (CLONE_INTO_CGROUP), as a unit's main process
				// is (systemd: DelegateSubgroup=).
				dir := filepath.Join("/sys/fs/cgroup", unit, tc.leaf)
				if tc.leaf != "" {
					if err := os.Mkdir(dir, 0o755); err != nil {
						t.Fatal(err)
					}
					chownCgroup(t, dir)
				}
				fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer syscall.Close(fd)
				cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
			}
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
