package agents

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/docker/docker/client"
)

// A docker start the engine did not answer (dockerd stopped or restarting) is retried every
// engineRetry, whatever the failures before it, so the worker starts within a second of the
// engine's return; a start the engine or the registry refused keeps the doubling backoff.
// The error is a real one: the docker client against a socket nobody listens on.
func TestEngineUnreachableRetriedAtOnce(t *testing.T) {
	cli, err := client.NewClientWithOpts(client.WithHost("unix://"+filepath.Join(t.TempDir(), "docker.sock")), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	_, down := cli.Ping(context.Background())
	if down == nil {
		t.Fatal("a ping to a socket nobody listens on succeeded")
	}
	down = fmt.Errorf("inspect image x:1: %w", down) // as images wraps it
	refused := errors.New("pull x:1: manifest unknown")
	for _, c := range []struct {
		name string
		err  error
		want []time.Duration
	}{
		{"engine unreachable", down, []time.Duration{time.Second, time.Second, time.Second, time.Second, time.Second, time.Second, time.Second}},
		{"refused", refused, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &run{a: &Agent{cfg: Config{RestartBackoff: time.Second, MaxBackoff: time.Minute}}}
			for i, want := range c.want {
				if got := r.retryIn(i+1, c.err); got != want {
					t.Errorf("failure %d: retry in %s, want %s", i+1, got, want)
				}
			}
		})
	}
}
