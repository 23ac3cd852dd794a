package testenv

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CgroupRoot is where the tests find the cgroup hierarchies.
const CgroupRoot = "/sys/fs/cgroup"

// CgroupV2 reports whether the host's cgroups are the unified (v2) hierarchy; hybrid hosts,
// whose v2 mount holds no controllers, are v1.
func CgroupV2() bool {
	_, err := os.Stat(filepath.Join(CgroupRoot, "cgroup.controllers"))
	return err == nil
}

// CgroupDirs are the directories of cgroup rel: one per v1 hierarchy, or the one on v2.
func CgroupDirs(rel string) []string {
	if CgroupV2() {
		return []string{filepath.Join(CgroupRoot, rel)}
	}
	var out []string
	ents, _ := os.ReadDir(CgroupRoot)
	for _, e := range ents {
		if e.IsDir() && e.Name() != "unified" {
			out = append(out, filepath.Join(CgroupRoot, e.Name(), rel))
		}
	}
	return out
}

// RemoveCgroupTree kills every process below rel and removes its cgroups, deepest first, in
// every hierarchy: the last line of a test's cleanup, whatever state it left them in.
func RemoveCgroupTree(rel string) {
	for _, dir := range CgroupDirs(rel) {
		var dirs []string
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for range 250 {
				b, _ := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				if err := os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
					break
				}
				// No testing.TB to wait with: the kernel tears killed processes down in
				// milliseconds, and rmdir fails with EBUSY until it has.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// Delegate makes the cgroup unit (a path below the hierarchy root, "/a/unit") and hands it
// to uid as systemd's Delegate=yes hands a unit's cgroup to its user: the directory and the
// files that create children, move processes and enable controllers; files of cgroups made
// below belong to whoever makes them. On v2 every cgroup above enables the cpu, memory and
// pids controllers for its children, as systemd enables them for a delegated unit, except
// those in withhold; on v1 the hierarchies in withhold stay root's. The cleanup removes the
// unit's topmost cgroup ("/a") with everything in it.
func Delegate(t testing.TB, unit string, uid int, withhold ...string) {
	t.Helper()
	Cgroups(t)
	t.Cleanup(func() { RemoveCgroupTree("/" + strings.Split(strings.Trim(unit, "/"), "/")[0]) })
	if CgroupV2() {
		dir := CgroupRoot
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
		ChownCgroup(t, dir, uid)
		return
	}
	cpuset := filepath.Join(CgroupRoot, "cpuset")
	for _, dir := range CgroupDirs(unit) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(dir, cpuset+"/") {
			// A v1 cpuset runs nothing until it has cpus and memory nodes, each level a
			// subset of the one above.
			for d := cpuset; d != dir; {
				d = filepath.Join(d, strings.Split(strings.TrimPrefix(dir, d+"/"), "/")[0])
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, _ := os.ReadFile(filepath.Join(cpuset, f))
					if err := os.WriteFile(filepath.Join(d, f), v, 0); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if !slices.ContainsFunc(withhold, func(c string) bool { return strings.HasPrefix(dir, filepath.Join(CgroupRoot, c)+"/") }) {
			ChownCgroup(t, dir, uid)
		}
	}
}

// ChownCgroup gives uid the files of one cgroup directory that systemd gives a delegate.
func ChownCgroup(t testing.TB, dir string, uid int) {
	t.Helper()
	for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control", "tasks"} {
		if err := os.Chown(filepath.Join(dir, f), uid, uid); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
}

// StartIn makes cmd start in the v2 cgroup rel (clone3 with CLONE_INTO_CGROUP), as a systemd
// unit's main process starts in its cgroup; on v1 it changes nothing. Call the returned func
// once cmd has started.
func StartIn(t testing.TB, cmd *exec.Cmd, rel string) (done func()) {
	t.Helper()
	if !CgroupV2() {
		return func() {}
	}
	fd, err := syscall.Open(filepath.Join(CgroupRoot, rel), syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	return func() { syscall.Close(fd) }
}

// Shared copies files (binaries) into a fresh directory that every user may read and run,
// for tests that run them as an unprivileged user: test builds live in private directories.
// It returns the copies' paths, in order, and a directory owned by uid for their state.
func Shared(t testing.TB, uid int, files ...string) (copies []string, state string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "stormdock-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, src := range files {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, strconv.Itoa(i), filepath.Base(src))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o755); err != nil {
			t.Fatal(err)
		}
		copies = append(copies, dst)
	}
	state = filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, uid, uid); err != nil {
		t.Fatal(err)
	}
	return copies, state
}
