package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
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

// Proc is one stormdock process of a Cluster.
type Proc struct {
	Name string
	Args []string
	Cmd  *exec.Cmd
	// Done is closed when the process has exited.
	Done chan struct{}
}

// Kill sends SIGKILL to the process and waits for it.
func (p *Proc) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.Done
}

// Cluster is a cluster of stormdock processes (masters, agents and what they start) on a
// ZooKeeper server or ensemble of the test's own. Set the exported fields a test needs
// before Init; New and NewEnsemble do both for a cluster on this machine's own network.
type Cluster struct {
	T testing.TB
	// Binary is the stormdock binary every process runs.
	Binary string
	// ZK is the cluster's ZooKeeper server, or Ens its ensemble.
	ZK  *zktest.Server
	Ens *zktest.Ensemble
	// Chroot is the cluster's path in ZooKeeper; Dir holds its processes' logs, data and
	// state; Session is every process's store session timeout.
	Chroot, Dir string
	Session     time.Duration
	// Cgroup is the cgroup parent of every worker of the cluster's nodes.
	Cgroup string
	// SinkDir is the --sink-dir of every master and agent (Dir/sinks): a mirrored job's
	// file sink goes below SinkDir/<tenant>/ (SinkPath).
	SinkDir string
	// Command, when set, makes the command of a process by its name (a lab cluster runs
	// each in its host's network); Dialer, when set, connects the test's own store client.
	Command func(name string, args []string) *exec.Cmd
	Dialer  func(network, addr string, timeout time.Duration) (net.Conn, error)
	// Store is the test's own admin client of the cluster's store.
	Store coord.Store

	mu      sync.Mutex
	masters map[string]*Proc
	agents  map[string]*Proc
	ports   map[string]int // each node's port base
}

// TestCgroup is the cgroup parent of every worker this test process's clusters run.
func TestCgroup() string { return fmt.Sprintf("/stormdock-e2e-%d", os.Getpid()) }

// New is a cluster on a standalone ZooKeeper server of its own, its processes running
// binary; it starts none of them.
func New(t testing.TB, binary string, session time.Duration) *Cluster {
	t.Helper()
	testenv.Cgroups(t)
	c := &Cluster{T: t, Binary: binary, ZK: zktest.Start(t, zktest.Options{TickTime: 250 * time.Millisecond})}
	c.Init(session)
	return c
}

// NewTLS is New on a ZooKeeper server that serves TLS only (zks://): the test's own client
// trusts its CA (StoreCA); the processes are given it by the test (--store-ca).
func NewTLS(t testing.TB, binary string, session time.Duration) *Cluster {
	t.Helper()
	testenv.Cgroups(t)
	c := &Cluster{T: t, Binary: binary, ZK: zktest.Start(t, zktest.Options{TickTime: 250 * time.Millisecond, TLS: true})}
	c.Init(session)
	return c
}

// StoreCA is the CA file of the cluster's TLS ZooKeeper server, "" for a plain one.
func (c *Cluster) StoreCA() string {
	if c.ZK != nil {
		return c.ZK.CAFile()
	}
	return ""
}

// NewEnsemble is a cluster on a ZooKeeper ensemble of n servers of its own.
func NewEnsemble(t testing.TB, binary string, n int, session time.Duration) *Cluster {
	t.Helper()
	testenv.Cgroups(t)
	c := &Cluster{T: t, Binary: binary, Ens: zktest.StartEnsemble(t, n, zktest.Options{TickTime: 250 * time.Millisecond})}
	c.Init(session)
	return c
}

// Init readies a cluster whose ZooKeeper (and Command, Dialer) is set: its directory, its
// cgroup and the test's store client. Every process is killed when the test ends.
func (c *Cluster) Init(session time.Duration) {
	t := c.T
	c.Chroot, c.Dir, c.Session = "/e2e", t.TempDir(), session
	c.Cgroup = TestCgroup()
	c.SinkDir = filepath.Join(c.Dir, "sinks")
	c.masters, c.agents = map[string]*Proc{}, map[string]*Proc{}
	// Agents run their workers as nobody: let them reach their leases in c.Dir, as they
	// would in /var/lib (files in it stay the owner's).
	for d := c.Dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := coord.Open(ctx, c.StoreURL(), coord.Options{SessionTimeout: 4 * time.Second, Dialer: c.Dialer,
		TLS: coord.TLSFiles{CA: c.StoreCA()}})
	if err != nil {
		t.Fatal(err)
	}
	c.Store = s
	t.Cleanup(c.stopAll)
}

// StoreURL is the store URL the cluster's processes are given.
func (c *Cluster) StoreURL() string {
	if c.Ens != nil {
		return c.Ens.URL(c.Chroot)
	}
	return c.ZK.URL(c.Chroot)
}

