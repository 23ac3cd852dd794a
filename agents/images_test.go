package agents_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/agents"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
)

// pushedImage is a worker image in a registry: the stormdock binary at /stormdock (the
// launcher) and the isolation tests' hog at /job (the worker, `/job term`).
type pushedImage struct {
	tag, pinned, id string
}

var imageBuilds struct {
	sync.Mutex
	done map[string]pushedImage
}

// pushImage builds the worker image variant once per test binary and pushes it to reg as
// REG/stormdock-test/agents-PID:variant.
func pushImage(t *testing.T, cli *client.Client, reg, variant string) pushedImage {
	t.Helper()
	imageBuilds.Lock()
	defer imageBuilds.Unlock()
	key := reg + "/" + variant
	if p, ok := imageBuilds.done[key]; ok {
		return p
	}
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("%s/stormdock-test/agents-%d:%s", reg, os.Getpid(), variant)
	m := images.New(cli)
	img, err := m.Build(ctx, images.BuildOptions{Tag: tag, Binary: bin, Job: hog,
		Labels: map[string]string{"io.stormdock.test": fmt.Sprintf("agents-%d", os.Getpid()), "io.stormdock.test.variant": variant}})
	if err != nil {
		t.Fatal(err)
	}
	dgst, err := m.Push(ctx, tag, images.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := images.ParseRef(tag)
	pinned, _ := r.WithDigest(dgst)
	p := pushedImage{tag: tag, pinned: pinned, id: img.ID}
	if imageBuilds.done == nil {
		imageBuilds.done = map[string]pushedImage{}
	}
	imageBuilds.done[key] = p
	return p
}

// removePushedImages removes the images pushImage built from the engine, at the end of the
// tests (the registry's storage goes with the registry).
func removePushedImages() {
	imageBuilds.Lock()
	defer imageBuilds.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		return
	}
	defer cli.Close()
	for _, p := range imageBuilds.done {
		_, _ = cli.ImageRemove(ctx, p.id, image.RemoveOptions{Force: true, PruneChildren: true})
	}
}

// dropImage removes an image from the engine under every name (containers using it gone).
func dropImage(t *testing.T, cli *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.ImageRemove(ctx, id, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
}

func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	testenv.DockerSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		testenv.Missing(t, "dockerd: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// puller is the agent's image puller (as the daemon builds it), with a gate a test can
// hold a pull at.
type puller struct {
	m    *images.Manager
	res  *images.Resolver // nil: anonymous, as a node without --registry-auth
	gate chan struct{}    // nil: never held
}

func (p puller) Has(ctx context.Context, ref string) (bool, error) { return p.m.Has(ctx, ref) }
func (p puller) Pull(ctx context.Context, ref string, acc images.Access) error {
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return p.m.PullAccess(ctx, ref, acc, images.Progress{})
}
func (p puller) Check(ctx context.Context, ref string, acc images.Access) error {
	res := p.res
	if res == nil {
		res = &images.Resolver{}
	}
	return res.CheckAccess(ctx, ref, acc)
}

// dockerAgent is an agent with both drivers, whose containers carry a label of the test's
// own (removed at its end).
type dockerAgent struct {
	ra    *runningAgent
	reg   *prometheus.Registry
	label string
}

func (h *harness) startDocker(cli *client.Client, p agents.Images) *dockerAgent {
	h.t.Helper()
	label := fmt.Sprintf("agents-%d-%x", os.Getpid(), rand.Uint32())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dd, err := docker.New(ctx, docker.Config{Client: cli, Node: nodeID, NamePrefix: label + "-",
		Labels: map[string]string{"io.stormdock.test": label}, Logger: testenv.Logger(h.t, slog.LevelError)})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		dd.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "io.stormdock.test="+label))})
		for _, c := range cs {
			_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	})
	cfg := h.cfg
	cfg.Images = p
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	a, err := agents.New(cfg, h.agentStore(),
		agents.Driver{Isolation: cluster.IsolationProcess, Driver: h.drv},
		agents.Driver{Isolation: cluster.IsolationDocker, Driver: dd})
	if err != nil {
		h.t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, cancel: acancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(actx) }()
	h.t.Cleanup(func() {
		if err := ra.stop(); err != nil {
			h.t.Errorf("agent Run: %v", err)
		}
	})
	return &dockerAgent{ra: ra, reg: reg, label: label}
}

// dockerWA is a docker worker of job img running `/job term` from image (pinned when given).
func dockerWA(gen int64, tag, pinned string) cluster.WorkerAssignment {
	return cluster.WorkerAssignment{
		Key: cluster.WorkerKey{Job: "img", Worker: 0}, Generation: gen, Tenant: "search", UID: tenantUID, Workers: 1,
		Isolation: cluster.IsolationDocker, Command: []string{images.JobPath, "term"},
		Image: tag, Pinned: pinned,
		Resources: cluster.Resources{Memory: 64 << 20, CPU: 200}, Grace: cluster.Duration(2 * time.Second),
	}
}

