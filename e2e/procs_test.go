package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/stormdock/stormdock/internal/clustertest"
)

// procWorker is one worker process found in /proc.
type procWorker struct {
	pid  int
	node string
	cmd  string // for diagnostics: ppid and command line
}

// workerProcs finds the worker processes of a job from /proc, outside the project's own
// API: processes whose environment names the job, less their lease launchers, in the
// cgroups of this test process's clusters (other tests on the machine run jobs of the same
// names). It maps "link/worker" (or "worker") to the processes running it.
func workerProcs(job string) map[string][]procWorker {
	return workerProcsIn(job, cgroupPIDs(clustertest.TestCgroup()))
}

// workerProcsIn is workerProcs among pids.
func workerProcsIn(job string, pids []int) map[string][]procWorker {
	out := map[string][]procWorker{}
	want := []byte("STORMDOCK_JOB=" + job + "\x00")
	for _, pid := range pids {
		name := strconv.Itoa(pid)
		env, err := os.ReadFile(filepath.Join("/proc", name, "environ"))
		if err != nil || !bytes.Contains(append(env, 0), want) {
			continue
		}
		// The lease launcher: `stormdock launch`, or the process driver's shim running it in
		// place (`stormdock-shim BIN BIN launch ...`).
		cmd, _ := os.ReadFile(filepath.Join("/proc", name, "cmdline"))
		if args := bytes.Split(cmd, []byte{0}); len(args) > 1 && (string(args[1]) == "launch" || string(args[0]) == "stormdock-shim") {
			continue
		}
		if !clustertest.Alive(pid) {
			continue
		}
		var worker, link, node string
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "STORMDOCK_WORKER="); ok {
				worker = v
			}
			if v, ok := strings.CutPrefix(kv, "STORMDOCK_LINK="); ok {
				link = v
			}
			if v, ok := strings.CutPrefix(kv, "STORMDOCK_NODE="); ok {
				node = v
			}
		}
		key := worker
		if link != "" {
			key = link + "/" + worker
		}
		out[key] = append(out[key], procWorker{pid: pid, node: node, cmd: describe(pid, cmd)})
	}
	return out
}

// cgroupPIDs lists the processes in a cgroup and the cgroups below it, from one hierarchy (the
// memory controller's on cgroup v1, the unified one on v2): the workers of this test process's
// clusters, found without reading every process of the machine, which on a busy machine costs
// more than the test's own clusters do.
func cgroupPIDs(parent string) []int {
	root := "/sys/fs/cgroup"
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err == nil {
		root = "/sys/fs/cgroup/memory"
	}
	var pids []int
	_ = filepath.WalkDir(filepath.Join(root, parent), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// procsOf maps each worker of a job to its one process, from /proc.
func procsOf(job string) map[string]procWorker {
	out := map[string]procWorker{}
	for k, ps := range workerProcs(job) {
		if len(ps) == 1 {
			out[k] = ps[0]
		}
	}
	return out
}

// describe names a process for diagnostics: its parent and command line.
func describe(pid int, cmdline []byte) string {
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	ppid := ""
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		if f := strings.Fields(string(stat[i+1:])); len(f) > 1 {
			ppid = f[1]
		}
	}
	return "ppid " + ppid + ": " + strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")
}