// Start runs the binary with args as a process of the cluster named name, its output
// appended to Dir/NAME.log.
func (c *Cluster) Start(name string, args ...string) *Proc {
	c.T.Helper()
	logPath := filepath.Join(c.Dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.T.Fatal(err)
	}
	cmd := exec.Command(c.Binary, args...)
	if c.Command != nil {
		cmd = c.Command(name, args)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), "STORMDOCK_DATA="+filepath.Join(c.Dir, "data"))
	if err := cmd.Start(); err != nil {
		c.T.Fatal(err)
	}
	p := &Proc{Name: name, Args: args, Cmd: cmd, Done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(p.Done)
	}()
	return p
}

// FreeAddr is a loopback address no one listens on at the moment.
func FreeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// StartMaster runs `stormdock master` and returns its API URL; extra flags are added at the
// end.
func (c *Cluster) StartMaster(id string, extra ...string) string {
	addr := FreeAddr(c.T)
	p := c.Start("master-"+id, append([]string{"master", "--store", c.StoreURL(), "--api", addr, "--id", id,
		"--session-timeout", c.Session.String(), "--data", filepath.Join(c.Dir, "data"), "--sink-dir", c.SinkDir}, extra...)...)
	c.SetMaster(id, p)
	return "http://" + addr
}

// StartAgent runs `stormdock agent` for one node; extra flags are added at the end.
func (c *Cluster) StartAgent(id, dc, rack string, slots int, extra ...string) {
	// Every node of these clusters shares one host: each gets ports of its own for its
	// workers (routers listen on theirs).
	c.mu.Lock()
	base := c.portBase(id)
	c.mu.Unlock()
	args := []string{"agent", "--store", c.StoreURL(), "--node-id", id, "--dc", dc, "--rack", rack, "--port-base", fmt.Sprint(base),
		"--slots", fmt.Sprint(slots), "--memory", "8Gi", "--cpu", "8", "--session-timeout", c.Session.String(),
		"--heartbeat", "500ms", "--state-dir", c.StateDir(id), "--cgroup-parent", c.Cgroup + "/" + id,
		"--metrics", "off", "--sink-dir", c.SinkDir}
	p := c.Start("agent-"+id, append(args, extra...)...)
	c.mu.Lock()
	c.agents[id] = p
	c.mu.Unlock()
}

// SinkPath is where a file sink of tenant named name goes: SinkDir/<tenant>/name.
func (c *Cluster) SinkPath(tenant, name string) string { return filepath.Join(c.SinkDir, tenant, name) }

// StateDir is node id's agent state directory.
func (c *Cluster) StateDir(id string) string { return filepath.Join(c.Dir, "agent-"+id) }

// Master is the process of master id (nil when none was started).
func (c *Cluster) Master(id string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.masters[id]
}

// SetMaster records p as master id's process, killed with the cluster.
func (c *Cluster) SetMaster(id string, p *Proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.masters[id] = p
}

// Masters is every master's process, by id.
func (c *Cluster) Masters() map[string]*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return copyProcs(c.masters)
}

// Agent is the agent process of node id (nil when none was started).
func (c *Cluster) Agent(id string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agents[id]
}

// Agents is every node's agent process, by node id.
func (c *Cluster) Agents() map[string]*Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return copyProcs(c.agents)
}

