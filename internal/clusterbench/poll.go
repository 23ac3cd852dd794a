package clusterbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/stormdock/stormdock/api"
)

// PollCommand is the hidden subcommand (`stormdock bench poll`) that runs the pollers in a
// process of their own: a user's client runs on its own machine, not among ten thousand
// simulated agents, whose collector and scheduler its requests would otherwise wait for.
// It reads a PollSpec from stdin (the token with it, never on a command line) and writes
// PollSamples to stdout.
const PollCommand = "poll"

// PollSpec is what the pollers poll, and for how long.
type PollSpec struct {
	URL   string `json:"url"`
	Token string `json:"token"`
	// Clients poll at once for For, each in turn `job list`, `job status` of a job drawn
	// from Jobs, and with Metrics `job metrics` of another.
	Clients int           `json:"clients"`
	For     time.Duration `json:"for"`
	Jobs    []string      `json:"jobs"`
	Metrics bool          `json:"metrics"`
	Seed    uint64        `json:"seed"`
}

// PollSamples are each request's latency, as its client saw it.
type PollSamples struct {
	List    []time.Duration `json:"list"`
	Status  []time.Duration `json:"status"`
	Metrics []time.Duration `json:"metrics,omitempty"`
	Errors  int             `json:"errors"`
	// FirstError is the first failed request's error, for the report's log.
	FirstError string `json:"firstError,omitempty"`
}

// RunPollers runs spec's clients until For has passed or ctx ends.
func RunPollers(ctx context.Context, spec PollSpec) (PollSamples, error) {
	if spec.Clients < 1 || len(spec.Jobs) == 0 {
		return PollSamples{}, fmt.Errorf("poll: needs at least one client and one job, got %d and %d", spec.Clients, len(spec.Jobs))
	}
	var mu sync.Mutex
	var out PollSamples
	failed := func(err error) {
		if err != nil {
			out.Errors++
			if out.FirstError == "" {
				out.FirstError = err.Error()
			}
		}
	}
	deadline := time.Now().Add(spec.For)
	var wg sync.WaitGroup
	for i := range spec.Clients {
		cl, err := api.NewClient(spec.URL, spec.Token)
		if err != nil {
			return PollSamples{}, fmt.Errorf("poll: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(spec.Seed, uint64(i)))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				_, err := cl.Jobs(ctx)
				d := time.Since(t0)
				t1 := time.Now()
				_, err2 := cl.Job(ctx, spec.Jobs[rng.IntN(len(spec.Jobs))])
				d2 := time.Since(t1)
				var d3 time.Duration
				var err3 error
				if spec.Metrics {
					t2 := time.Now()
					_, err3 = cl.JobMetrics(ctx, spec.Jobs[rng.IntN(len(spec.Jobs))], nil, "")
					d3 = time.Since(t2)
				}
				mu.Lock()
				out.List, out.Status = append(out.List, d), append(out.Status, d2)
				if spec.Metrics {
					out.Metrics = append(out.Metrics, d3)
				}
				failed(err)
				failed(err2)
				failed(err3)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, ctx.Err()
}

// ServePoll is PollCommand's body: the spec from in, the samples to out.
func ServePoll(ctx context.Context, in io.Reader, out io.Writer) error {
	var spec PollSpec
	if err := json.NewDecoder(in).Decode(&spec); err != nil {
		return fmt.Errorf("poll: read the spec from stdin: %w", err)
	}
	s, err := RunPollers(ctx, spec)
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(s)
}

// pollApart runs spec's pollers as `binary bench poll`, a process of this machine: it
// inherits this process's cores (the agents' when pinned).
func pollApart(ctx context.Context, binary string, spec PollSpec) (PollSamples, error) {
	in, err := json.Marshal(spec)
	if err != nil {
		return PollSamples{}, err
	}
	cmd := exec.CommandContext(ctx, binary, "bench", PollCommand)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "STORMDOCK_STORE=")
	if err := cmd.Run(); err != nil {
		return PollSamples{}, fmt.Errorf("pollers' process (%s bench %s): %w: %s", binary, PollCommand, err, strings.TrimSpace(stderr.String()))
	}
	var s PollSamples
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		return PollSamples{}, fmt.Errorf("read the pollers' samples: %w", err)
	}
	return s, nil
}
