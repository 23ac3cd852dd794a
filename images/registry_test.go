package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/internal/testenv"
)

// removeAll removes an image from the engine under every tag, as if it had never been here.
func removeAll(t testing.TB, cli *client.Client, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.ImageRemove(ctx, id, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !errdefs.IsNotFound(err) {
		t.Fatalf("remove %s: %v", id, err)
	}
}

// buildTagged builds an image of hog (a different one for every extra label value) under tag.
func buildTagged(t *testing.T, m *Manager, tag string, labels map[string]string, variant string) Image {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := map[string]string{"io.stormdock.test.variant": variant}
	for k, v := range labels {
		l[k] = v
	}
	img, err := m.Build(ctx, BuildOptions{Tag: tag, Binary: hog, Labels: l})
	if err != nil {
		t.Fatalf("build %s: %v", tag, err)
	}
	return img
}

// TestPushPullPinned pushes to the shared registry, resolves the tag to the pushed digest,
// pulls the image back by digest after removing it, and shows that a digest keeps naming the
// same bytes after its tag is moved to another image.
func TestPushPullPinned(t *testing.T) {
	reg := testenv.Registry(t)
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	tag := fmt.Sprintf("%s/stormdock-test/pinned-%d:1", reg, os.Getpid())
	first := buildTagged(t, m, tag, labels, "1")

	t0 := time.Now()
	dgst, err := m.Push(ctx, tag, Progress{})
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	t.Logf("push of a %.1f MB image to %s: %v", float64(first.Size)/1e6, reg, time.Since(t0).Round(time.Millisecond))
	list, err := m.List(ctx, labels)
	if err != nil || len(list) != 1 || !slices.Contains(list[0].Digests, strings.Split(tag, ":1")[0]+"@"+dgst) {
		t.Fatalf("list after push = %+v, %v; want the digest %s", list, err, dgst)
	}
	res := &Resolver{}
	got, err := res.Resolve(ctx, tag)
	if err != nil || got != dgst {
		t.Fatalf("resolve %s = %q, %v; want the pushed digest %s", tag, got, err, dgst)
	}

	p, _ := ParseRef(tag)
	pinned, err := p.WithDigest(dgst)
	if err != nil {
		t.Fatal(err)
	}
	removeAll(t, cli, first.ID)
	if ok, err := m.Has(ctx, pinned); ok || err != nil {
		t.Fatalf("Has(%s) after removal = %v, %v", pinned, ok, err)
	}
	if err := m.Pull(ctx, pinned, Progress{}); err != nil {
		t.Fatalf("pull %s: %v", pinned, err)
	}
	info, err := cli.ImageInspect(ctx, pinned)
	if err != nil || info.ID != first.ID {
		t.Fatalf("pulled %s is %q, %v; want %s", pinned, info.ID, err, first.ID)
	}

	// Move the tag to another image: the tag resolves to the new digest, the old digest
	// still pulls the old bytes.
	second := buildTagged(t, m, tag, labels, "2")
	if second.ID == first.ID {
		t.Fatal("two variants built one image")
	}
	moved, err := m.Push(ctx, tag, Progress{})
	if err != nil || moved == dgst {
		t.Fatalf("push of the moved tag = %s, %v; want a new digest", moved, err)
	}
	if got, err := res.Resolve(ctx, tag); err != nil || got != moved {
		t.Fatalf("resolve after the move = %s, %v; want %s", got, err, moved)
	}
	removeAll(t, cli, first.ID)
	if err := m.Pull(ctx, pinned, Progress{}); err != nil {
		t.Fatal(err)
	}
	if info, err := cli.ImageInspect(ctx, pinned); err != nil || info.ID != first.ID {
		t.Fatalf("pinned %s after the tag moved is %q, %v; want the first image %s", pinned, info.ID, err, first.ID)
	}
}

// TestRegistryErrors: a stopped registry and an unknown tag give one-line errors that name
// the registry, for push, pull and resolve alike.
func TestRegistryErrors(t *testing.T) {
	srv := testenv.StartRegistry(t, nil)
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	tag := srv.Addr + "/stormdock-test/errors:1"
	buildTagged(t, m, tag, labels, "errors")

	unknown := srv.Addr + "/stormdock-test/errors:nope"
	_, rerr := (&Resolver{}).Resolve(ctx, unknown)
	perr := m.Pull(ctx, unknown, Progress{})
	for what, err := range map[string]error{"resolve": rerr, "pull": perr} {
		if !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "registry "+srv.Addr) || !strings.Contains(err.Error(), "manifest unknown") {
			t.Errorf("%s of an unknown tag: %v; want ErrUnknown naming the registry with its answer", what, err)
		}
		oneLine(t, err)
	}

	srv.Stop()
	_, perr = m.Push(ctx, tag, Progress{})
	_, rerr = (&Resolver{}).Resolve(ctx, tag)
	lerr := m.Pull(ctx, tag+"x", Progress{})
	for what, err := range map[string]error{"push": perr, "resolve": rerr, "pull": lerr} {
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "registry "+srv.Addr) || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s with the registry stopped: %v; want ErrUnreachable naming %s as refusing", what, err, srv.Addr)
		}
		oneLine(t, err)
	}
	t.Logf("refused: %v", perr)
	srv.Start()
	if _, err := m.Push(ctx, tag, Progress{}); err != nil {
		t.Fatalf("push once the registry is back: %v", err)
	}
}

