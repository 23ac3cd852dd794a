// Package wordcount is stormdock's example streaming worker: it counts the words of its share
// of a replayable line source and emits one JSON record per input line, until SIGTERM.
package wordcount

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/multidc"
)

//go:embed sample.txt
var sample []byte

// Sample returns the embedded text read when no input file is given.
func Sample() []byte { return bytes.Clone(sample) }

// Record is what the worker emits for each of its input lines. Offset is the line's 0-based
// number in the source: a replayed source yields the same offsets, which lets a consumer
// (the output router of a mirrored job) de-duplicate.
type Record struct {
	Offset int64 `json:"offset"`
	// Epoch is the partitioning the record was emitted under (the live configuration's),
	// when the worker follows one.
	Epoch   int64          `json:"epoch,omitempty"`
	Worker  int            `json:"worker"`
	Workers int            `json:"workers"`
	Job     string         `json:"job,omitempty"`
	Link    string         `json:"link"`
	Counts  map[string]int `json:"counts"`
}

// Config configures a worker.
type Config struct {
	// Input is the line source; empty means the embedded sample, which is not followed.
	Input string
	// Output is a file the records are appended to. When empty, records are POSTed to
	// OutputURL if it is set, else written to Stdout.
	Output    string
	OutputURL string
	// ConfigFile is the worker's live configuration (STORMDOCK_CONFIG): a link worker
	// follows its job's routers there as they move; a worker writing to an output file
	// re-partitions when the worker count changes (ledger.go), others take the new count at
	// the offset they are at.
	ConfigFile string
	// Reload signals that ConfigFile changed (the agent sends SIGHUP); the file is also
	// looked at twice a second.
	Reload <-chan struct{}
	// OutputToken is the job's sender token, which the router asks of every request
	// (from the file STORMDOCK_OUTPUT_TOKEN_FILE names).
	OutputToken string
	Stdout      io.Writer
	// Rate caps the records emitted per second; 0 means unpaced.
	Rate float64
	// Metrics, when set, counts the records emitted and keeps the input backlog
	// (metrics.go).
	Metrics *Metrics
	// Worker and Workers say which lines are this worker's: offset % Workers == Worker.
	Worker, Workers int
	Job, Link       string
	// Poll is how often a followed file is checked for new lines. Default 200ms.
	Poll time.Duration
	// Drain bounds what a worker does after ctx is done: a POST in flight, then the final
	// flush. Default 5s.
	Drain  time.Duration
	Logger *slog.Logger

	// beforeFlush, in tests, runs before a ledger worker appends a batch of n records: a
	// write that is slow to come (a drain held up) is injected there.
	beforeFlush func(n int)
}

// ConfigFromEnv fills the identity of a worker from the stormdock worker contract:
// STORMDOCK_WORKER, STORMDOCK_WORKERS, STORMDOCK_JOB, STORMDOCK_LINK, STORMDOCK_OUTPUT when it
// is an http(s) URL (a link worker's routers, comma-separated), and STORMDOCK_CONFIG. A worker run by hand, without them, is worker 0 of 1.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{Worker: 0, Workers: 1, Job: getenv("STORMDOCK_JOB"), Link: getenv("STORMDOCK_LINK")}
	if v := getenv("STORMDOCK_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("STORMDOCK_WORKERS=%q: want a positive number", v)
		}
		cfg.Workers = n
	}
	if v := getenv("STORMDOCK_WORKER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n >= cfg.Workers {
			return cfg, fmt.Errorf("STORMDOCK_WORKER=%q: want 0..%d", v, cfg.Workers-1)
		}
		cfg.Worker = n
	}
	if v := getenv("STORMDOCK_OUTPUT"); strings.HasPrefix(v, "http://") || strings.HasPrefix(v, "https://") {
		cfg.OutputURL = v
	}
	cfg.ConfigFile = getenv("STORMDOCK_CONFIG")
	if path := getenv(multidc.EnvTokenFile); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", multidc.EnvTokenFile, err)
		}
		cfg.OutputToken = strings.TrimSpace(string(b))
	}
	return cfg, nil
}

// Mine reports whether the line at offset belongs to worker of workers.
func Mine(offset int64, worker, workers int) bool {
	return workers > 0 && offset%int64(workers) == int64(worker)
}

// Count counts the words of a line: runs of letters, digits and inner apostrophes, lower-cased.
func Count(line string) map[string]int {
	counts := map[string]int{}
	words := strings.FieldsFunc(line, func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\'' && r != '’'
	})
	for _, w := range words {
		w = strings.Trim(w, "'’")
		if w != "" {
			counts[strings.ToLower(w)]++
		}
	}
	return counts
}

