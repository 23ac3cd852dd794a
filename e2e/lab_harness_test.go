package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// labCluster is a stormdock cluster spread over the hosts of a network lab (internal/netlab):
// ZooKeeper on hosts of its own (one standalone server or an ensemble of three), each master
// on a host of its own, each node's agent on a host of its own (its keeper and workers, which
// it starts, share its host). Every address a process gives to others is a lab address; the
// test reaches them through the lab's control host.
type labCluster struct {
	*harness
	lab     *netlab.Lab
	zkHosts []*netlab.Host
	nodes   []labNode
	spec    labSpec

	mu    sync.Mutex
	hosts map[string]*netlab.Host // by process name: master-m1, agent-a1
	apis  map[string]string       // master id -> API URL
}

// labNode is one node of a lab cluster: an agent on a host of its own.
type labNode struct {
	id, dc, rack string
	host         *netlab.Host
}

// labSpec says what a lab cluster is made of.
type labSpec struct {
	zkServers int      // 1: a standalone server, 3: an ensemble
	masters   []string // master ids, each on a host of its own
	dcs       []string // data centers, each with perDC nodes (one rack each)
	perDC     int
	slots     int
	session   time.Duration
	// reregisterGrace is the masters' --reregister-grace: short, so that a node cut soon
	// after a master starts leading is handled as it would be later. At least twice the
	// session: a keeper holds its leases that long after a store outage it saw.
	reregisterGrace time.Duration
	// agentArgs are added to every agent's flags (--isolation docker, say).
	agentArgs []string
}

// labMasterPort is the port of every master's API, on its host's address.
const labMasterPort = 7070

// newLabCluster builds the lab's hosts, starts ZooKeeper, the masters and the agents on them,
// and waits until every node is registered.
func newLabCluster(t *testing.T, spec labSpec) *labCluster {
	t.Helper()
	testenv.Cgroups(t)
	sweepDeadCgroups()
	lab := netlab.ForTest(t)
	lc := &labCluster{lab: lab, spec: spec, hosts: map[string]*netlab.Host{}, apis: map[string]string{}}

	zkNames := make([]string, spec.zkServers)
	for i := range zkNames {
		zkNames[i] = fmt.Sprintf("zk%d", i+1)
	}
	lc.zkHosts = lab.AddHosts(t, zkNames...)
	zkHosts := make([]zktest.Host, len(lc.zkHosts))
	for i, h := range lc.zkHosts {
		zkHosts[i] = h
	}
	opts := zktest.Options{TickTime: 250 * time.Millisecond, Hosts: zkHosts, Dial: lab.DialContext}
	h := &harness{&clustertest.Cluster{T: t, Binary: binary, Dialer: lab.Dialer()}}
	if spec.zkServers == 1 {
		h.ZK = zktest.Start(t, opts)
	} else {
		h.Ens = zktest.StartEnsemble(t, spec.zkServers, opts)
	}
	h.Command = func(name string, args []string) *exec.Cmd {
		lc.mu.Lock()
		host := lc.hosts[name]
		lc.mu.Unlock()
		if host == nil {
			host = lab.Host("ctl") // the CLI, run by the test from the lab's control host
		}
		return host.Command(binary, args...)
	}
	h.Init(spec.session)
	lc.harness = h
	if dir := os.Getenv("STORMDOCK_LAB_LOGS"); dir != "" {
		t.Cleanup(func() { keepLogs(t, h.Dir, filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))) })
	}

	for _, id := range spec.masters {
		host := lab.AddHosts(t, id)[0]
		lc.mu.Lock()
		lc.hosts["master-"+id] = host
		lc.mu.Unlock()
		lc.StartMaster(id)
	}
	for _, dc := range spec.dcs {
		for i := 1; i <= spec.perDC; i++ {
			id := fmt.Sprintf("%s%d", strings.TrimPrefix(dc, "dc-"), i)
			n := labNode{id: id, dc: dc, rack: fmt.Sprintf("r%d", i), host: lab.AddHosts(t, id)[0]}
			lc.nodes = append(lc.nodes, n)
			lc.mu.Lock()
			lc.hosts["agent-"+id] = n.host
			lc.mu.Unlock()
			lc.StartAgent(n)
		}
	}
	testenv.EventuallyWith(t, fmt.Sprintf("%d nodes registered", len(lc.nodes)), 60*time.Second, func() (bool, string) {
		n := len(h.NodeRecords())
		return n == len(lc.nodes), fmt.Sprintf("%d registered", n)
	})
	return lc
}

