package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
)

// TestDockerJobFromRegistry is issue 20 through the CLI binary against `stormdock up
// --isolation docker`: an image built and pushed, then removed from the engine, runs a
// docker job pulled by the agents, pinned to its digest; restarted workers still run the
// pinned bytes after the tag is moved; a job whose tag does not exist shows the registry's
// answer and crash-loops nowhere.
func TestDockerJobFromRegistry(t *testing.T) {
	testenv.Cgroups(t)
	testenv.DockerSocket(t)
	reg := testenv.Registry(t)
	data := t.TempDir()
	addr := clustertest.FreeAddr(t)
	// No --master, no --ca: the CLI finds the local cluster's URL (https) and CA in its data
	// directory.
	c := &cli{t: t, data: data, env: []string{"STORMDOCK_DATA=" + data}}
	tag := fmt.Sprintf("%s/stormdock-e2e/wc-%d:1", reg, os.Getpid())

	// Each image gets a label of its own: the engine's build cache gives the same binaries
	// the image another package's test built, maybe with a container of it running, and
	// removing this test's image from the engine would then be refused.
	label := func(what string) string {
		return fmt.Sprintf("io.example.e2e=%d-%s-%d", os.Getpid(), what, time.Now().UnixNano())
	}
	out := c.ok("image", "build", "--tag", tag, "--push", "--label", label("first"))
	firstID, pinned := builtID(out), lastLine(out)
	if !strings.HasPrefix(pinned, strings.TrimSuffix(tag, ":1")+"@sha256:") || !strings.Contains(out, "pushed "+tag) {
		t.Fatalf("image build --push printed %q; want the pushed tag and its pinned reference", out)
	}
	var moved string
	t.Cleanup(func() {
		for _, ref := range []string{firstID, moved} {
			if ref != "" {
				_ = exec.Command("docker", "rmi", "--force", ref).Run()
			}
		}
	})
	rmi(t, firstID)

	up := exec.Command(binary, "up", "--nodes", "2", "--dcs", "dc-a", "--racks-per-dc", "2", "--slots", "4",
		"--isolation", "docker", "--data", data, "--api", addr, "--tls=false", "--session-timeout", "1s", "--log-level", "warn")
	var upOut bytes.Buffer
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = up.Process.Signal(syscall.SIGKILL)
		_ = up.Wait() // also waits for the copy into upOut
		clustertest.KillCgroupTree("/stormdock-local/" + filepath.Base(data))
		removeLocalContainers(filepath.Base(data))
		if t.Failed() {
			t.Logf("stormdock up output:\n%s", clustertest.Tail(upOut.Bytes(), 4000))
		}
	})
	testenv.Eventually(t, "local cluster up", 30*time.Second, func() bool {
		out, code := c.run("node", "list", "-o", "json")
		var nodes []api.NodeView
		return code == 0 && json.Unmarshal([]byte(out), &nodes) == nil && len(nodes) == 2
	})
	c.ok("tenant", "create", "t1")
	dir := t.TempDir()
	spec := func(name, image string) string {
		p := filepath.Join(dir, name+".yaml")
		body := fmt.Sprintf("name: %s\ntenant: t1\nworkers: 2\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\n"+
			"command: [stormdock, worker, wordcount, --rate, '2']\nplacement: {spread: [node]}\ngracePeriod: 2s\n", name, image)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t0 := time.Now()
	out = c.ok("job", "submit", spec("wcimg", tag), "--wait")
	if !strings.Contains(out, "pinned for generation 1: "+pinned) || !strings.Contains(out, "all 2 workers running") {
		t.Fatalf("submit: %s; want the pinned digest and the workers running", out)
	}
	t.Logf("figure: docker job of 2 workers on 2 nodes, image pulled on both, submit to all running: %v", time.Since(t0).Round(time.Millisecond))
	if st := c.ok("job", "status", "wcimg"); !strings.Contains(st, pinned) {
		t.Errorf("job status does not show the digest:\n%s", st)
	}
	ids := jobImages(t, "wcimg")
	if len(ids) != 2 || ids[0] != firstID || ids[1] != firstID {
		t.Fatalf("containers of wcimg run images %v; want %s on both", ids, firstID)
	}

	// Move the tag to another image; a restarted worker still runs the pinned digest.
	moveOut := c.ok("image", "build", "--tag", tag, "--push", "--job", allocBinary, "--label", label("moved"))
	moved = builtID(moveOut)
	if moved == firstID {
		t.Fatal("the moved tag names the same image")
	}
	st := c.status("wcimg")
	victim := st.Workers[0]
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill worker %d (pid %d): %v", victim.Worker, victim.PID, err)
	}
	testenv.EventuallyWith(t, "killed worker restarted", 60*time.Second, func() (bool, string) {
		for _, w := range c.status("wcimg").Workers {
			if w.Worker == victim.Worker {
				return w.Restarts >= 1 && w.State == cluster.WorkerRunning && w.PID != victim.PID, fmt.Sprintf("%+v", w)
			}
		}
		return false, "no worker"
	})
	if ids := jobImages(t, "wcimg"); len(ids) != 2 || ids[0] != firstID || ids[1] != firstID {
		t.Fatalf("after the tag moved to %s and a restart, wcimg runs %v; want the pinned %s on both", moved, ids, firstID)
	}

	// A rollout to a new image: pinned for generation 2, pulled ahead on the nodes of the
	// workers it replaces, then every worker replaced onto it, one at a time.
	tag2 := strings.TrimSuffix(tag, ":1") + ":2"
	out2 := c.ok("image", "build", "--tag", tag2, "--push", "--job", allocBinary, "--label", label("second"))
	secondID, pinned2 := builtID(out2), lastLine(out2)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "--force", secondID).Run() })
	rmi(t, secondID) // so the agents have to pull it
	out = c.ok("job", "update", spec("wcimg", tag2), "--min-healthy", "1s", "--wait")
	if !strings.Contains(out, "pinned for generation 2: "+pinned2) || !strings.Contains(out, "every worker on generation 2") {
		t.Fatalf("update to %s: %s; want it pinned for generation 2 and rolled out", tag2, out)
	}
	if ids := jobImages(t, "wcimg"); len(ids) != 2 || ids[0] != secondID || ids[1] != secondID {
		t.Fatalf("after the update wcimg runs %v; want %s on both", ids, secondID)
	}

	// A tag that does not exist: accepted, not pinned, 'image pull failed' with the
	// registry's answer on each worker, and no crash counted.
	missing := fmt.Sprintf("%s/stormdock-e2e/none-%d:1", reg, os.Getpid())
	out = c.ok("job", "submit", spec("nope", missing))
	if !strings.Contains(out, "not pinned yet") || !strings.Contains(out, "manifest unknown") {
		t.Errorf("submit of a missing tag: %s; want it shown as not pinned with the registry's answer", out)
	}
	testenv.EventuallyWith(t, "image pull failed on both workers", 60*time.Second, func() (bool, string) {
		st := c.status("nope")
		for _, w := range st.Workers {
			if w.State != cluster.WorkerFailed || !strings.HasPrefix(w.LastExit, "image pull failed: ") || !strings.Contains(w.LastExit, "manifest unknown") {
				return false, fmt.Sprintf("%+v", w)
			}
		}
		return len(st.Workers) == 2, ""
	})
	table := c.ok("job", "status", "nope")
	if !strings.Contains(table, "image pull failed") {
		t.Errorf("job status table lacks the reason:\n%s", table)
	}
	// The retries themselves are counted in the agents' tests (TestPullFailures); here: no
	// restart is counted, so the master moves nothing for a crash loop.
	for _, w := range c.status("nope").Workers {
		if w.Restarts != 0 {
			t.Errorf("worker %d of nope: %d restarts after failed pulls; want 0", w.Worker, w.Restarts)
		}
	}
	c.ok("job", "kill", "nope", "--wait")
	c.ok("job", "kill", "wcimg", "--grace", "1s", "--wait")

	testOwnCommand(t, c, reg, filepath.Base(data))
}

