package docker_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/stormdock/stormdock/coord"
	pdocker "github.com/stormdock/stormdock/provision/docker"
)

func deleteTree(ctx context.Context, kv coord.KV, key string) error {
	return coord.DeleteTree(ctx, kv, key)
}

// logContainers logs the tail of every container of a cluster, for failed tests.
func logContainers(t testing.TB, dc *client.Client, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctrs, _ := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", pdocker.LabelCluster+"="+name))})
	for _, c := range ctrs {
		rc, err := dc.ContainerLogs(ctx, c.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true, Tail: "30"})
		if err != nil {
			continue
		}
		var out bytes.Buffer
		_, _ = stdcopy.StdCopy(&out, &out, rc)
		rc.Close()
		t.Logf("container %v (%s):\n%s", c.Names, c.State, out.String())
	}
}

// leftovers lists what a cluster left on the engine: containers, networks and volumes
// carrying its label.
func leftovers(t testing.TB, dc *client.Client, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", pdocker.LabelCluster+"="+name))
	var out []string
	ctrs, err := dc.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs {
		out = append(out, fmt.Sprintf("container %v", c.Names))
	}
	nets, err := dc.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nets {
		out = append(out, "network "+n.Name)
	}
	vols, err := dc.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Volumes {
		out = append(out, "volume "+v.Name)
	}
	return out
}
