package images

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
)

// hog is a static binary to embed, built from the isolation tests' worker program.
var hog string

func TestMain(m *testing.M) {
	var err error
	if hog, err = testenv.Build("./isolation/testdata/hog"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

func connect(t testing.TB) *client.Client {
	t.Helper()
	testenv.DockerSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := docker.Connect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// testLabels marks one test's images, so prunes here never touch anyone else's.
func testLabels(t *testing.T) map[string]string {
	return map[string]string{"io.stormdock.test": fmt.Sprintf("%s-%d-%d", strings.ToLower(t.Name()), os.Getpid(), time.Now().UnixNano())}
}

// removeOnCleanup removes the images carrying labels at the end of the test, whatever happened.
func removeOnCleanup(t *testing.T, cli *client.Client, labels map[string]string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		imgs, err := New(cli).List(ctx, labels)
		if err != nil {
			t.Errorf("cleanup list: %v", err)
			return
		}
		for _, img := range imgs {
			if _, err := cli.ImageRemove(ctx, img.ID, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("cleanup remove %s: %v", img.ID, err)
			}
		}
	})
}

func TestBuildRunList(t *testing.T) {
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	tag := fmt.Sprintf("stormdock-test/images:%d", os.Getpid())
	img, err := m.Build(ctx, BuildOptions{Tag: tag, Binary: hog, Job: hog, Shim: hog, Labels: labels})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if !slices.Contains(img.Tags, tag) || img.Labels[LabelManaged] != "true" || len(img.Labels[LabelBinary]) != 64 || len(img.Labels[LabelShim]) != 64 {
		t.Fatalf("built image %+v: want tag %s and stormdock labels", img, tag)
	}
	info, err := cli.ImageInspect(ctx, img.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.User != "65534:65534" || !slices.Equal(info.Config.Cmd, []string{StormdockPath}) || len(info.Config.Entrypoint) != 0 {
		t.Fatalf("image config user %q cmd %v entrypoint %v", info.Config.User, info.Config.Cmd, info.Config.Entrypoint)
	}
	// The binaries are in it and run: each exits with the status it is asked for.
	for _, bin := range []string{StormdockPath, JobPath, ShimPath} {
		code := runOnce(t, cli, tag, bin, "exit", "7")
		if code != 7 {
			t.Fatalf("%s in the image exited %d, want 7", bin, code)
		}
	}
	list, err := m.List(ctx, labels)
	if err != nil || len(list) != 1 || list[0].ID != img.ID {
		t.Fatalf("list = %+v, %v; want the one image", list, err)
	}
	if err := m.Remove(ctx, tag); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if list, _ := m.List(ctx, labels); len(list) != 0 {
		t.Fatalf("image still listed after remove: %+v", list)
	}
}

// runOnce runs cmd in a container of ref and returns its exit code; the container is removed.
func runOnce(t *testing.T, cli *client.Client, ref string, cmd ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: ref, Cmd: cmd}, &container.HostConfig{NetworkMode: "host"}, nil, nil, "")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
	resc, errc := cli.ContainerWait(ctx, c.ID, container.WaitConditionNextExit)
	if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		t.Fatalf("start: %v", err)
	}
	select {
	case r := <-resc:
		return int(r.StatusCode)
	case err := <-errc:
		t.Fatalf("wait: %v", err)
	}
	return -1
}

func TestPruneKeepsUsed(t *testing.T) {
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	used, err := m.Build(ctx, BuildOptions{Tag: fmt.Sprintf("stormdock-test/used:%d", os.Getpid()), Binary: hog, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	// A different job binary makes a different image.
	unused, err := m.Build(ctx, BuildOptions{Tag: fmt.Sprintf("stormdock-test/unused:%d", os.Getpid()), Binary: hog, Job: hog, Labels: labels})
	if err != nil {
		t.Fatal(err)
	}
	if used.ID == unused.ID {
		t.Fatalf("two different builds gave one image %s", used.ID)
	}
	if used.Labels[LabelShim] != "" {
		t.Fatalf("an image of a binary with no stormdock-shim beside it says it has one: %v", used.Labels)
	}
	// A stopped (never started) container counts as a use.
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: used.ID, Cmd: []string{StormdockPath, "sleep"}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })
	removed, err := m.Prune(ctx, labels)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	if len(removed) != 1 || removed[0].ID != unused.ID {
		t.Fatalf("prune removed %+v, want only %s", removed, unused.ID)
	}
	left, err := m.List(ctx, labels)
	if err != nil || len(left) != 1 || left[0].ID != used.ID {
		t.Fatalf("left after prune: %+v, %v; want only %s", left, err, used.ID)
	}
}

