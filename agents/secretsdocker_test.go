package agents_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

// TestSecretsDeliveredToContainer is TestSecretsDelivered for a docker worker, read from the
// host: the container sees its secrets directory at /run/secrets, bind-mounted read-only
// from the agent's directory of the worker (0500, the file 0400, both the tenant's uid's);
// the process in the container reads the value through its own mount namespace
// (/proc/PID/root); a rotation rewrites it there without a new container; the container's
// configuration holds no value; the directory goes with the worker.
func TestSecretsDeliveredToContainer(t *testing.T) {
	testenv.Root(t)
	cli := dockerClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("stormdock-test/agents-secrets-%d:1", os.Getpid()) // local: no pull
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")
	img, err := images.New(cli).Build(ctx, images.BuildOptions{Tag: tag, Binary: hog, Job: hog, Cmd: []string{images.JobPath, "term"},
		Labels: map[string]string{"io.stormdock.test": fmt.Sprintf("agents-secrets-%d", os.Getpid())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = cli.ImageRemove(context.Background(), img.ID, image.RemoveOptions{Force: true, PruneChildren: true})
	})

	h := newHarness(t, "mem")
	openUp(t, filepath.Dir(h.stateDir), 0o711)
	sm := startSecretsMaster(t, h)
	if _, err := desired.CreateTenantIn(ctx, h.store, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}},
		cluster.UIDRange{First: tenantUID, Last: tenantUID + 999}); err != nil {
		t.Fatal(err)
	}
	const v1, v2 = "container-first-5be0a2", "container-second-91d7c3"
	if _, _, err := desired.SetSecret(ctx, h.store, sm.ring, "search", "db", []byte(v1), "admin"); err != nil {
		t.Fatal(err)
	}
	h.startDocker(cli, puller{m: images.New(cli)})
	h.waitRecord("node registered with its identity", 10*time.Second, func(rec cluster.NodeRecord) bool {
		return rec.Identity != nil && len(rec.Identity.Sign) > 0
	})
	spec := &cluster.JobSpec{Name: "img", Tenant: "search", Workers: 1, Isolation: cluster.IsolationDocker, Image: tag,
		Command:   []string{images.JobPath, "term"},
		Resources: cluster.Resources{Memory: 64 << 20, CPU: 200}, GracePeriod: cluster.Duration(2 * time.Second),
		Secrets: []string{"db"}}
	if _, err := desired.SubmitJob(ctx, h.store, spec); err != nil {
		t.Fatal(err)
	}
	rec := h.waitRecord("img running", time.Minute, allRunning("img/0"))
	cid := states(rec)["img/0"].ContainerID
	info, err := cli.ContainerInspect(ctx, cid)
	if err != nil {
		t.Fatal(err)
	}
	var src string
	for _, m := range info.Mounts {
		if m.Destination == "/run/secrets" {
			if m.RW {
				t.Errorf("/run/secrets is mounted read-write: %+v", m)
			}
			src = m.Source
		}
	}
	if src == "" || !strings.HasPrefix(src, h.stateDir) {
		t.Fatalf("mounts %+v: want the worker's secrets directory under %s at /run/secrets", info.Mounts, h.stateDir)
	}
	owned(t, src, 0o500, tenantUID)
	owned(t, filepath.Join(src, "db"), 0o400, tenantUID)
	var kid int
	testenv.EventuallyWith(t, "the launcher's child", 30*time.Second, func() (bool, string) {
		kids := clustertest.Children(info.State.Pid)
		if len(kids) == 1 {
			kid = kids[0]
		}
		return kid != 0, fmt.Sprintf("children of %d: %v", info.State.Pid, kids)
	})
	if s := procStatus(t, kid, "Uid"); strings.Fields(s + " ")[0] != fmt.Sprint(tenantUID) {
		t.Errorf("the container's worker runs as uid %q, want the tenant's %d", s, tenantUID)
	}
	inside := fmt.Sprintf("/proc/%d/root/run/secrets/db", kid)
	if b, err := os.ReadFile(inside); err != nil || string(b) != v1 {
		t.Fatalf("the container's /run/secrets/db holds %q (%v), want %q", b, err, v1)
	}
	if fi, err := os.Stat(inside); err != nil || fi.Mode().Perm() != 0o400 {
		t.Errorf("the container's /run/secrets/db: %v, %v; want mode 0400", fi, err)
	}

	// Rotation: the same container and process see the new value.
	if _, _, err := desired.SetSecret(ctx, h.store, sm.ring, "search", "db", []byte(v2), "admin"); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the container sees the rotated secret", 20*time.Second, func() (bool, string) {
		b, err := os.ReadFile(inside)
		return err == nil && string(b) == v2, fmt.Sprintf("%q %v", b, err)
	})
	if rec, _, _ := h.record(); states(rec)["img/0"].ContainerID != cid || !clustertest.Alive(kid) {
		t.Errorf("rotation replaced the container or its process: %s -> %s, pid %d alive %v", cid, states(rec)["img/0"].ContainerID, kid, clustertest.Alive(kid))
	}
	// The container's configuration holds no value, nor its process's environment.
	if info, err = cli.ContainerInspect(ctx, cid); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("%+v %+v %+v", info.Config, info.HostConfig, info.Args)
	for _, v := range []string{v1, v2} {
		if strings.Contains(conf, v) {
			t.Errorf("the container's configuration holds a secret value")
		}
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", kid)); bytes.Contains(b, []byte(v)) {
			t.Error("the container's worker's environment holds a secret value")
		}
	}

	// Killed, the worker's secrets go with it.
	if _, err := desired.KillJob(ctx, h.store, "img", time.Second); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the secrets directory removed", 30*time.Second, func() bool {
		_, err := os.Lstat(src)
		return os.IsNotExist(err)
	})
}
