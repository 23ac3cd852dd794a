package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
)

// Issue 28: every worker fenced. A docker job without a command runs its image's own
// entrypoint and cmd, under the lease launcher that the agent bind-mounts into the container
// as its entrypoint, exactly as a docker job with a command: so its copy on a node cut off
// stops when the node's lease lapses, within the fencing bound.

// ownCommand is the CMD of the test images: a worker that runs until stopped.
var ownCommand = []string{images.StormdockPath, "worker", "wordcount", "--rate", "1"}

// dockerClient connects to the engine (dockerd must run: testenv.DockerSocket).
func dockerClient(t testing.TB) *client.Client {
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

// buildOwnImage builds tag FROM scratch around bin (a static binary at /stormdock), with cmd
// as its own CMD (images.BuildOptions.Cmd: no entrypoint), and removes it when the test
// ends. A label of the test's own makes it an image of its own, which the build cache would
// otherwise share with another package's test.
func buildOwnImage(t testing.TB, cli *client.Client, tag, bin string, cmd []string) images.Image {
	t.Helper()
	img := buildOwn(t, cli, tag, bin, cmd)
	t.Cleanup(func() { removeImage(cli, img.ID) })
	return img
}

func buildOwn(t testing.TB, cli *client.Client, tag, bin string, cmd []string) images.Image {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	img, err := images.New(cli).Build(ctx, images.BuildOptions{Tag: tag, Binary: bin, Cmd: cmd,
		Labels: map[string]string{"io.example.e2e": fmt.Sprintf("%d-%s-%d", os.Getpid(), strings.Join(cmd, " "), time.Now().UnixNano())}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func removeImage(cli *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = cli.ImageRemove(ctx, id, image.RemoveOptions{Force: true, PruneChildren: true})
}

// ownImage is the image whose CMD is ownCommand (no registry: on this engine alone), built
// once for the tests of this binary and removed by TestMain (removeOwnImage).
var ownImage struct {
	sync.Mutex
	tag, id string
}

func sharedOwnImage(t testing.TB, cli *client.Client) string {
	t.Helper()
	ownImage.Lock()
	defer ownImage.Unlock()
	if ownImage.tag == "" {
		tag := fmt.Sprintf("stormdock-e2e/own-%d:1", os.Getpid())
		ownImage.id, ownImage.tag = buildOwn(t, cli, tag, binary, ownCommand).ID, tag
	}
	return ownImage.tag
}

// removeOwnImage removes the shared image, at the end of the tests.
func removeOwnImage() {
	ownImage.Lock()
	defer ownImage.Unlock()
	if ownImage.id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cli, err := docker.Connect(ctx, ""); err == nil {
		removeImage(cli, ownImage.id)
		cli.Close()
	}
}

// removeJobContainers removes every container of job (a job name of the test's own).
func removeJobContainers(cli *client.Client, job string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelJob+"="+job))})
	for _, c := range cs {
		_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
}

// containerCgroups is where the engine puts containers (the parent of their cgroups, in the
// memory hierarchy on cgroup v1, the unified one on v2), found from a container's init.
var containerCgroups struct {
	sync.Mutex
	parent string
}

// findContainerCgroups learns the engine's container cgroup parent from a running container.
func findContainerCgroups(t testing.TB, cli *client.Client, cid string) {
	t.Helper()
	info, err := cli.ContainerInspect(context.Background(), cid)
	if err != nil || info.State == nil || info.State.Pid == 0 {
		t.Fatalf("inspect container %s: %v", cid, err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(info.State.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	v1 := false
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err == nil {
		v1 = true
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (v1 && slices.Contains(strings.Split(f[1], ","), "memory") || !v1 && f[0] == "0") {
			containerCgroups.Lock()
			containerCgroups.parent = filepath.Dir(f[2])
			containerCgroups.Unlock()
			return
		}
	}
	t.Fatalf("no cgroup of container %s in %q", cid, b)
}

// containerProcs is workerProcs for docker workers: the processes of the engine's containers
// (cgroupPIDs below their parent) whose environment names the job, less their lease
// launchers. It is read from /proc and the cgroup tree, not through the engine or stormdock.
func containerProcs(job string) map[string][]procWorker {
	containerCgroups.Lock()
	parent := containerCgroups.parent
	containerCgroups.Unlock()
	if parent == "" {
		return map[string][]procWorker{}
	}
	return workerProcsIn(job, cgroupPIDs(parent))
}

// A docker job that runs its image's own CMD, on two nodes of a network lab, one node's host
// cut: its container stops by itself (the launcher, its entrypoint, sees the lease lapse),
// as docker and /proc tell, and the worker runs on the other node; no index ran twice beyond
// the fencing bound.
func TestAcrossHostsDockerOwnCommand(t *testing.T) {
	cli := dockerClient(t)
	job := fmt.Sprintf("own%d", os.Getpid())
	tag := sharedOwnImage(t, cli)
	t.Cleanup(func() { removeJobContainers(cli, job) })
	lc := newLabCluster(t, labSpec{zkServers: 1, masters: []string{"m1"}, dcs: []string{"dc-a"}, perDC: 2, slots: 2,
		session: 2 * time.Second, reregisterGrace: 4 * time.Second, agentArgs: []string{"--isolation", "docker"}})
	lc.submit(t, []byte(fmt.Sprintf("name: %s\ntenant: e2e\nworkers: 2\nisolation: docker\nimage: %s\n"+
		"resources: {memory: 64Mi, cpu: 0.1}\nplacement: {spread: [node]}\ngracePeriod: 2s\n", job, tag)))

	var byNode map[string]string // node -> its container
	testenv.EventuallyWith(t, "a container of the job running on each node", 90*time.Second, func() (bool, string) {
		byNode = runningContainers(t, cli, job)
		return len(byNode) == 2, fmt.Sprintf("%v", byNode)
	})
	findContainerCgroups(t, cli, byNode["a1"])
	var before map[string][]procWorker
	testenv.EventuallyWith(t, "the image's CMD running under the launcher in both", 60*time.Second, func() (bool, string) {
		before = containerProcs(job)
		return len(before) == 2 && len(before["0"]) == 1 && len(before["1"]) == 1, fmt.Sprintf("%v", before)
	})
	for k, ps := range before {
		if !strings.HasSuffix(ps[0].cmd, ": "+strings.Join(ownCommand, " ")) {
			t.Errorf("worker %s runs %q; want the image's CMD %q", k, ps[0].cmd, ownCommand)
		}
		if parent := launcherOf(t, ps[0].pid); !strings.HasPrefix(parent, "/run/stormdock-launch launch ") {
			t.Errorf("worker %s's parent is %q; want the lease launcher mounted into its container", k, parent)
		}
	}
	fence := watchFenceOf(t, job, fencingBound(lc.Session, labJobGrace), containerProcs)

	var own procWorker
	for _, ps := range before {
		if ps[0].node == "a1" {
			own = ps[0]
		}
	}
	ctx := context.Background()
	start := time.Now()
	host := lc.node("a1").host
	if err := host.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := host.Heal(ctx); err != nil {
			t.Error(err)
		}
	}()
	var stopped, engineSaw, replaced time.Duration
	testenv.EventuallyWith(t, "a1's container stopped by itself, the worker running on a2", 90*time.Second, func() (bool, string) {
		if stopped == 0 && !clustertest.Alive(own.pid) {
			stopped = time.Since(start)
		}
		if engineSaw == 0 && !containerRunning(t, cli, byNode["a1"]) {
			engineSaw = time.Since(start)
		}
		now := containerProcs(job)
		onA2 := 0
		for _, ps := range now {
			if slices.ContainsFunc(ps, func(p procWorker) bool { return p.node == "a2" }) {
				onA2++
			}
		}
		if replaced == 0 && onA2 == 2 {
			replaced = time.Since(start)
		}
		return stopped > 0 && engineSaw > 0 && replaced > 0, fmt.Sprintf("worker gone %v, container stopped %v, %d of 2 on a2", stopped > 0, engineSaw > 0, onA2)
	})
	t.Logf("figure: docker job running its image's CMD, its node's host cut (session %s, grace %s): worker stopped after %s (docker: container not running after %s), replacement running after %s",
		lc.Session, labJobGrace, stopped.Round(time.Millisecond), engineSaw.Round(time.Millisecond), replaced.Round(time.Millisecond))
	fence.check(t)
}

// runningContainers maps each node to its running container of job, from the engine.
func runningContainers(t testing.TB, cli *client.Client, job string) map[string]string {
	t.Helper()
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelJob+"="+job))})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range cs {
		out[c.Labels[docker.LabelNode]] = c.ID
	}
	return out
}

// containerRunning asks the engine whether a container still runs.
func containerRunning(t testing.TB, cli *client.Client, cid string) bool {
	t.Helper()
	info, err := cli.ContainerInspect(context.Background(), cid)
	if errdefs.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return info.State != nil && info.State.Running
}

// launcherOf is the command line of a process's parent, from /proc.
func launcherOf(t testing.TB, pid int) string {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	cmd, _ := os.ReadFile("/proc/" + f[1] + "/cmdline")
	return strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")
}