func copyProcs(m map[string]*Proc) map[string]*Proc {
	out := make(map[string]*Proc, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// portBase gives each node id a range of 50 ports of its own, kept across restarts; c.mu is
// held.
func (c *Cluster) portBase(id string) int {
	if c.ports == nil {
		c.ports = map[string]int{}
	}
	if _, ok := c.ports[id]; !ok {
		// Below 32768, where Linux picks ephemeral ports: an outgoing connection never takes
		// a port a worker is about to listen on.
		c.ports[id] = 10000 + 50*len(c.ports) + 1000*(os.Getpid()%22)
	}
	return c.ports[id]
}

// KeeperPID is the pid of node id's keeper process (0 when none runs): the process that
// holds the node's session and its workers' leases across agent restarts.
func (c *Cluster) KeeperPID(id string) int {
	b, err := os.ReadFile(filepath.Join(c.StateDir(id), "keeper.json"))
	if err != nil {
		return 0
	}
	var st agents.KeeperStatus
	if json.Unmarshal(b, &st) != nil || st.PID <= 0 || !Alive(st.PID) {
		return 0
	}
	return st.PID
}

// KillNode kills a node as a machine dies: its agent and its keeper at once (its workers are
// left to their leases).
func (c *Cluster) KillNode(id string) {
	p := c.Agent(id)
	if pid := c.KeeperPID(id); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.Kill()
}

// KillMachine kills a node as a dead machine: its agent, its keeper and every worker at
// once (KillNode leaves the workers to their leases).
func (c *Cluster) KillMachine(id string) {
	c.KillNode(id)
	KillCgroupTree(c.Cgroup + "/" + id)
}

// SignalNode sends sig to every stormdock process of a node but its workers: the agent and
// its keeper (SIGSTOP cuts the node off from the store as a partition would).
func (c *Cluster) SignalNode(id string, sig syscall.Signal) {
	p := c.Agent(id)
	if pid := c.KeeperPID(id); pid != 0 {
		_ = syscall.Kill(pid, sig)
	}
	_ = p.Cmd.Process.Signal(sig)
}

func (c *Cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.masters {
		p.Kill()
	}
	for id, p := range c.agents {
		// Its workers are killed below with the cgroups.
		if pid := c.KeeperPID(id); pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		p.Kill()
	}
	KillCgroupTree(c.Cgroup)
	if c.Store != nil {
		c.Store.Close()
	}
	if c.T.Failed() {
		names := []string{"master-m1", "master-m2"}
		for id := range c.agents {
			names = append(names, "agent-"+id)
		}
		for _, name := range names {
			b, _ := os.ReadFile(filepath.Join(c.Dir, name+".log"))
			c.T.Logf("%s log (tail):\n%s", name, Tail(b, 3000))
		}
		for id := range c.agents {
			b, _ := os.ReadFile(filepath.Join(c.StateDir(id), "keeper.log"))
			c.T.Logf("keeper of %s log (tail):\n%s", id, Tail(b, 2000))
			logs, _ := filepath.Glob(filepath.Join(c.StateDir(id), "process", "logs", "*router*"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				c.T.Logf("%s (tail):\n%s", l, Tail(b, 2500))
			}
		}
	}
}

// Tail is the last n bytes of b.
func Tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// KillCgroupTree kills every process under a cgroup parent and removes the cgroups, in every
// v1 hierarchy or the v2 one, whatever state the test left them in.
func KillCgroupTree(parent string) {
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

// AdminClient returns an admin API client for the master at url, reading the admin token
// the first master wrote into the cluster's data directory.
func (c *Cluster) AdminClient(url string) *api.Client {
	c.T.Helper()
	return AdminClient(c.T, filepath.Join(c.Dir, "data"), url)
}

// AdminClient returns an admin API client for the master at url, with the admin token a
// master wrote into dataDir (waited for: a master writes it when it starts).
func AdminClient(t testing.TB, dataDir, url string) *api.Client {
	t.Helper()
	var tok []byte
	testenv.Eventually(t, "admin token", 10*time.Second, func() bool {
		var err error
		tok, err = os.ReadFile(filepath.Join(dataDir, api.AdminTokenFile))
		return err == nil
	})
	cl, err := api.NewClient(url, strings.TrimSpace(string(tok)))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// MetricsToken returns the scrape token the first master wrote into the cluster's data
// directory: /metrics (masters', agents', routers') wants it as a bearer token.
func (c *Cluster) MetricsToken() string {
	c.T.Helper()
	return MetricsToken(c.T, filepath.Join(c.Dir, "data"))
}

// MetricsToken returns the scrape token a master wrote into dataDir (waited for: a master
// writes it when it starts).
func MetricsToken(t testing.TB, dataDir string) string {
	t.Helper()
	var tok []byte
	testenv.Eventually(t, "scrape token", 10*time.Second, func() bool {
		var err error
		tok, err = os.ReadFile(filepath.Join(dataDir, api.MetricsTokenFile))
		return err == nil && len(tok) > 0
	})
	return strings.TrimSpace(string(tok))
}

// AssignmentVersions maps each node to the version of its assignment entry: a master that
// writes an assignment changes it.
func (c *Cluster) AssignmentVersions() map[string]int64 {
	c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names, err := c.Store.Children(ctx, cluster.AssignmentsKey)
	if err != nil {
		c.T.Fatal(err)
	}
	out := map[string]int64{}
	for _, n := range names {
		e, err := c.Store.Get(ctx, cluster.AssignmentsKey+"/"+n)
		if err != nil {
			c.T.Fatal(err)
		}
		out[n] = e.Version
	}
	return out
}

// NodeRecords reads every live node's record from the store.
func (c *Cluster) NodeRecords() map[string]cluster.NodeRecord {
	c.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := map[string]cluster.NodeRecord{}
	names, err := c.Store.Children(ctx, cluster.NodesKey)
	if err != nil {
		return out
	}
	for _, n := range names {
		e, err := c.Store.Get(ctx, cluster.NodesKey+"/"+n)
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

// WorkerAt is where a running worker runs, as its agent reports it.
type WorkerAt struct {
	Node string
	PID  int
}

// Running maps each running worker of job to its node and pid as the agents report them.
func (c *Cluster) Running(job string) map[cluster.WorkerKey]WorkerAt {
	out := map[cluster.WorkerKey]WorkerAt{}
	for node, rec := range c.NodeRecords() {
		for _, w := range rec.Workers {
			if w.Key.Job == job && w.State == cluster.WorkerRunning {
				out[w.Key] = WorkerAt{Node: node, PID: w.PID}
			}
		}
	}
	return out
}

// Children lists the children of process pid, from /proc: those of each of its threads
// (a Go program forks from whichever thread runs the goroutine).
func Children(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// Alive reports whether a process exists and is not a zombie.
func Alive(pid int) bool {
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
