package clusterbench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pinning puts the master on a core of its own, and the rest of the benchmark (this
// process's simulated agents, and ZooKeeper when it runs on this machine) on the other
// cores, so that the master's figures are its own and not the wait for a core the agents
// hold. It sets processor affinity (sched_setaffinity), every thread of each process;
// threads made later inherit it. What it changed is put back by undo.
type pinning struct {
	master, rest unix.CPUSet
	// note says what was pinned where, or why nothing was.
	note string
	// undo puts back the affinity of this process and ZooKeeper.
	undo []func()
}

// planPinning splits the cores this process may use: the last for the master, the others
// for the rest. With one core there is nothing to split: it returns nil and says so.
func planPinning() (*pinning, string, error) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return nil, "", fmt.Errorf("read this process's cores: %w", err)
	}
	cpus := cpuList(all)
	if len(cpus) < 2 {
		return nil, fmt.Sprintf("not pinned: this process may use one core only (cpu %s), so the master, ZooKeeper and the agents share it; the master's cpu figures still are its own process's", join(cpus)), nil
	}
	p := &pinning{}
	p.master.Set(cpus[len(cpus)-1])
	for _, c := range cpus[:len(cpus)-1] {
		p.rest.Set(c)
	}
	return p, "", nil
}

// start starts cmd on the master's core: the child inherits the affinity of the thread that
// forks it, so this goroutine holds its thread, narrowed for the fork and put back after.
func (p *pinning) start(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	if err := unix.SchedSetaffinity(0, &p.master); err != nil {
		return fmt.Errorf("pin the master to cpu %s: %w", join(cpuList(p.master)), err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// pinRest pins this process, and ZooKeeper at zkAddr when it is a process of this machine,
// to the other cores, and says what it did.
func (p *pinning) pinRest(zkAddr string) error {
	old, err := setProcess(os.Getpid(), p.rest)
	if err != nil {
		return fmt.Errorf("pin the agents: %w", err)
	}
	procs := runtime.GOMAXPROCS(p.rest.Count())
	p.undo = append(p.undo, func() {
		_, _ = setProcess(os.Getpid(), old)
		runtime.GOMAXPROCS(procs)
	})
	m, r := join(cpuList(p.master)), join(cpuList(p.rest))
	pid, why := localServer(zkAddr)
	if pid == 0 {
		p.note = fmt.Sprintf("master on cpu %s; the agents on cpu %s; ZooKeeper not pinned (%s)", m, r, why)
		return nil
	}
	zold, err := setProcess(pid, p.rest)
	if err != nil {
		p.note = fmt.Sprintf("master on cpu %s; the agents on cpu %s; ZooKeeper (pid %d) not pinned: %v", m, r, pid, err)
		return nil
	}
	p.undo = append(p.undo, func() { _, _ = setProcess(pid, zold) })
	p.note = fmt.Sprintf("master on cpu %s; ZooKeeper (pid %d) and the agents on cpu %s", m, pid, r)
	return nil
}

// release puts back what pinRest changed.
func (p *pinning) release() {
	if p == nil {
		return
	}
	for i := len(p.undo) - 1; i >= 0; i-- {
		p.undo[i]()
	}
	p.undo = nil
}

// setProcess sets the affinity of every thread of pid and returns the one its first thread
// had.
func setProcess(pid int, set unix.CPUSet) (unix.CPUSet, error) {
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &old); err != nil {
		return old, err
	}
	// Twice: a thread made while the first pass ran may have copied an old mask.
	for range 2 {
		tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return old, err
		}
		for _, t := range tids {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return old, fmt.Errorf("thread %d of process %d: %w", tid, pid, err)
			}
		}
	}
	return old, nil
}

// localServer finds the process of this machine that listens on addr's port, when addr is
// a loopback address; otherwise it says why it found none.
func localServer(addr string) (int, string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err.Error()
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0, "it is at " + addr + ", not on loopback"
	}
	pn, err := strconv.Atoi(port)
	if err != nil {
		return 0, "port " + port
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, ino := range listening(f, pn) {
			inodes["socket:["+ino+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, "nothing of this machine's network namespace listens on port " + port
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, dir := range procs {
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && inodes[link] {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
				return pid, ""
			}
		}
	}
	return 0, "the process listening on port " + port + " is not visible from here"
}

// listening returns the inodes of the sockets listening on port in a /proc/net/tcp file.
func listening(file string, port int) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
			out = append(out, fields[9])
		}
	}
	return out
}

func cpuList(s unix.CPUSet) []int {
	var out []int
	for c := range 1024 {
		if s.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

func join(cpus []int) string {
	parts := make([]string, len(cpus))
	for i, c := range cpus {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}
