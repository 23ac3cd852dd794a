package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestDaemonsWaitForTheStore: a master and an agent started while their ZooKeeper is down
// wait for it (each says so in its log, the master's /v1/health answers 503 with what it
// waits for) instead of exiting; once ZooKeeper starts they become healthy, without a
// restart, and a job runs. The agent's docker engine does not answer either: it offers
// process isolation alone, says why, and offers docker too once the engine answers.
func TestDaemonsWaitForTheStore(t *testing.T) {
	testenv.DockerSocket(t)
	h := newHarness(t, 2*time.Second)
	h.ZK.Stop()
	url := h.StartMaster("m1")
	dockerSock := filepath.Join(t.TempDir(), "docker.sock")
	h.StartAgent("n1", "dc-a", "r1", 4, "--isolation", "process,docker", "--docker-host", "unix://"+dockerSock)
	master, agent := h.Master("m1"), h.Agent("n1")
	for _, p := range []*clustertest.Proc{master, agent} {
		waitsForStore(t, h, p)
	}
	testenv.EventuallyWith(t, "the master's /v1/health says it waits", 30*time.Second, func() (bool, string) {
		resp, err := http.Get(url + "/v1/health")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var hl api.Health
		_ = json.NewDecoder(resp.Body).Decode(&hl)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(hl.Waiting, "store"),
			fmt.Sprintf("%d %+v", resp.StatusCode, hl)
	})

	h.ZK.Restart()
	ctx := context.Background()
	var cl *api.Client
	testenv.Eventually(t, "the admin token made", 60*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(h.Dir, "data", api.AdminTokenFile))
		return err == nil
	})
	cl = h.AdminClient(url)
	testenv.EventuallyWith(t, "the master healthy, with the node", 60*time.Second, func() (bool, string) {
		hl, err := cl.Health(ctx)
		if err != nil {
			return false, err.Error()
		}
		ns, err := cl.Nodes(ctx)
		return err == nil && hl.Leader && hl.Waiting == "" && len(ns) == 1, fmt.Sprintf("%+v, %d nodes, %v", hl, len(ns), err)
	})
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	(&outageCluster{h: h, job: "wc", workers: 2}).waitWorkers(t, 2)

	// The docker engine, reached through a socket that answers from now on.
	if n, _ := nodeView(ctx, cl, "n1"); slices.Contains(n.Isolation, cluster.IsolationDocker) {
		t.Fatalf("node n1 offers docker with no engine: %v", n.Isolation)
	}
	if b, _ := os.ReadFile(filepath.Join(h.Dir, "agent-n1.log")); !strings.Contains(string(b), "the docker engine does not answer") {
		t.Errorf("the agent does not say why it offers no docker: %s", logTail(h, "agent-n1"))
	}
	dockerProxy(t, dockerSock)
	testenv.EventuallyWith(t, "node n1 offers docker once its engine answers", 90*time.Second, func() (bool, string) {
		n, _ := nodeView(ctx, cl, "n1")
		return slices.Contains(n.Isolation, cluster.IsolationDocker), fmt.Sprint(n.Isolation)
	})
	for _, p := range []*clustertest.Proc{master, agent} {
		select {
		case <-p.Done:
			t.Errorf("%s exited: %s", p.Name, logTail(h, p.Name))
		default:
		}
		if p != h.Master("m1") && p != h.Agent("n1") {
			t.Errorf("%s was started again", p.Name)
		}
	}
}