// startMaster runs a master on its host, its API on the host's address.
func (lc *labCluster) StartMaster(id string) {
	lc.mu.Lock()
	host := lc.hosts["master-"+id]
	lc.mu.Unlock()
	addr := net.JoinHostPort(host.IP(), strconv.Itoa(labMasterPort))
	args := []string{"master", "--store", lc.StoreURL(), "--api", addr, "--id", id,
		"--session-timeout", lc.Session.String(), "--data", filepath.Join(lc.Dir, "data"), "--sink-dir", lc.SinkDir}
	if lc.spec.reregisterGrace > 0 {
		args = append(args, "--reregister-grace", lc.spec.reregisterGrace.String())
	}
	p := lc.Start("master-"+id, args...)
	lc.mu.Lock()
	lc.harness.SetMaster(id, p)
	lc.apis[id] = "http://" + addr
	lc.mu.Unlock()
}

// startAgent runs a node's agent on its host, advertising the host's address.
func (lc *labCluster) StartAgent(n labNode) {
	extra := append([]string{"--advertise-addr", n.host.IP()}, lc.spec.agentArgs...)
	if g := lc.spec.reregisterGrace; g > 0 {
		// The keeper's hold after a store outage (the longer of this and two sessions) must
		// end before the masters stop waiting for the node.
		extra = append(extra, "--rejoin-grace", min(agents.DefaultRejoinGrace, g-lc.spec.session/2).String())
	}
	if os.Getenv("STORMDOCK_LAB_DEBUG") != "" {
		extra = append(extra, "--log-level", "debug")
	}
	lc.harness.StartAgent(n.id, n.dc, n.rack, lc.spec.slots, extra...)
}

// node returns a node by id.
func (lc *labCluster) node(id string) labNode {
	for _, n := range lc.nodes {
		if n.id == id {
			return n
		}
	}
	lc.T.Fatalf("no node %s", id)
	return labNode{}
}

// masterHost returns the host a master runs on.
func (lc *labCluster) masterHost(id string) *netlab.Host {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.hosts["master-"+id]
}

// client returns an admin client for a master, connecting through the lab.
func (lc *labCluster) client(id string) *api.Client {
	lc.mu.Lock()
	url := lc.apis[id]
	lc.mu.Unlock()
	cl := lc.harness.AdminClient(url)
	if lc.lab == nil { // a cluster on this machine's own network
		return cl
	}
	return cl.WithDialer(lc.lab.DialContext)
}

// anyMaster calls fn on each master in turn until one succeeds, retrying until the timeout:
// whichever leads (or forwards) takes the request.
func (lc *labCluster) anyMaster(t testing.TB, what string, fn func(ctx context.Context, cl *api.Client) error) {
	t.Helper()
	var last error
	testenv.EventuallyWith(t, what, 60*time.Second, func() (bool, string) {
		for _, id := range lc.spec.masters {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err := fn(ctx, lc.client(id))
			cancel()
			if err == nil {
				return true, ""
			}
			last = err
		}
		return false, fmt.Sprint(last)
	})
}

// leaders returns the masters that say they lead (those that answer within a second).
func (lc *labCluster) leaders() []string {
	var out []string
	for _, id := range lc.spec.masters {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		hl, err := lc.client(id).Health(ctx)
		cancel()
		if err == nil && hl.Leader {
			out = append(out, id)
		}
	}
	return out
}

// submit creates the tenant e2e if needed and submits a job through any master.
func (lc *labCluster) submit(t testing.TB, spec []byte) {
	t.Helper()
	lc.anyMaster(t, "tenant e2e created", func(ctx context.Context, cl *api.Client) error {
		err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"})
		if err != nil && strings.Contains(err.Error(), "exists") {
			return nil
		}
		return err
	})
	lc.anyMaster(t, "job submitted", func(ctx context.Context, cl *api.Client) error {
		_, err := cl.SubmitJob(ctx, spec)
		return err
	})
}

// scale sets a job's worker count through any master.
func (lc *labCluster) scale(t testing.TB, job string, n int) {
	t.Helper()
	lc.anyMaster(t, fmt.Sprintf("%s scaled to %d", job, n), func(ctx context.Context, cl *api.Client) error {
		_, err := cl.ScaleJob(ctx, job, n)
		return err
	})
}