func (d *dockerAgent) pulls(t *testing.T, result string) float64 {
	return testenv.Metric(t, d.reg, "stormdock_agent_image_pulls_total", map[string]string{"result": result})
}

// TestPullOnDemand: a node without a docker worker's image pulls it (the worker shows
// pulling meanwhile) and runs the pinned bytes; the pull is not a restart.
func TestPullOnDemand(t *testing.T) {
	reg := testenv.Registry(t)
	cli := dockerClient(t)
	img := pushImage(t, cli, reg, "1")
	dropImage(t, cli, img.id)
	h := newHarness(t, "mem")
	gate := make(chan struct{})
	d := h.startDocker(cli, puller{m: images.New(cli), gate: gate})

	h.assign(dockerWA(1, img.tag, img.pinned))
	h.waitRecord("worker pulling its image", 20*time.Second, func(rec cluster.NodeRecord) bool {
		return states(rec)["img/0"].State == cluster.WorkerPulling
	})
	t0 := time.Now()
	close(gate)
	rec := h.waitRecord("worker running", time.Minute, allRunning("img/0"))
	t.Logf("figure: pull of the %s worker image from the loopback registry to running worker: %v (node record every %v)",
		sizeOf(t, cli, img.pinned), time.Since(t0).Round(10*time.Millisecond), heartbeat)
	w := states(rec)["img/0"]
	info, err := cli.ContainerInspect(context.Background(), w.ContainerID)
	if err != nil || info.Image != img.id || info.Config.Image != img.pinned {
		t.Fatalf("container runs %q (%q), %v; want image %s by its digest %s", info.Image, info.Config.Image, err, img.id, img.pinned)
	}
	if w.Restarts != 0 || d.pulls(t, "ok") != 1 {
		t.Errorf("restarts %d, pulls %v; want 0 restarts and 1 pull", w.Restarts, d.pulls(t, "ok"))
	}
}

func sizeOf(t *testing.T, cli *client.Client, ref string) string {
	info, err := cli.ImageInspect(context.Background(), ref)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.1f MB", float64(info.Size)/1e6)
}

// TestPullFailures: a tag the registry does not know, and a registry that is down, show
// 'image pull failed' with the registry's answer on the worker, are retried with backoff and
// never count as crashes; once the registry is back the worker runs.
func TestPullFailures(t *testing.T) {
	reg := testenv.Registry(t)
	cli := dockerClient(t)
	srv := testenv.StartRegistry(t, nil)
	img := pushImage(t, cli, srv.Addr, "own")
	dropImage(t, cli, img.id)
	h := newHarness(t, "mem")
	d := h.startDocker(cli, puller{m: images.New(cli)})

	missing := fmt.Sprintf("%s/stormdock-test/agents-%d:missing", reg, os.Getpid())
	h.assign(dockerWA(1, missing, ""))
	failed := func(want string) func(cluster.NodeRecord) bool {
		return func(rec cluster.NodeRecord) bool {
			w := states(rec)["img/0"]
			return w.State == cluster.WorkerFailed && strings.HasPrefix(w.LastExit, "image pull failed: ") && strings.Contains(w.LastExit, want)
		}
	}
	h.waitRecord("unknown tag: image pull failed with the registry's answer", 20*time.Second, failed("manifest unknown"))
	testenv.Eventually(t, "three failed pulls", 30*time.Second, func() bool { return d.pulls(t, "failed") >= 3 })
	rec, _, _ := h.record()
	if w := states(rec)["img/0"]; w.Restarts != 0 || w.RecentRestarts != 0 || !strings.Contains(w.LastExit, "registry "+reg) {
		t.Fatalf("after %v failed pulls: %+v; want no restarts counted and the registry named", d.pulls(t, "failed"), w)
	}
	t.Logf("unknown tag: %s", states(rec)["img/0"].LastExit)

	srv.Stop()
	h.assign(dockerWA(2, img.tag, img.pinned))
	rec = h.waitRecord("registry down: image pull failed, refused", 20*time.Second, failed("refused"))
	t.Logf("registry down: %s", states(rec)["img/0"].LastExit)
	srv.Start()
	rec = h.waitRecord("worker running once the registry is back", time.Minute, allRunning("img/0"))
	if w := states(rec)["img/0"]; w.Restarts != 0 {
		t.Errorf("restarts = %d after pull failures; want 0", w.Restarts)
	}
}

