package docker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/images"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/isolation/docker"
	"github.com/stormdock/stormdock/provision"
	pdocker "github.com/stormdock/stormdock/provision/docker"
	"github.com/stormdock/stormdock/provision/provisiontest"
)

// The image is built once for the package from a static stormdock binary and removed at
// the end.
var (
	imageOnce sync.Once
	imageTag  = fmt.Sprintf("stormdock/provision-test:%d", os.Getpid())
	imageErr  error
	imageUsed bool
)

func TestMain(m *testing.M) {
	code := m.Run()
	if imageUsed {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if dc, err := docker.Connect(ctx, ""); err == nil {
			removeLeftovers(ctx, dc)
			if err := images.New(dc).Remove(ctx, imageTag); err != nil {
				fmt.Fprintln(os.Stderr, "remove test image:", err)
			}
			dc.Close()
		}
		cancel()
	}
	testenv.RemoveBuilds()
	os.Exit(code)
}

// removeLeftovers removes every container a test of this process may have left.
func removeLeftovers(ctx context.Context, dc *client.Client) {
	ctrs, _ := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("ancestor", imageTag))})
	for _, c := range ctrs {
		_ = dc.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
	}
}

// engine connects to dockerd, skipping (failing under CI) when there is none.
func engine(t testing.TB) *client.Client {
	t.Helper()
	testenv.DockerSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := docker.Connect(ctx, "")
	if err != nil {
		testenv.Missing(t, "dockerd: %v", err)
	}
	t.Cleanup(func() { dc.Close() })
	return dc
}

// testImage builds the stormdock image once.
func testImage(t testing.TB, dc *client.Client) string {
	t.Helper()
	imageOnce.Do(func() {
		var bin string
		if bin, imageErr = testenv.Build("./cmd/stormdock"); imageErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		imageUsed = true
		// A label of this process's own: an image built alike elsewhere (the same binary,
		// by another package's test on this engine) would be the build cache's same image,
		// and a force removal of its id there would take this tag with it.
		_, imageErr = images.New(dc).Build(ctx, images.BuildOptions{Tag: imageTag, Binary: bin,
			Labels: map[string]string{"io.stormdock.test": fmt.Sprintf("provision-docker-%d", os.Getpid())}})
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageTag
}

func uniqueName(prefix string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// newProvider returns a provider with a token directory of the test's own, and a spec for
// a fresh cluster of small agents on the shared ZooKeeper (a chroot per cluster). Whatever
// the test leaves of the cluster is removed at its end.
func newProvider(t testing.TB, agents int) (*pdocker.Provider, provision.Spec, *client.Client) {
	t.Helper()
	dc := engine(t)
	zk := testenv.ZKAddr(t)
	img := testImage(t, dc)
	p, err := pdocker.New(pdocker.Config{API: dc, Tokens: provision.Tokens{Dir: t.TempDir()}, StartTimeout: 45 * time.Second, StateRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName("pt")
	spec := provision.Spec{
		Name: name, Agents: agents, DCs: []string{"dc-a"}, RacksPerDC: 3, Slots: 4,
		AgentMemory: 384 << 20, AgentCPU: 500, MasterMemory: 256 << 20, MasterCPU: 500,
		Image: img, Store: "zk://" + zk + "/stormdock-test-" + name, SessionTimeout: 2 * time.Second,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			logContainers(t, dc, name)
		}
		tokens := provision.Tokens{Dir: p.TokenDir()}
		creds, _ := tokens.StoreCredentials(name, false)
		_ = p.Destroy(ctx, name)
		ctrs, _ := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", pdocker.LabelCluster+"="+name))})
		for _, c := range ctrs {
			_ = dc.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}
		// The cluster's znodes open to its credentials alone.
		if s, err := coord.Open(ctx, "zk://"+zk, coord.Options{Credentials: creds, Logger: slog.New(slog.DiscardHandler)}); err == nil {
			_ = deleteTree(ctx, s, "/stormdock-test-"+name)
			s.Close()
		}
	})
	return p, spec, dc
}

func TestSuite(t *testing.T) {
	provisiontest.RunSuite(t, func(t *testing.T) provisiontest.Env {
		p, spec, _ := newProvider(t, 2)
		return provisiontest.Env{Provider: p, Spec: spec}
	})
}