// tryScale sets a job's worker count through any master without failing the test: a case
// that failed puts the job back for the next one.
func (lc *labCluster) tryScale(job string, n int) {
	deadline := time.Now().Add(testenv.Timeout(30 * time.Second))
	for time.Now().Before(deadline) {
		for _, id := range lc.spec.masters {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			_, err := lc.client(id).ScaleJob(ctx, job, n)
			cancel()
			if err == nil {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitRunning waits until n workers of the job run, one process each, from /proc, none on the
// nodes in avoid; it returns them.
func waitRunning(t testing.TB, job string, n int, timeout time.Duration, avoid ...string) map[string]procWorker {
	t.Helper()
	var ps map[string]procWorker
	testenv.EventuallyWith(t, fmt.Sprintf("%d workers of %s running once each, none on %v", n, job, avoid), timeout, func() (bool, string) {
		ps = procsOf(job)
		all := workerProcs(job)
		on := 0
		for _, p := range ps {
			for _, a := range avoid {
				if p.node == a {
					on++
				}
			}
		}
		return len(ps) == n && len(all) == n && on == 0, fmt.Sprintf("%d single, %d in all, %d on %v", len(ps), len(all), on, avoid)
	})
	return ps
}

// keeperStatus reads a node's keeper status file (the agent's state directory).
func (lc *labCluster) keeperStatus(id string) (agents.KeeperStatus, bool) {
	var st agents.KeeperStatus
	b, err := os.ReadFile(filepath.Join(lc.Dir, "agent-"+id, "keeper.json"))
	if err != nil || json.Unmarshal(b, &st) != nil {
		return st, false
	}
	return st, true
}

// leaseStamp is a node's lease stamp: the modification time of the node lease its keeper
// renews (every worker's lease is a link of it), the send time of the last request the store
// answered while the keeper is live.
func (lc *labCluster) leaseStamp(id string) time.Time {
	fi, err := os.Stat(filepath.Join(lc.Dir, "agent-"+id, "leases", ".node"))
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// keepersAnsweredSince waits until every node's keeper is live with a lease stamped after
// since: evidence that the store has answered every node since then (and that a node whose
// session was lost meanwhile has a new one).
func (lc *labCluster) keepersAnsweredSince(t testing.TB, since time.Time, timeout time.Duration) {
	t.Helper()
	testenv.EventuallyWith(t, "every keeper answered by the store since "+since.Format("15:04:05.000"), timeout, func() (bool, string) {
		for _, n := range lc.nodes {
			st, ok := lc.keeperStatus(n.id)
			stamp := lc.leaseStamp(n.id)
			if !ok || st.State != agents.KeeperLive || !stamp.After(since) {
				return false, fmt.Sprintf("%s: %s stamped %s (%v)", n.id, st.State, stamp.Format("15:04:05.000"), ok)
			}
		}
		return true, ""
	})
}

// waitHealthy waits until the masters see every node of ids registered and healthy.
func (lc *labCluster) waitHealthy(t testing.TB, ids ...string) {
	t.Helper()
	lc.anyMaster(t, fmt.Sprintf("nodes %v registered and healthy", ids), func(ctx context.Context, cl *api.Client) error {
		ns, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if !slices.ContainsFunc(ns, func(n api.NodeView) bool { return n.ID == id && n.Health == cluster.HealthHealthy }) {
				return fmt.Errorf("node %s not healthy yet", id)
			}
		}
		return nil
	})
}

// sessions returns each node's keeper session now.
func (lc *labCluster) sessions() map[string]int64 {
	out := map[string]int64{}
	for _, n := range lc.nodes {
		if st, ok := lc.keeperStatus(n.id); ok {
			out[n.id] = st.Session
		}
	}
	return out
}

// sweepDeadCgroups removes the worker cgroups of e2e runs that are gone (a test binary killed
// before its cleanup); netlab.Sweep has killed what ran in their labs.
func sweepDeadCgroups() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/stormdock-e2e-*")
	more, _ := filepath.Glob("/sys/fs/cgroup/stormdock-e2e-*")
	seen := map[string]bool{}
	for _, d := range append(dirs, more...) {
		name := filepath.Base(d)
		pid, err := strconv.Atoi(strings.TrimPrefix(name, "stormdock-e2e-"))
		if err != nil || seen[name] || clustertest.Alive(pid) {
			continue
		}
		seen[name] = true
		clustertest.KillCgroupTree("/" + name)
	}
}

// keepLogs copies the logs of a lab test's processes (theirs and their keepers') to dir, for
// STORMDOCK_LAB_LOGS: the test's own directory goes with the test.
func keepLogs(t testing.TB, from, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keep logs: %v", err)
		return
	}
	logs, _ := filepath.Glob(filepath.Join(from, "*.log"))
	keepers, _ := filepath.Glob(filepath.Join(from, "agent-*", "keeper.log"))
	// Workers' logs (routers' among them), in their agents' state directories.
	workers, _ := filepath.Glob(filepath.Join(from, "agent-*", "*", "*", "*.log*"))
	for _, p := range append(append(logs, keepers...), workers...) {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		name := filepath.Base(p)
		if name == "keeper.log" {
			name = "keeper-" + strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "agent-") + ".log"
		}
		_ = os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	t.Logf("logs kept in %s", dir)
}
