package agents_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestTenantRegistryAccess, against an htpasswd registry and dockerd: tenant a's private
// image is pulled with a's credentials (from the store) and runs; tenant b, without
// credentials, naming the same image (by digest and by tag) once a's worker left it on the
// node, is refused with the one-line error and no container starts, though the node's own
// credentials would reach the registry: they are only for shared images; nor by a prefix of
// the image's ID, which the engine would resolve. Once the admin
// shares the prefix, b's worker runs with the node's credentials. No credential reaches the
// agent's log or its node record.
func TestTenantRegistryAccess(t *testing.T) {
	const user, pass = "acme", "s3cret-acme-pw-4"
	const nodeUser, nodePass = "node", "s3cret-node-pw-5"
	srv := testenv.StartRegistry(t, map[string]string{user: pass, nodeUser: nodePass})
	cli := dockerClient(t)
	tenantAuth, err := images.LoadAuth(srv.AuthFile(user, pass))
	if err != nil {
		t.Fatal(err)
	}
	nodeAuth, err := images.LoadAuth(srv.AuthFile(nodeUser, nodePass))
	if err != nil {
		t.Fatal(err)
	}
	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	hog := testenv.BuildBinary(t, "./isolation/testdata/hog")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("%s/private/agents-%d:1", srv.Addr, os.Getpid())
	m := images.New(cli, images.WithAuth(tenantAuth))
	img, err := m.Build(ctx, images.BuildOptions{Tag: tag, Binary: bin, Job: hog,
		Labels: map[string]string{"io.stormdock.test": fmt.Sprintf("agents-%d", os.Getpid()), "io.stormdock.test.variant": "private"}})
	if err != nil {
		t.Fatal(err)
	}
	dgst, err := m.Push(ctx, tag, images.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := images.ParseRef(tag)
	pinned, _ := ref.WithDigest(dgst)
	dropImage(t, cli, img.ID)
	t.Cleanup(func() { dropImage(t, cli, img.ID) })

	h := newHarness(t, "mem")
	logs := &testenv.Buffer{}
	h.cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, k := range []string{cluster.TenantsKey, cluster.TenantsKey + "/a", cluster.TenantsKey + "/b"} {
		if _, err := h.store.Create(ctx, k, []byte(`{}`), coord.Persistent); err != nil {
			t.Fatal(err)
		}
	}
	key, _ := cluster.TenantRegistryAuthKey("a")
	if _, err := h.store.Create(ctx, key, tenantAuth.Marshal(), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	d := h.startDocker(cli, puller{m: images.New(cli, images.WithAuth(nodeAuth)), res: &images.Resolver{Auth: nodeAuth}})

	wa := func(job, tenant, image, pin string) cluster.WorkerAssignment {
		w := dockerWA(1, image, pin)
		w.Key.Job, w.Tenant = job, tenant
		return w
	}
	a := wa("img-a", "a", tag, pinned)
	h.assign(a)
	rec := h.waitRecord("tenant a's worker running its private image", time.Minute, allRunning("img-a/0"))
	if info, err := cli.ContainerInspect(ctx, states(rec)["img-a/0"].ContainerID); err != nil || info.Image != img.ID {
		t.Fatalf("a's container runs %q, %v; want %s", info.Image, err, img.ID)
	}

	// The image is on the node now; b names it by digest, then by tag.
	for _, b := range []cluster.WorkerAssignment{wa("img-b", "b", tag, pinned), wa("img-b", "b", tag, "")} {
		b.Generation++
		h.assign(a, b)
		want := fmt.Sprintf("image pull failed: image %s: tenant b has no credentials for registry %s: give the tenant registry credentials with `stormdock tenant registry-auth b FILE`, or ask the admin to share it",
			imageOf(b), srv.Addr)
		rec = h.waitRecord("tenant b refused", 30*time.Second, func(rec cluster.NodeRecord) bool {
			w := states(rec)["img-b/0"]
			return w.State == cluster.WorkerFailed && strings.HasPrefix(w.LastExit, want)
		})
		t.Logf("tenant b: %s", states(rec)["img-b/0"].LastExit)
		testenv.AssertUntil(t, "tenant b's worker never runs", 2*time.Second, func() (bool, string) {
			rec, _, _ := h.record()
			w := states(rec)["img-b/0"]
			return w.State != cluster.WorkerRunning && w.ContainerID == "" && w.PID == 0, fmt.Sprintf("%+v", w)
		})
		if n := d.pulls(t, "failed"); b.Pinned != "" && n != 0 {
			// The digest is on the node: the refusal is the registry's answer to b's check.
			t.Errorf("%v failed pulls: b's refusals of a cached digest should be checks, not pulls", n)
		}
	}

	// A prefix of the image's ID, which the engine would resolve to a's image: not that
	// image's name, so pulled as the Docker Hub name it reads as, and refused.
	short := wa("img-b", "b", strings.TrimPrefix(img.ID, "sha256:")[:6], "")
	short.Generation = 4
	h.assign(a, short)
	rec = h.waitRecord("tenant b's short-ID worker refused", 30*time.Second, func(rec cluster.NodeRecord) bool {
		w := states(rec)["img-b/0"]
		return w.Generation == 4 && w.State == cluster.WorkerFailed && strings.HasPrefix(w.LastExit, "image pull failed: ")
	})
	t.Logf("tenant b by short ID %s: %s", short.Image, states(rec)["img-b/0"].LastExit)
	testenv.AssertUntil(t, "tenant b's short-ID worker never runs", 2*time.Second, func() (bool, string) {
		rec, _, _ := h.record()
		w := states(rec)["img-b/0"]
		return w.State != cluster.WorkerRunning && w.ContainerID == "", fmt.Sprintf("%+v", w)
	})

	// Shared: b's worker runs with the node's credentials.
	share, _ := json.Marshal(cluster.SharedImages{Prefixes: []string{srv.Addr + "/private"}})
	if _, err := h.store.Create(ctx, cluster.SharedImagesKey, share, coord.Persistent); err != nil {
		t.Fatal(err)
	}
	b := wa("img-b", "b", tag, pinned)
	b.Generation = 5
	h.assign(a, b)
	h.waitRecord("tenant b's worker running the shared image", time.Minute, allRunning("img-a/0", "img-b/0"))

	// No credential in the log, nor in the node record.
	recJSON, _ := json.Marshal(rec)
	for _, secret := range []string{pass, nodePass, base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)),
		base64.StdEncoding.EncodeToString([]byte(nodeUser + ":" + nodePass))} {
		if strings.Contains(logs.String(), secret) || strings.Contains(string(recJSON), secret) {
			t.Errorf("a credential (%q...) is in the agent's log or node record", secret[:4])
		}
	}
	if !strings.Contains(logs.String(), "tenant b has no credentials") {
		t.Errorf("the refusal is not in the agent's log; captured:\n%s", logs.String())
	}
}

func imageOf(w cluster.WorkerAssignment) string {
	if w.Pinned != "" {
		return w.Pinned
	}
	return w.Image
}
