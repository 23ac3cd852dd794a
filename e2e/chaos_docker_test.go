package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/internal/testenv"
)

var chaosDocker = flag.Bool("chaos.docker", true, "TestChaos also runs a docker job whose workers run their image's own command (needs dockerd: without it the run goes on without, unless CI=true)")

// dockerChaos is the chaos run's docker job (issue 28): workers that run their image's own CMD
// under the lease launcher mounted into their containers, spread over the data centers, held
// to the same fencing bound and recovery as the others, found from the engine's container
// cgroups and /proc.
type dockerChaos struct {
	cli     *client.Client
	job     string
	workers int
	fence   *fenceWatch
}

// chaosDockerAvailable says whether the run has a docker job: -chaos.docker and a dockerd (a
// missing one fails under CI=true, and is noted otherwise).
func chaosDockerAvailable(t *testing.T) (bool, string) {
	if !*chaosDocker {
		return false, "no docker job (-chaos.docker=false)"
	}
	if err := dockerAnswers(); err != nil {
		if testenv.CI() {
			t.Fatalf("required real part missing (CI=true): dockerd for the chaos run's docker job: %v", err)
		}
		return false, fmt.Sprintf("no docker job: dockerd: %v", err)
	}
	return true, ""
}

// dockerAnswers pings the engine.
func dockerAnswers() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Ping(ctx)
	return err
}

// startDockerChaos builds the image (no registry: on this engine), submits the job and waits
// until each worker runs once.
func startDockerChaos(t *testing.T, lc *labCluster, workers int) *dockerChaos {
	d := &dockerChaos{cli: dockerClient(t), job: fmt.Sprintf("chaosown%d", os.Getpid()), workers: workers}
	tag := sharedOwnImage(t, d.cli)
	t.Cleanup(func() { removeJobContainers(d.cli, d.job) })
	lc.submit(t, []byte(fmt.Sprintf("name: %s\ntenant: e2e\nworkers: %d\nisolation: docker\nimage: %s\n"+
		"resources: {memory: 32Mi, cpu: 0.05}\nplacement: {spread: [dc, rack]}\ngracePeriod: 2s\n", d.job, workers, tag)))
	var cid string
	testenv.EventuallyWith(t, "a container of the chaos run's docker job", 90*time.Second, func() (bool, string) {
		for _, id := range runningContainers(t, d.cli, d.job) {
			cid = id
		}
		return cid != "", "none running"
	})
	findContainerCgroups(t, d.cli, cid)
	testenv.EventuallyWith(t, "the docker job's workers running once each", 90*time.Second, func() (bool, string) {
		return d.running(), fmt.Sprintf("%v", containerProcs(d.job))
	})
	d.fence = watchFenceOf(t, d.job, fencingBound(lc.Session, labJobGrace), containerProcs)
	return d
}

// running reports whether every worker of the docker job runs as one process.
func (d *dockerChaos) running() bool {
	ps := containerProcs(d.job)
	if len(ps) != d.workers {
		return false
	}
	for _, p := range ps {
		if len(p) != 1 {
			return false
		}
	}
	return true
}