// Run processes the source until ctx is done: its lines, then, for a file, every line appended
// later. When ctx is done it flushes what it has emitted (bounded by Drain) and returns nil; a
// line still being written (no newline yet) is left for the next run to replay.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Workers < 1 || cfg.Worker < 0 || cfg.Worker >= cfg.Workers {
		return fmt.Errorf("wordcount: worker %d of %d", cfg.Worker, cfg.Workers)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 5 * time.Second
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	prog := newProgress(cfg.Metrics, cfg.Input)
	defer prog.close()
	if cfg.Link != "" && (cfg.OutputURL != "" || cfg.ConfigFile != "") && cfg.Output == "" {
		return runLink(ctx, cfg, prog)
	}
	if IsJetStream(cfg.Input) {
		return fmt.Errorf("wordcount: --input %s: a JetStream input is read by the link workers of a mirrored job (links: and an output)", cfg.Input)
	}
	if cfg.ConfigFile != "" && cfg.Output != "" {
		return runLedger(ctx, cfg, prog)
	}
	var src io.Reader
	follow := false
	if cfg.Input == "" {
		src = bytes.NewReader(sample)
	} else {
		f, err := os.Open(cfg.Input)
		if err != nil {
			return fmt.Errorf("wordcount: %w", err)
		}
		defer f.Close()
		src, follow = f, true
	}
	// The drain starts when ctx ends or the run does; what is under way then (a POST in
	// flight) and the last flush share it.
	runCtx, endRun := context.WithCancel(ctx)
	defer endRun()
	sends, stopSends := ctxtime.Outlive(runCtx, cfg.Drain)
	defer stopSends()
	out, err := openSink(cfg, sends)
	if err != nil {
		return err
	}
	w := &worker{cfg: cfg, out: out, follow: follow, prog: prog}
	if cfg.ConfigFile != "" {
		// Without a shared output file there is nothing to agree through: a new worker count
		// applies from the offset this worker is at, so offsets near the change may be
		// counted twice or not at all (use an output file for exactly once).
		if w.live, err = newFollower(cfg.ConfigFile, cfg.Reload); err != nil {
			return err
		}
	}
	runErr := w.run(runCtx, bufio.NewReader(src))
	endRun()
	if err := out.Close(sends); err != nil {
		return errors.Join(runErr, fmt.Errorf("wordcount: drain: %w", err))
	}
	return runErr
}

type worker struct {
	cfg     Config
	out     sink
	follow  bool
	live    *follower
	prog    *progress
	emitted int64
	begin   time.Time
}

func (w *worker) run(ctx context.Context, r *bufio.Reader) error {
	w.begin = time.Now()
	var offset int64
	var partial []byte
	for {
		if ctx.Err() != nil {
			return nil
		}
		chunk, err := r.ReadBytes('\n')
		if err == nil {
			line := append(partial, chunk...)
			partial = nil
			if err := w.line(ctx, offset, line); err != nil {
				return err
			}
			offset++
			w.prog.at(offset, 0, w.cfg.Worker, w.cfg.Workers, false)
			continue
		}
		if !errors.Is(err, io.EOF) {
			return fmt.Errorf("wordcount: read: %w", err)
		}
		partial = append(partial, chunk...)
		if !w.follow && len(partial) > 0 {
			// The embedded sample is complete: its last line needs no newline.
			if err := w.line(ctx, offset, partial); err != nil {
				return err
			}
			offset++
			partial = nil
		}
		w.prog.at(offset, 0, w.cfg.Worker, w.cfg.Workers, true)
		// Idle: make what was emitted visible before waiting for more.
		if err := w.out.Flush(ctx); err != nil && ctx.Err() == nil {
			return err
		}
		wait := w.cfg.Poll
		if !w.follow {
			wait = time.Hour
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// line handles the line at offset: if it is this worker's, count it and emit its record.
func (w *worker) line(ctx context.Context, offset int64, line []byte) error {
	if w.live != nil {
		if c, ok := w.live.changed(); ok {
			w.cfg.Workers = c.Workers
		}
	}
	if !Mine(offset, w.cfg.Worker, w.cfg.Workers) {
		return nil
	}
	if w.cfg.Rate > 0 {
		w.begin = paced(w.begin, w.emitted, w.cfg.Rate)
		due := w.begin.Add(time.Duration(float64(w.emitted) / w.cfg.Rate * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			if err := w.out.Flush(ctx); err != nil && ctx.Err() == nil {
				return err
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil // this line stays unemitted: a replay emits it
			case <-t.C:
			}
		}
	}
	rec := Record{
		Offset: offset, Worker: w.cfg.Worker, Workers: w.cfg.Workers, Job: w.cfg.Job, Link: w.cfg.Link,
		Counts: Count(strings.TrimRight(string(line), "\r\n")),
	}
	if err := w.out.Write(ctx, rec); err != nil {
		return err
	}
	w.prog.done()
	w.emitted++
	return nil
}

// maxBurst is how much of the rate a worker that waited for input may catch up on: Rate
// is a cap, as a worker's capacity is, not a budget that grows while it idles.
const maxBurst = time.Second

// paced is the pacing start for emitted records at rate: begin, moved forward so that at
// most maxBurst of unused rate is left.
func paced[N int | int64](begin time.Time, emitted N, rate float64) time.Time {
	due := begin.Add(time.Duration(float64(emitted) / rate * float64(time.Second)))
	if late := time.Since(due); late > maxBurst {
		return begin.Add(late - maxBurst)
	}
	return begin
}
