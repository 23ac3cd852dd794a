package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// binary is the stormdock binary built once for the package; allocBinary the test worker
// that allocates memory in steps.
var binary, allocBinary string

func TestMain(m *testing.M) {
	var err error
	if binary, err = testenv.Build("./cmd/stormdock"); err == nil {
		allocBinary, err = testenv.Build("./e2e/testdata/alloc")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// proc is one stormdock process of the test cluster.
type proc struct {
	name string
	args []string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// harness is a cluster of stormdock processes on a ZooKeeper server of the test's own.
type harness struct {
	t       testing.TB
	zk      *zktest.Server
	ens     *zktest.Ensemble // set instead of zk for a harness on an ensemble
	chroot  string
	dir     string
	session time.Duration
	cgroup  string
	// command, when set, makes the command of a process by its name (a lab cluster runs
	// each in its host's network); dialer, when set, connects the test's own store client.
	command func(name string, args []string) *exec.Cmd
	dialer  func(network, addr string, timeout time.Duration) (net.Conn, error)

	mu      sync.Mutex
	masters map[string]*proc
	agents  map[string]*proc
	ports   map[string]int // each node's port base
	store   coord.Store
}

// testCgroup is the cgroup parent of every worker this test process's clusters run.
func testCgroup() string { return fmt.Sprintf("/stormdock-e2e-%d", os.Getpid()) }

func newHarness(t testing.TB, session time.Duration) *harness {
	t.Helper()
	testenv.Cgroups(t)
	h := &harness{t: t, zk: zktest.Start(t, zktest.Options{TickTime: 250 * time.Millisecond})}
	h.init(session)
	return h
}

// newEnsembleHarness is a harness on a ZooKeeper ensemble of n servers of its own.
func newEnsembleHarness(t testing.TB, n int, session time.Duration) *harness {
	t.Helper()
	testenv.Cgroups(t)
	h := &harness{t: t, ens: zktest.StartEnsemble(t, n, zktest.Options{TickTime: 250 * time.Millisecond})}
	h.init(session)
	return h
}

func (h *harness) init(session time.Duration) {
	t := h.t
	h.chroot, h.dir, h.session = "/e2e", t.TempDir(), session
	h.cgroup = testCgroup()
	h.masters, h.agents = map[string]*proc{}, map[string]*proc{}
	// Agents run their workers as nobody: let them reach their leases in h.dir, as they
	// would in /var/lib (files in it stay the owner's).
	for d := h.dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := coord.Open(ctx, h.storeURL(), coord.Options{SessionTimeout: 4 * time.Second, Dialer: h.dialer})
	if err != nil {
		t.Fatal(err)
	}
	h.store = s
	t.Cleanup(h.stopAll)
}

func (h *harness) storeURL() string {
	if h.ens != nil {
		return h.ens.URL(h.chroot)
	}
	return h.zk.URL(h.chroot)
}

func (h *harness) start(name string, args ...string) *proc {
	h.t.Helper()
	logPath := filepath.Join(h.dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	if h.command != nil {
		cmd = h.command(name, args)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), "STORMDOCK_DATA="+filepath.Join(h.dir, "data"))
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	p := &proc{name: name, args: args, cmd: cmd, log: lf, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startMaster runs `stormdock master` and returns its API URL; extra flags are added at the
// end.
func (h *harness) startMaster(id string, extra ...string) string {
	addr := freeAddr(h.t)
	p := h.start("master-"+id, append([]string{"master", "--store", h.storeURL(), "--api", addr, "--id", id,
		"--session-timeout", h.session.String(), "--data", filepath.Join(h.dir, "data")}, extra...)...)
	h.mu.Lock()
	h.masters[id] = p
	h.mu.Unlock()
	return "http://" + addr
}

// startAgent runs `stormdock agent` for one node; extra flags are added at the end.
func (h *harness) startAgent(id, dc, rack string, slots int, extra ...string) {
	// Every node of these clusters shares one host: each gets ports of its own for its
	// workers (routers listen on theirs).
	h.mu.Lock()
	base := h.portBase(id)
	h.mu.Unlock()
	args := []string{"agent", "--store", h.storeURL(), "--node-id", id, "--dc", dc, "--rack", rack, "--port-base", fmt.Sprint(base),
		"--slots", fmt.Sprint(slots), "--memory", "8Gi", "--cpu", "8", "--session-timeout", h.session.String(),
		"--heartbeat", "500ms", "--state-dir", filepath.Join(h.dir, "agent-"+id), "--cgroup-parent", h.cgroup + "/" + id,
		"--metrics", "off"}
	p := h.start("agent-"+id, append(args, extra...)...)
	h.mu.Lock()
	h.agents[id] = p
	h.mu.Unlock()
}

// portBase gives each node id a range of 50 ports of its own, kept across restarts; h.mu is
// held.
func (h *harness) portBase(id string) int {
	if h.ports == nil {
		h.ports = map[string]int{}
	}
	if _, ok := h.ports[id]; !ok {
		// Below 32768, where Linux picks ephemeral ports: an outgoing connection never takes
		// a port a worker is about to listen on.
		h.ports[id] = 10000 + 50*len(h.ports) + 1000*(os.Getpid()%22)
	}
	return h.ports[id]
}

// keeperPID is the pid of node id's keeper process (0 when none runs): the process that
// holds the node's session and its workers' leases across agent restarts.
func (h *harness) keeperPID(id string) int {
	b, err := os.ReadFile(filepath.Join(h.dir, "agent-"+id, "keeper.json"))
	if err != nil {
		return 0
	}
	var st agents.KeeperStatus
	if json.Unmarshal(b, &st) != nil || st.PID <= 0 || !alive(st.PID) {
		return 0
	}
	return st.PID
}

// killNode kills a node as a machine dies: its agent and its keeper at once (its workers are
// left to their leases).
func (h *harness) killNode(id string) {
	h.mu.Lock()
	p := h.agents[id]
	h.mu.Unlock()
	if pid := h.keeperPID(id); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.kill()
}

// killMachine kills a node as a dead machine: its agent, its keeper and every worker at
// once (killNode leaves the workers to their leases).
func (h *harness) killMachine(id string) {
	h.killNode(id)
	killCgroupTree(h.cgroup + "/" + id)
}

// signalNode sends sig to every stormdock process of a node but its workers: the agent and
// its keeper (SIGSTOP cuts the node off from the store as a partition would).
func (h *harness) signalNode(id string, sig syscall.Signal) {
	h.mu.Lock()
	p := h.agents[id]
	h.mu.Unlock()
	if pid := h.keeperPID(id); pid != 0 {
		_ = syscall.Kill(pid, sig)
	}
	_ = p.cmd.Process.Signal(sig)
}

// kill sends SIGKILL to a process and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (h *harness) stopAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.masters {
		p.kill()
	}
	for id, p := range h.agents {
		// Its workers are killed below with the cgroups.
		if pid := h.keeperPID(id); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		p.kill()
	}
	killCgroupTree(h.cgroup)
	if h.store != nil {
		h.store.Close()
	}
	if h.t.Failed() {
		names := []string{"master-m1", "master-m2"}
		for id := range h.agents {
			names = append(names, "agent-"+id)
		}
		for _, name := range names {
			b, _ := os.ReadFile(filepath.Join(h.dir, name+".log"))
			h.t.Logf("%s log (tail):\n%s", name, tail(b, 3000))
		}
		for id := range h.agents {
			b, _ := os.ReadFile(filepath.Join(h.dir, "agent-"+id, "keeper.log"))
			h.t.Logf("keeper of %s log (tail):\n%s", id, tail(b, 2000))
			logs, _ := filepath.Glob(filepath.Join(h.dir, "agent-"+id, "process", "logs", "*router*"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				h.t.Logf("%s (tail):\n%s", l, tail(b, 2500))
			}
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// killCgroupTree kills every process under a cgroup parent and removes the cgroups, in every
// v1 hierarchy or the v2 one, whatever state the test left them in.
func killCgroupTree(parent string) {
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, m := range append(mounts, "/sys/fs/cgroup") {
		root := filepath.Join(m, parent)
		var dirs []string
		_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			for range 50 {
				b, _ := os.ReadFile(filepath.Join(dirs[i], "cgroup.procs"))
				pids := strings.Fields(string(b))
				for _, pid := range pids {
					var n int
					fmt.Sscan(pid, &n)
					_ = syscall.Kill(n, syscall.SIGKILL)
				}
				if os.Remove(dirs[i]) == nil || len(pids) == 0 {
					break
				}
				// A last-resort cleanup, also after the test failed: retry while the kernel
				// tears the killed processes down.
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// client returns an admin API client for the master at url, reading the admin token the
// first master wrote.
func (h *harness) client(url string) *api.Client {
	h.t.Helper()
	var tok []byte
	testenv.Eventually(h.t, "admin token", 10*time.Second, func() bool {
		var err error
		tok, err = os.ReadFile(filepath.Join(h.dir, "data", api.AdminTokenFile))
		return err == nil
	})
	c, err := api.NewClient(url, strings.TrimSpace(string(tok)))
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// reconciles reads how many reconciles the master at url has finished, from its /metrics.
func reconciles(t testing.TB, url string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "stormdock_master_reconcile_duration_seconds_count "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s/metrics: %q: %v", url, sc.Text(), err)
			}
			return n
		}
	}
	t.Fatalf("%s/metrics: no stormdock_master_reconcile_duration_seconds_count (%v)", url, sc.Err())
	return 0
}

// assignmentVersions maps each node to the version of its assignment entry: a master that
// writes an assignment changes it.
func (h *harness) assignmentVersions() map[string]int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names, err := h.store.Children(ctx, cluster.AssignmentsKey)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]int64{}
	for _, n := range names {
		e, err := h.store.Get(ctx, cluster.AssignmentsKey+"/"+n)
		if err != nil {
			h.t.Fatal(err)
		}
		out[n] = e.Version
	}
	return out
}

// nodeRecords reads every live node's record from the store.
func (h *harness) nodeRecords() map[string]cluster.NodeRecord {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]cluster.NodeRecord{}
	names, err := h.store.Children(ctx, cluster.NodesKey)
	if err != nil {
		return out
	}
	for _, n := range names {
		e, err := h.store.Get(ctx, cluster.NodesKey+"/"+n)
		if err != nil {
			continue
		}
		var rec cluster.NodeRecord
		if json.Unmarshal(e.Value, &rec) == nil {
			out[n] = rec
		}
	}
	return out
}

// running maps each running worker to its node and pid as the agents report them.
func (h *harness) running(job string) map[cluster.WorkerKey]workerAt {
	out := map[cluster.WorkerKey]workerAt{}
	for node, rec := range h.nodeRecords() {
		for _, w := range rec.Workers {
			if w.Key.Job == job && w.State == cluster.WorkerRunning {
				out[w.Key] = workerAt{node: node, pid: w.PID}
			}
		}
	}
	return out
}

type workerAt struct {
	node string
	pid  int
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

func jobSpec(name string, workers int) []byte {
	return []byte(fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount]
placement: {spread: [dc, rack]}
gracePeriod: 2s
`, name, workers))
}
