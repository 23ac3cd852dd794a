package docker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/provision"
)

// TestDockerWorkers: the agents of a cluster created with docker workers run a docker job
// whose image is only in the registry: each agent pulls it, the master pins it, and destroy
// leaves no worker container behind.
func TestDockerWorkers(t *testing.T) {
	reg := testenv.Registry(t)
	p, spec, dc := newProvider(t, 2)
	spec.DockerWorkers = true
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	tag := fmt.Sprintf("%s/stormdock-test/provision-worker-%d:1", reg, os.Getpid())
	m := images.New(dc)
	img, err := m.Build(ctx, images.BuildOptions{Tag: tag, Binary: bin, Labels: map[string]string{"io.stormdock.test": "provision-worker"}})
	if err != nil {
		t.Fatal(err)
	}
	dgst, err := m.Push(ctx, tag, images.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	drop := func() {
		if _, err := dc.ImageRemove(context.Background(), img.ID, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Logf("remove %s: %v", img.ID, err)
		}
	}
	drop()
	t.Cleanup(drop)

	c, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	cl := apiClient(t, provision.Tokens{Dir: p.TokenDir()}, c)
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Labels["isolation/docker"] != "true" {
			t.Fatalf("node %s labels %v: want isolation/docker=true", n.ID, n.Labels)
		}
	}
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		t.Fatal(err)
	}
	job := fmt.Sprintf(`name: wc
tenant: t1
workers: 2
isolation: docker
image: %s
resources: {memory: 32Mi, cpu: 0.05}
command: [stormdock, worker, wordcount, --rate, "5"]
placement: {spread: [node]}
gracePeriod: 2s
`, tag)
	rec, err := cl.SubmitJob(ctx, []byte(job))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := images.ParseRef(tag)
	pinned, _ := r.WithDigest(dgst)
	if rec.Image == nil || rec.Image.Ref != pinned {
		t.Fatalf("submitted job's image pin %+v; want %s", rec.Image, pinned)
	}
	ws := settled(t, cl, 2, 90*time.Second)
	if ws[0].node == ws[1].node {
		t.Errorf("both workers on %s; want one per node", ws[0].node)
	}
	workers := func() []container.Summary {
		cs, err := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelJob+"=wc"))})
		if err != nil {
			t.Fatal(err)
		}
		var out []container.Summary
		for _, x := range cs {
			if strings.HasPrefix(x.Labels[docker.LabelNode], spec.Name+"-") {
				out = append(out, x)
			}
		}
		return out
	}
	if got := workers(); len(got) != 2 {
		t.Fatalf("%d worker containers of the cluster; want 2", len(got))
	}
	for _, w := range workers() {
		if w.ImageID != img.ID || w.Image != pinned {
			t.Errorf("worker container %s runs %s (%s); want %s by %s", w.Names, w.ImageID, w.Image, img.ID, pinned)
		}
	}
	if err := p.Destroy(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if left := workers(); len(left) != 0 {
		t.Errorf("destroy left %d worker containers", len(left))
	}
}
