package docker

import (
	"context"
	"fmt"
	"time"

	"github.com/docker/docker/client"

	"github.com/stormdock/stormdock/isolation"
)

// Connect returns a client for the engine at host ("" means DOCKER_HOST, else the default
// socket) once the engine has answered a ping. The API version is negotiated, as the engines
// stormdock meets (20.10, API 1.41) are older than the client; DOCKER_API_VERSION in the
// environment turns negotiation off.
func Connect(ctx context.Context, host string) (*client.Client, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: docker client: %v: check DOCKER_HOST", isolation.ErrUnavailable, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: cannot reach dockerd at %s (%v): start dockerd or point DOCKER_HOST at a running engine",
			isolation.ErrUnavailable, cli.DaemonHost(), err)
	}
	return cli, nil
}

// Unreachable reports whether err is the engine not answering at all (dockerd stopped or
// restarting: no connection to its socket), as opposed to an answer refusing the request.
// An agent retries such starts at a short, fixed interval: the engine's return, not the
// worker or its image, decides when they succeed.
func Unreachable(err error) bool {
	return err != nil && client.IsErrConnectionFailed(err)
}