// TestPrepull: an assignment's pre-pull list is pulled and reported before any worker needs
// it, and a worker switched to the pre-pulled image is down for stop and start only; the same
// switch without pre-pull is down for the pull too (both logged as figures).
func TestPrepull(t *testing.T) {
	reg := testenv.Registry(t)
	cli := dockerClient(t)
	v1, v2 := pushImage(t, cli, reg, "1"), pushImage(t, cli, reg, "2")
	h := newHarness(t, "mem")
	d := h.startDocker(cli, puller{m: images.New(cli)})

	h.assign(dockerWA(1, v1.tag, v1.pinned))
	h.waitRecord("v1 running", time.Minute, allRunning("img/0"))

	// Without pre-pull: v2 is not on the node.
	dropImage(t, cli, v2.id)
	without := h.switchImage(t, cli, d, dockerWA(2, v2.tag, v2.pinned), nil)

	// With pre-pull: v1 (no longer used) is removed, pre-pulled, reported, then switched to.
	dropImage(t, cli, v1.id)
	na := cluster.NodeAssignment{Prepull: []string{v1.pinned}}
	h.assignFull(na, dockerWA(2, v2.tag, v2.pinned))
	rec := h.waitRecord("v1 pre-pulled and reported", time.Minute, func(rec cluster.NodeRecord) bool {
		return len(rec.Images) == 1 && rec.Images[0].Ref == v1.pinned && rec.Images[0].State == cluster.ImageReady
	})
	if ok, err := images.New(cli).Has(context.Background(), v1.pinned); !ok || err != nil {
		t.Fatalf("reported %+v but the engine has no %s (%v)", rec.Images, v1.pinned, err)
	}
	if w := d.ra.a.WantedImages(); !slices.Equal(w, sorted(v1.pinned, v2.pinned)) {
		t.Errorf("WantedImages = %v; want the pre-pulled %s and the running worker's %s", w, v1.pinned, v2.pinned)
	}
	pulled := d.pulls(t, "ok")
	with := h.switchImage(t, cli, d, dockerWA(3, v1.tag, v1.pinned), &na)
	if d.pulls(t, "ok") != pulled {
		t.Errorf("the switch to a pre-pulled image pulled again (%v pulls, %v before)", d.pulls(t, "ok"), pulled)
	}
	t.Logf("figure: worker downtime during an image change: %v without pre-pull, %v with pre-pull (die of the old container to start of the new, engine event times)",
		without.Round(time.Millisecond), with.Round(time.Millisecond))

	// A pre-pull that fails is reported with the registry's answer.
	bad := fmt.Sprintf("%s/stormdock-test/agents-%d:missing", reg, os.Getpid())
	h.assignFull(cluster.NodeAssignment{Prepull: []string{bad}}, dockerWA(3, v1.tag, v1.pinned))
	h.waitRecord("failed pre-pull reported", 20*time.Second, func(rec cluster.NodeRecord) bool {
		return len(rec.Images) == 1 && rec.Images[0].State == cluster.ImageFailed && strings.Contains(rec.Images[0].Error, "manifest unknown")
	})
}

// switchImage assigns wa (a new image for the running worker img/0) and returns how long
// the worker was down: from the engine's die event of the old container to the start event
// of the new one.
func (h *harness) switchImage(t *testing.T, cli *client.Client, d *dockerAgent, wa cluster.WorkerAssignment, na *cluster.NodeAssignment) time.Duration {
	t.Helper()
	rec, _, _ := h.record()
	old := states(rec)["img/0"].ContainerID
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(2*time.Minute))
	defer cancel()
	evs, errs := cli.Events(ctx, events.ListOptions{Filters: filters.NewArgs(filters.Arg("type", "container"),
		filters.Arg("label", "io.stormdock.test="+d.label))})
	if na != nil {
		h.assignFull(*na, wa)
	} else {
		h.assign(wa)
	}
	var died, started time.Time
	var newID string
	for started.IsZero() {
		select {
		case ev := <-evs:
			switch {
			case ev.Action == events.ActionDie && ev.Actor.ID == old:
				died = time.Unix(0, ev.TimeNano)
			case ev.Action == events.ActionStart && ev.Actor.ID != old && !died.IsZero():
				started, newID = time.Unix(0, ev.TimeNano), ev.Actor.ID
			}
		case err := <-errs:
			t.Fatalf("engine events: %v", err)
		}
	}
	h.waitRecord("worker running the new image", time.Minute, func(rec cluster.NodeRecord) bool {
		w := states(rec)["img/0"]
		return w.State == cluster.WorkerRunning && w.ContainerID == newID && w.Generation == wa.Generation
	})
	info, err := cli.ContainerInspect(ctx, newID)
	if err != nil || info.Config.Image != wa.Pinned {
		t.Fatalf("new container runs %q, %v; want %s", info.Config.Image, err, wa.Pinned)
	}
	return started.Sub(died)
}

// assignFull writes the node assignment na with workers ws, stamped like assign.
func (h *harness) assignFull(na cluster.NodeAssignment, ws ...cluster.WorkerAssignment) {
	h.t.Helper()
	h.assignMu.Lock()
	h.prepull = na.Prepull
	h.assignMu.Unlock()
	h.assign(ws...)
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