func oneLine(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
}

// TestRegistryAuth: a registry with basic auth refuses anonymous and wrong credentials with
// an error naming it, and takes those of the auth file; no error shows the password.
func TestRegistryAuth(t *testing.T) {
	const user, pass = "bars", "s3cret-pw-7"
	srv := testenv.StartRegistry(t, map[string]string{user: pass})
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	tag := srv.Addr + "/stormdock-test/auth:1"
	buildTagged(t, New(cli), tag, labels, "auth")

	good, err := LoadAuth(srv.AuthFile(user, pass))
	if err != nil {
		t.Fatal(err)
	}
	bad, err := LoadAuth(srv.AuthFile(user, "wrong-pw"))
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, a := range []*Auth{nil, bad} {
		_, err := New(cli, WithAuth(a)).Push(ctx, tag, Progress{})
		if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "registry "+srv.Addr) {
			t.Errorf("push with auth %v: %v; want ErrUnauthorized naming the registry", a != nil, err)
		}
		errs = append(errs, err)
	}
	dgst, err := New(cli, WithAuth(good)).Push(ctx, tag, Progress{})
	if err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	for _, a := range []*Auth{nil, bad} {
		_, err := (&Resolver{Auth: a}).Resolve(ctx, tag)
		if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), srv.Addr) {
			t.Errorf("resolve with auth %v: %v; want ErrUnauthorized naming the registry", a != nil, err)
		}
		errs = append(errs, err)
	}
	if got, err := (&Resolver{Auth: good}).Resolve(ctx, tag); err != nil || got != dgst {
		t.Fatalf("resolve with credentials = %s, %v; want %s", got, err, dgst)
	}
	m := New(cli, WithAuth(good))
	p, _ := ParseRef(tag)
	pinned, _ := p.WithDigest(dgst)
	info, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	removeAll(t, cli, info.ID)
	errs = append(errs, New(cli).Pull(ctx, pinned, Progress{}))
	if !errors.Is(errs[len(errs)-1], ErrUnauthorized) {
		t.Errorf("anonymous pull: %v; want ErrUnauthorized", errs[len(errs)-1])
	}
	if err := m.Pull(ctx, pinned, Progress{}); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	for _, err := range errs {
		oneLine(t, err)
		if err != nil && (strings.Contains(err.Error(), pass) || strings.Contains(err.Error(), "wrong-pw")) {
			t.Errorf("error shows a password: %v", err)
		}
	}
	t.Logf("unauthorized: %v", errs[0])
}
