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

// The benchmark's API clients (the submission and the pollers) run in a process of their
// own, as hidden subcommands of this binary: a user's client runs on its own machine, not
// among ten thousand simulated agents, whose scheduler and collector its requests would
// otherwise wait for. At ten thousand nodes a submission from the agents' process took up
// to three minutes, a reconcile of part of the jobs each of its seconds, and the agents
// that took them further behind. Each reads its task as JSON from stdin (the token with it,
// never on a command line) and writes its outcome to stdout.
const (
	PollCommand   = "poll"   // `stormdock bench poll`: PollSpec in, PollSamples out
	SubmitCommand = "submit" // `stormdock bench submit`: SubmitSpec in, SubmitResult out
)

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

// SubmitSpec is a submission: each job's spec, Parallel at once.
type SubmitSpec struct {
	URL      string            `json:"url"`
	Token    string            `json:"token"`
	Jobs     []json.RawMessage `json:"jobs"`
	Parallel int               `json:"parallel"`
}

// SubmitResult is how long the submission took, as its client saw it.
type SubmitResult struct {
	Seconds float64 `json:"seconds"`
}

// Submit submits spec's jobs and stops at the first refused.
func Submit(ctx context.Context, spec SubmitSpec) (SubmitResult, error) {
	cl, err := api.NewClient(spec.URL, spec.Token)
	if err != nil {
		return SubmitResult{}, fmt.Errorf("submit: %w", err)
	}
	start := time.Now()
	err = parallel(ctx, len(spec.Jobs), max(1, spec.Parallel), func(i int) error {
		_, err := cl.SubmitJob(ctx, spec.Jobs[i])
		return err
	})
	return SubmitResult{Seconds: time.Since(start).Seconds()}, err
}

// ServeClient is the body of the hidden subcommand command (PollCommand or SubmitCommand):
// its task from in, its outcome to out.
func ServeClient(ctx context.Context, command string, in io.Reader, out io.Writer) error {
	var res any
	var err error
	switch command {
	case PollCommand:
		var spec PollSpec
		if err := json.NewDecoder(in).Decode(&spec); err != nil {
			return fmt.Errorf("poll: read the spec from stdin: %w", err)
		}
		res, err = RunPollers(ctx, spec)
	case SubmitCommand:
		var spec SubmitSpec
		if err := json.NewDecoder(in).Decode(&spec); err != nil {
			return fmt.Errorf("submit: read the jobs from stdin: %w", err)
		}
		res, err = Submit(ctx, spec)
	default:
		return fmt.Errorf("no client command %q", command)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(out).Encode(res)
}

// runApart runs `binary bench command` with task on its stdin, and reads its outcome into
// out: a process of this machine, on this process's cores (the agents' when pinned).
func runApart(ctx context.Context, binary, command string, task, out any) error {
	in, err := json.Marshal(task)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, binary, "bench", command)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "STORMDOCK_STORE=")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s (%s bench %s): %w: %s", command, binary, command, err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("read the outcome of bench %s: %w", command, err)
	}
	return nil
}
