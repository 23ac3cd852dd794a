package images

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/stormdock/stormdock/internal/testenv"
)

// TestGCRemovesOnlyUnusedAboveCap: of five stormdock images, one is used by a (stopped)
// container, one is wanted by the agent, one was never pushed, two are unused and pushed.
// Nothing goes before the images were unused for the configured while; then, with a cap of
// one unused image, only the least recently used pushed one goes; a size cap takes the other;
// the used, wanted and never-pushed images stay throughout.
func TestGCRemovesOnlyUnusedAboveCap(t *testing.T) {
	reg := testenv.Registry(t)
	cli := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := testLabels(t)
	removeOnCleanup(t, cli, labels)
	m := New(cli)
	imgs := map[string]Image{}
	for _, name := range []string{"used", "wanted", "old", "newer", "local"} {
		tag := fmt.Sprintf("%s/stormdock-test/gc-%s-%d:1", reg, name, os.Getpid())
		imgs[name] = buildTagged(t, m, tag, labels, name)
		if name != "local" {
			if _, err := m.Push(ctx, tag, Progress{}); err != nil {
				t.Fatal(err)
			}
		}
		imgs[name] = imgs[name].withTag(tag)
	}
	c, err := cli.ContainerCreate(ctx, &container.Config{Image: imgs["used"].Tags[0], Cmd: []string{StormdockPath, "sleep"}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })

	now := time.Now()
	gc := m.NewGC(GCConfig{Keep: 1, Unused: time.Hour, Match: labels,
		Wanted: func() []string { return []string{imgs["wanted"].Tags[0], "127.0.0.1:9/not/here:1"} }})
	gc.now = func() time.Time { return now }
	if removed, err := gc.Collect(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("first collection removed %v, %v; want nothing: no image was unused for an hour yet", ids(removed), err)
	}
	// Half an hour on, a container uses "newer" for a while: it becomes the most recently
	// used of the unused images.
	now = now.Add(30 * time.Minute)
	c2, err := cli.ContainerCreate(ctx, &container.Config{Image: imgs["newer"].Tags[0], Cmd: []string{StormdockPath, "sleep"}}, nil, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := gc.Collect(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("second collection removed %v, %v; want nothing yet", ids(removed), err)
	}
	if err := cli.ContainerRemove(ctx, c2.ID, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(31 * time.Minute)
	removed, err := gc.Collect(ctx)
	if err != nil || !slices.Equal(ids(removed), []string{imgs["old"].ID}) {
		t.Fatalf("collection above the cap removed %v, %v; want only the least recently used %q", ids(removed), err, imgs["old"].ID)
	}
	// "newer" and "local" are unused now, over the cap of one, but "newer" was in use 31
	// minutes ago and "local" can never go. An hour later a size cap takes "newer".
	now = now.Add(time.Hour)
	gc.cfg.Keep, gc.cfg.MaxBytes = 0, 1
	removed, err = gc.Collect(ctx)
	if err != nil || !slices.Equal(ids(removed), []string{imgs["newer"].ID}) {
		t.Fatalf("collection above the size cap removed %v, %v; want %q", ids(removed), err, imgs["newer"].ID)
	}
	left, err := m.List(ctx, labels)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, img := range left {
		got = append(got, img.ID)
	}
	want := []string{imgs["used"].ID, imgs["wanted"].ID, imgs["local"].ID}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("left after collections: %v; want the used, wanted and never-pushed images %v", got, want)
	}
}

func (img Image) withTag(tag string) Image {
	if !slices.Contains(img.Tags, tag) {
		img.Tags = append(img.Tags, tag)
	}
	return img
}

func ids(imgs []Image) []string {
	out := []string{}
	for _, img := range imgs {
		out = append(out, img.ID)
	}
	return out
}