// testOwnCommand is issue 28 on TestDockerJobFromRegistry's cluster: a docker job without a
// command runs its image's own CMD, under the lease launcher mounted into its containers
// (`job submit --wait` succeeds, and /proc shows both); one whose image has neither an
// entrypoint nor a cmd is refused at submit, in one line, and nothing is stored.
func testOwnCommand(t *testing.T, c *cli, reg, local string) {
	cli := dockerClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	push := func(tag string) string {
		if _, err := images.New(cli).Push(ctx, tag, images.Progress{}); err != nil {
			t.Fatal(err)
		}
		return tag
	}
	// The shared image under the registry's name; one with neither an entrypoint nor a cmd
	// around a small static binary.
	own := fmt.Sprintf("%s/stormdock-e2e/own-%d:1", reg, os.Getpid())
	if err := cli.ImageTag(ctx, sharedOwnImage(t, cli), own); err != nil {
		t.Fatal(err)
	}
	none := fmt.Sprintf("%s/stormdock-e2e/noown-%d:1", reg, os.Getpid())
	buildOwnImage(t, cli, none, allocBinary, []string{})
	push(own)
	push(none)
	dir := t.TempDir()
	spec := func(name, image string) string {
		p := filepath.Join(dir, name+".yaml")
		body := fmt.Sprintf("name: %s\ntenant: t1\nworkers: 2\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\n"+
			"placement: {spread: [node]}\ngracePeriod: 2s\n", name, image)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if out := c.ok("job", "submit", spec("own", own), "--wait"); !strings.Contains(out, "all 2 workers running") {
		t.Fatalf("submit of a job without a command: %s; want its workers running", out)
	}
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelJob+"=own"), filters.Arg("label", "stormdock.local="+local))})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Fatalf("%d containers of job own running; want 2", len(cs))
	}
	for _, ct := range cs {
		info, err := cli.ContainerInspect(ctx, ct.ID)
		if err != nil {
			t.Fatal(err)
		}
		// The container's init is the launcher; its one child (once it forked it) is the
		// image's CMD.
		init := info.State.Pid
		var kids []int
		testenv.EventuallyWith(t, "the launcher's child", 30*time.Second, func() (bool, string) {
			kids = clustertest.Children(init)
			return len(kids) == 1, fmt.Sprintf("children of %d: %v", init, kids)
		})
		if got := launcherOf(t, kids[0]); !strings.HasPrefix(got, "/run/stormdock-launch launch --lease /run/stormdock/") {
			t.Errorf("container %s: init %q; want the lease launcher", ct.Names, got)
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", kids[0]))
		if got := strings.TrimRight(string(cmd), "\x00"); got != strings.Join(ownCommand, "\x00") {
			t.Errorf("container %s runs %q; want the image's CMD %q", ct.Names, got, ownCommand)
		}
	}
	c.refused("image "+none+" has neither an entrypoint nor a cmd, and the job gives no command: give command: [...]", "job", "submit", spec("none", none))
	if out, code := c.run("job", "status", "none"); code == 0 {
		t.Errorf("the refused job was stored: %s", out)
	}
	c.ok("job", "kill", "own", "--grace", "1s", "--wait")
}

// rmi removes an image from the engine, every name of it.
func rmi(t *testing.T, ref string) {
	t.Helper()
	if out, err := exec.Command("docker", "rmi", "--force", ref).CombinedOutput(); err != nil {
		t.Fatalf("docker rmi %s: %v\n%s", ref, err, out)
	}
}

// jobImages returns the image ids the containers of job run, sorted by worker.
func jobImages(t *testing.T, job string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", docker.LabelJob+"="+job))})
	if err != nil {
		t.Fatal(err)
	}
	byWorker := map[string]string{}
	for _, c := range cs {
		byWorker[c.Labels[docker.LabelWorker]] = c.ImageID
	}
	var out []string
	for i := range len(byWorker) {
		out = append(out, byWorker[fmt.Sprint(i)])
	}
	return out
}

// removeLocalContainers removes what a local cluster's docker workers left.
func removeLocalContainers(data string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		return
	}
	defer cli.Close()
	cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", "stormdock.local="+data))})
	for _, c := range cs {
		_ = cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
}

// builtID is the image id `image build` printed (its log lines are mixed in).
func builtID(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "sha256:") {
			id, _, _ := strings.Cut(l, " ")
			return id
		}
	}
	return ""
}

func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