// TestDaemonsStopWithTheStoreAway: with the store paused (SIGSTOP of the ZooKeeper server:
// connections open, nothing answers) a master, an agent and its keeper sent SIGTERM each
// exit, and the keeper's workers stop with their leases; a master, an agent and a keeper
// started while the store is gone (nothing listens) wait, and exit on SIGTERM too.
func TestDaemonsStopWithTheStoreAway(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	url := h.StartMaster("m1")
	h.StartAgent("n1", "dc-a", "r1", 4, "--restart-grace", "30s")
	cl := h.AdminClient(url)
	ctx := context.Background()
	testenv.Eventually(t, "1 node", 30*time.Second, func() bool { ns, err := cl.Nodes(ctx); return err == nil && len(ns) == 1 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	workers := (&outageCluster{h: h, job: "wc", workers: 2}).waitWorkers(t, 2)
	keeper := h.KeeperPID("n1")
	if keeper == 0 {
		t.Fatal("no keeper process")
	}

	h.ZK.Pause()
	defer h.ZK.Resume()
	start := time.Now()
	_ = h.Master("m1").Cmd.Process.Signal(syscall.SIGTERM)
	_ = h.Agent("n1").Cmd.Process.Signal(syscall.SIGTERM)
	// The agent's SIGTERM leaves the keeper holding the workers for the restart grace; the
	// keeper's own SIGTERM (a machine shutting down) retires the node.
	_ = syscall.Kill(keeper, syscall.SIGTERM)
	for _, p := range []*clustertest.Proc{h.Master("m1"), h.Agent("n1")} {
		testenv.EventuallyWith(t, p.Name+" exited after SIGTERM with the store paused", 60*time.Second, func() (bool, string) {
			select {
			case <-p.Done:
				return true, ""
			default:
				return false, logTail(h, p.Name)
			}
		})
		t.Logf("figure: %s exited %s after SIGTERM, the store paused", p.Name, time.Since(start).Round(time.Millisecond))
	}
	testenv.EventuallyWith(t, "the workers stopped", 60*time.Second, func() (bool, string) {
		alive := 0
		for _, w := range workers {
			if clustertest.Alive(w.pid) {
				alive++
			}
		}
		return alive == 0, fmt.Sprintf("%d of %d alive", alive, len(workers))
	})
	t.Logf("figure: the keeper's workers stopped %s after SIGTERM, the store paused", time.Since(start).Round(time.Millisecond))
	testenv.EventuallyWith(t, "the keeper exited after SIGTERM with the store paused", 90*time.Second, func() (bool, string) {
		return !clustertest.Alive(keeper), logTail(h, "agent-n1")
	})
	t.Logf("figure: the keeper exited %s after SIGTERM, the store paused", time.Since(start).Round(time.Millisecond))

	// The store gone: nothing listens. A master, an agent and a keeper started then wait for
	// it, and stop when told, with exit code 0.
	h.ZK.Resume()
	h.ZK.Stop()
	h.StartMaster("m2")
	h.StartAgent("n2", "dc-a", "r2", 4)
	waiting := []*clustertest.Proc{h.Master("m2"), h.Agent("n2"),
		h.Start("keeper-gone", "keeper", "--store", h.StoreURL(), "--node-id", "n3", "--state-dir", t.TempDir(),
			"--session-timeout", "2s", "--restart-grace", "30s", "--store-silence", "2s")}
	for _, p := range waiting {
		waitsForStore(t, h, p)
	}
	start = time.Now()
	for _, p := range waiting {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range waiting {
		testenv.EventuallyWith(t, p.Name+", waiting, exited after SIGTERM", 30*time.Second, func() (bool, string) {
			select {
			case <-p.Done:
				return p.Cmd.ProcessState.ExitCode() == 0, fmt.Sprintf("exit %d: %s", p.Cmd.ProcessState.ExitCode(), logTail(h, p.Name))
			default:
				return false, logTail(h, p.Name)
			}
		})
		t.Logf("figure: %s, waiting for a store that is gone, exited %s after SIGTERM", p.Name, time.Since(start).Round(time.Millisecond))
	}
}

// waitsForStore waits until a process says in its log that it waits for the store, failing
// the test if it exits instead.
func waitsForStore(t *testing.T, h *harness, p *clustertest.Proc) {
	t.Helper()
	testenv.EventuallyWith(t, p.Name+" says it waits for the store", 60*time.Second, func() (bool, string) {
		select {
		case <-p.Done:
			t.Fatalf("%s exited while the store was away: %s", p.Name, logTail(h, p.Name))
		default:
		}
		b, _ := os.ReadFile(filepath.Join(h.Dir, p.Name+".log"))
		return strings.Contains(string(b), "waiting for the store"), logTail(h, p.Name)
	})
}

// logTail is the end of a process's log, for a failure's message.
func logTail(h *harness, name string) string {
	b, _ := os.ReadFile(filepath.Join(h.Dir, name+".log"))
	return clustertest.Tail(b, 1500)
}

// dockerProxy serves the machine's docker engine on a unix socket at path until the test ends.
func dockerProxy(t *testing.T, path string) {
	engine := "/var/run/docker.sock"
	if h, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok {
		engine = h
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	keep := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e, err := net.Dial("unix", engine)
			if err != nil {
				c.Close()
				continue
			}
			keep(c)
			keep(e)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(e, c)
				e.Close()
			}()
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, e)
				c.Close()
			}()
		}
	}()
}
