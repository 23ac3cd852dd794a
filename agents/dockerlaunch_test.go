package agents_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
)

// A docker worker without a command runs its image's own CMD under the lease launcher: the
// agent's static launcher, mounted read-only into the container, is its init, the image's CMD
// its child, as the tenant's uid. An agent without a static launcher refuses such a worker at
// start, saying why, and makes no container for it.
func TestDockerImageOwnCommand(t *testing.T) {
	cli := dockerClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("stormdock-test/agents-own-%d:1", os.Getpid()) // local: no pull, no registry check
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")         // small: the image needs no stormdock
	img, err := images.New(cli).Build(ctx, images.BuildOptions{Tag: tag, Binary: hog, Job: hog, Cmd: []string{images.JobPath, "term"},
		Labels: map[string]string{"io.stormdock.test": fmt.Sprintf("agents-own-%d", os.Getpid())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), img.ID, image.RemoveOptions{Force: true, PruneChildren: true})
	})
	wa := dockerWA(1, tag, "")
	wa.Command = nil

	t.Run("static launcher", func(t *testing.T) {
		h := newHarness(t, "mem")
		h.startDocker(cli, puller{m: images.New(cli)})
		h.assign(wa)
		rec := h.waitRecord("the worker running", time.Minute, allRunning("img/0"))
		info, err := cli.ContainerInspect(ctx, states(rec)["img/0"].ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		if e := info.Config.Entrypoint; len(e) < 4 || e[0] != "/run/stormdock-launch" || e[1] != "launch" ||
			strings.Join(e[len(e)-3:], " ") != "-- "+images.JobPath+" term" || len(info.Config.Cmd) != 0 {
			t.Errorf("entrypoint %q, cmd %q; want the launcher, then -- and the image's CMD", e, info.Config.Cmd)
		}
		mounted := false
		for _, m := range info.Mounts {
			if m.Destination == "/run/stormdock-launch" {
				mounted = !m.RW && m.Source == filepath.Join(h.stateDir, "docker-launcher")
			}
		}
		if !mounted {
			t.Errorf("mounts %+v: want the agent's launcher copy read-only at /run/stormdock-launch", info.Mounts)
		}
		init := info.State.Pid
		// The child is a fork of the launcher until its exec: wait for the exec, not for the fork
		// (CI saw the launcher's own command line in the moment between the two).
		var kid int
		testenv.EventuallyWith(t, "the launcher's child running the image's CMD", 30*time.Second, func() (bool, string) {
			kids := clustertest.Children(init)
			if len(kids) != 1 {
				return false, fmt.Sprintf("children of %d: %v", init, kids)
			}
			kid = kids[0]
			cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", kid))
			return err == nil && string(cmd) == images.JobPath+"\x00term\x00", fmt.Sprintf("the launcher's child %d runs %q (%v); want the image's CMD", kid, cmd, err)
		})
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", kid))
		if !strings.Contains(string(status), fmt.Sprintf("Uid:\t%d\t", tenantUID)) {
			t.Errorf("the image's CMD does not run as the tenant's uid %d:\n%s", tenantUID, status)
		}
	})
	t.Run("no static launcher", func(t *testing.T) {
		h := newHarness(t, "mem")
		h.cfg.Launcher, h.cfg.Self = "/bin/true", "/bin/true" // dynamically linked
		h.startDocker(cli, puller{m: images.New(cli)})
		h.assign(wa)
		rec := h.waitRecord("the start refused", time.Minute, func(rec cluster.NodeRecord) bool {
			w := states(rec)["img/0"]
			return w.State == cluster.WorkerFailed && strings.Contains(w.LastExit, "no static lease launcher to run an image's own command under") &&
				!strings.Contains(w.LastExit, "\n")
		})
		t.Logf("refused: %s", states(rec)["img/0"].LastExit)
		cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
			filters.Arg("label", docker.LabelNode+"="+nodeID), filters.Arg("label", docker.LabelJob+"=img"), filters.Arg("ancestor", tag))})
		if err != nil || len(cs) != 0 {
			t.Errorf("containers of the refused worker: %d, %v; want none", len(cs), err)
		}
	})
}
