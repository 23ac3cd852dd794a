package docker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
)

func jobSpec(workers int) []byte {
	return fmt.Appendf(nil, `name: wc
tenant: t1
workers: %d
resources: {memory: 16Mi, cpu: 0.05}
command: [stormdock, worker, wordcount, --rate, "5"]
placement: {spread: [rack, node]}
gracePeriod: 2s
`, workers)
}

func apiClient(t testing.TB, p provision.Tokens, c provision.Cluster) *api.Client {
	t.Helper()
	token, err := p.Read(c.Name)
	if err != nil {
		t.Fatal(err)
	}
	path, err := p.Path(c.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("token file %s: %v, mode %v; want 0600", path, err, info.Mode())
	}
	opts, err := p.ClientOptions(c.Name)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewClient(c.API, token, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// placed is where each worker of job wc runs: worker index -> node, pid and restarts.
type placedWorker struct {
	node     string
	pid      int
	restarts int
}

func workers(ctx context.Context, cl *api.Client) (map[int]placedWorker, api.JobSummary, error) {
	st, err := cl.Job(ctx, "wc")
	if err != nil {
		return nil, api.JobSummary{}, err
	}
	out := map[int]placedWorker{}
	for _, w := range st.Workers {
		if w.State == cluster.WorkerRunning {
			out[w.Worker] = placedWorker{node: w.Node, pid: w.PID, restarts: w.Restarts}
		}
	}
	return out, st.Summary, nil
}

// settled waits until all n workers of wc run and no stale copy is left.
func settled(t testing.TB, cl *api.Client, n int, timeout time.Duration) map[int]placedWorker {
	t.Helper()
	var ws map[int]placedWorker
	testenv.EventuallyWith(t, fmt.Sprintf("%d workers of wc running", n), timeout, func() (bool, string) {
		var sum api.JobSummary
		var err error
		ws, sum, err = workers(context.Background(), cl)
		if err != nil {
			return false, err.Error()
		}
		return len(ws) == n && sum.Running == n && sum.Stopping == 0 && sum.Unplaced == 0, fmt.Sprintf("%+v", sum)
	})
	return ws
}

// TestScale runs the whole story on a real dockerd: create 3 agents in 3 racks, run a job,
// scale to 5 (new agents get workers), scale to 2 (the removed agents' workers are re-placed
// first, the kept agents' workers keep their pids), destroy (nothing left).
func TestScale(t *testing.T) {
	p, spec, dc := newProvider(t, 3)
	tokens := provision.Tokens{Dir: p.TokenDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	for i, a := range c.Agents {
		want := spec.SlotAt(i)
		if a.Node != want.Node || a.DC != want.DC || a.Rack != want.Rack || !a.Registered {
			t.Errorf("agent %d = %+v, want %+v registered", i, a, want)
		}
	}
	cl := apiClient(t, tokens, c)
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Labels["isolation/cgroups"] != "false" || n.Memory != spec.AgentMemory-spec.AgentMemory/8 {
			t.Errorf("node %s: labels %v memory %v; want isolation/cgroups=false and 7/8 of the container's memory", n.ID, n.Labels, n.Memory)
		}
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec(3)); err != nil {
		t.Fatal(err)
	}
	before := settled(t, cl, 3, 60*time.Second)

	// Out: two new agents; the job grows onto them (spread over nodes: one worker each).
	c, err = p.Scale(ctx, spec.Name, 5)
	if err != nil {
		t.Fatalf("scale to 5: %v", err)
	}
	if len(c.Agents) != 5 || c.Ready() != 5 {
		t.Fatalf("after scale to 5: %+v", c.Agents)
	}
	if _, err := cl.ScaleJob(ctx, "wc", 5); err != nil {
		t.Fatal(err)
	}
	five := settled(t, cl, 5, 60*time.Second)
	onNew := 0
	for _, w := range five {
		if w.node == spec.SlotAt(3).Node || w.node == spec.SlotAt(4).Node {
			onNew++
		}
	}
	if onNew != 2 {
		t.Errorf("workers on the new agents: %d, want 2: %+v", onNew, five)
	}
	for i, w := range before {
		if five[i] != w {
			t.Errorf("worker %d changed while scaling out: %+v -> %+v", i, w, five[i])
		}
	}

	// In: agents 3, 4 and 5 go; their workers run on agents 1 and 2 before they do.
	kept := []string{spec.SlotAt(0).Node, spec.SlotAt(1).Node}
	c, err = p.Scale(ctx, spec.Name, 2)
	if err != nil {
		t.Fatalf("scale to 2: %v", err)
	}
	if len(c.Agents) != 2 || c.Agents[0].Node != kept[0] || c.Agents[1].Node != kept[1] {
		t.Fatalf("after scale to 2: %+v, want %v", c.Agents, kept)
	}
	// Scale returned after the drain: every worker already runs on a kept agent.
	after, sum, err := workers(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 5 || sum.Running != 5 {
		t.Errorf("right after scale in: %d workers running (%+v), want all 5", len(after), sum)
	}
	for i, w := range after {
		if !slices.Contains(kept, w.node) {
			t.Errorf("worker %d on %s, which was removed", i, w.node)
		}
	}
	for i, w := range five {
		if slices.Contains(kept, w.node) && after[i] != w {
			t.Errorf("worker %d on kept agent %s restarted: %+v -> %+v", i, w.node, w, after[i])
		}
	}
	nodes, err = cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Draining {
			t.Errorf("node %s still draining after scale in", n.ID)
		}
	}

	if err := p.Destroy(ctx, spec.Name); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if left := leftovers(t, dc, spec.Name); len(left) > 0 {
		t.Errorf("destroy left %v", left)
	}
	if path, _ := tokens.Path(spec.Name); !errors.Is(statErr(path), os.ErrNotExist) {
		t.Errorf("token file after destroy: %v", err)
	}
}

// TestCreateFailsCleanly: a create that fails before or half-way leaves nothing behind.
func TestCreateFailsCleanly(t *testing.T) {
	t.Run("MissingImage", func(t *testing.T) {
		p, spec, dc := newProvider(t, 2)
		spec.Image = "stormdock/no-such-image:0"
		_, err := p.Create(context.Background(), spec)
		if !errors.Is(err, provision.ErrUnavailable) || !strings.Contains(err.Error(), "stormdock image build") {
			t.Errorf("create: %v, want ErrUnavailable saying to build the image", err)
		}
		if left := leftovers(t, dc, spec.Name); len(left) > 0 {
			t.Errorf("left %v", left)
		}
	})
	t.Run("AgentCannotStart", func(t *testing.T) {
		p, spec, dc := newProvider(t, 2)
		// The master starts and leads; then every agent exits at once (exit 2).
		spec.AgentArgs = []string{"--no-such-flag"}
		_, err := p.Create(context.Background(), spec)
		if err == nil || !strings.Contains(err.Error(), "exit code") {
			t.Fatalf("create: %v, want the agent's exit", err)
		}
		if left := leftovers(t, dc, spec.Name); len(left) > 0 {
			t.Errorf("left %v", left)
		}
		tokens := provision.Tokens{Dir: p.TokenDir()}
		if path, _ := tokens.Path(spec.Name); !errors.Is(statErr(path), os.ErrNotExist) {
			t.Errorf("token file after a failed create: %v", err)
		}
		// The store's admin token went too: the same cluster can be created again.
		spec.AgentArgs = nil
		spec.Agents = 1
		if _, err := p.Create(context.Background(), spec); err != nil {
			t.Errorf("create after the failed one: %v", err)
		}
	})
	t.Run("Exists", func(t *testing.T) {
		p, spec, _ := newProvider(t, 1)
		if _, err := p.Create(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		spec2 := spec
		spec2.Agents = 3
		if _, err := p.Create(context.Background(), spec2); !errors.Is(err, provision.ErrExists) {
			t.Errorf("second create: %v, want ErrExists", err)
		}
		st, err := p.Status(context.Background(), spec.Name)
		if err != nil || len(st.Agents) != 1 {
			t.Errorf("status after refused create: %v, %+v", err, st.Agents)
		}
	})
}

var _ = pdocker.Name

func statErr(path string) error {
	_, err := os.Stat(path)
	return err
}