func TestDynamicBinaryRefused(t *testing.T) {
	_, err := New(nil).Build(context.Background(), BuildOptions{Tag: "stormdock-test/never:1", Binary: "/bin/true"})
	if !errors.Is(err, ErrNotStatic) || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("build with a dynamic binary: %v, want ErrNotStatic saying how to build a static one", err)
	}
	t.Logf("dynamic: %v", err)
	if err := CheckStatic(hog); err != nil {
		t.Fatalf("the CGO_ENABLED=0 hog: %v", err)
	}
	if err := CheckStatic("/etc/hostname"); err == nil {
		t.Fatalf("a text file passed as a static binary")
	}
}

func TestDefaultBinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DefaultBinary()
	if CheckStatic(exe) == nil {
		if err != nil || got != exe {
			t.Fatalf("DefaultBinary = %q, %v; want the static test binary %s", got, err, exe)
		}
		return
	}
	if !errors.Is(err, ErrNotStatic) || !strings.Contains(err.Error(), "pass its path") {
		t.Fatalf("DefaultBinary of a dynamic test binary: %q, %v; want ErrNotStatic with advice", got, err)
	}
}

// A failing build step is reported from the engine's JSON stream, with its message.
func TestBuildErrorSurfaced(t *testing.T) {
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	df := "COPY stormdock /stormdock\nRUN [\"/stormdock\", \"exit\", \"3\"]\n"
	_, err := New(cli).build(ctx, df, map[string]string{"stormdock": hog}, "stormdock-test/fails:"+strconv.Itoa(os.Getpid()), labels)
	if !errors.Is(err, ErrBuild) || !strings.Contains(err.Error(), "non-zero code: 3") {
		t.Fatalf("build: %v, want ErrBuild with the engine's message", err)
	}
	t.Logf("build error: %v", err)
	// The layers the failed build left carry the labels, so prune finds them.
	m := New(cli)
	left, err := m.List(ctx, labels)
	if err != nil || len(left) == 0 {
		t.Fatalf("failed build left %v, %v; want its labelled layers listed", left, err)
	}
	if _, err := m.Prune(ctx, labels); err != nil {
		t.Fatal(err)
	}
	if left, err := m.List(ctx, labels); err != nil || len(left) != 0 {
		t.Fatalf("after prune: %v, %v; want nothing left", left, err)
	}
}

// The stream is always drained and closed, error or not.
func TestReadBuildDrains(t *testing.T) {
	for _, tc := range []struct {
		stream, id string
		fails      bool
	}{
		{`{"stream":"Step 1/2"}` + "\n" + `{"aux":{"ID":"sha256:abc"}}` + "\n" + `{"stream":"Successfully built"}`, "sha256:abc", false},
		{`{"stream":"Step 1/2"}` + "\n" + `{"errorDetail":{"message":"boom"},"error":"boom"}` + "\n" + `{"stream":"trailing"}`, "", true},
		{`{"stream":`, "", true},
	} {
		body := &trackingBody{r: strings.NewReader(tc.stream)}
		id, err := readBuild(body)
		if (err != nil) != tc.fails || id != tc.id {
			t.Errorf("readBuild(%q) = %q, %v", tc.stream, id, err)
		}
		if !body.closed || body.r.Len() != 0 {
			t.Errorf("readBuild(%q) left the body closed=%v with %d bytes unread", tc.stream, body.closed, body.r.Len())
		}
	}
}

type trackingBody struct {
	r      *strings.Reader
	closed bool
}

func (b *trackingBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *trackingBody) Close() error               { b.closed = true; return nil }

var _ io.ReadCloser = (*trackingBody)(nil)
