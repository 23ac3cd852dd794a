package multidc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/internal/testenv"
)

// The kill tests re-execute the test binary as link workers and as routers, so that a
// SIGKILL kills a real process with real sockets.
const (
	envChild     = "MULTIDC_TEST_CHILD" // "link" or "router"
	envRouter    = "MULTIDC_TEST_ROUTER"
	envLink      = "MULTIDC_TEST_LINK"
	envWorker    = "MULTIDC_TEST_WORKER"
	envWorkers   = "MULTIDC_TEST_WORKERS"
	envFixture   = "MULTIDC_TEST_FIXTURE"
	envRate      = "MULTIDC_TEST_RATE"  // records per second of the whole input
	envEpoch     = "MULTIDC_TEST_EPOCH" // unix nanos when offset 0 became available
	envBeat      = "MULTIDC_TEST_HEARTBEAT"
	envStore     = "MULTIDC_TEST_STORE"
	envSink      = "MULTIDC_TEST_SINK"
	envListen    = "MULTIDC_TEST_LISTEN"
	envLinks     = "MULTIDC_TEST_LINKS"
	envTimeout   = "MULTIDC_TEST_HB_TIMEOUT"
	envCkptEvery = "MULTIDC_TEST_CHECKPOINT"
	envEnd       = "MULTIDC_TEST_END"      // file the test writes the input's final length to
	envSinkURL   = "MULTIDC_TEST_SINK_URL" // a fencing sink's URL, instead of envSink's file
	envSession   = "MULTIDC_TEST_SESSION"  // the router's store session timeout
)

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "link":
		os.Exit(linkChild())
	case "router":
		os.Exit(routerChild())
	}
	os.Exit(m.Run())
}

// linkWorker is one worker of a link: it replays a fixture, taking the lines with offset %
// workers == worker, posts them as records and sends heartbeats, like the example worker.
type linkWorker struct {
	router          string
	link            string
	worker, workers int
	lines           []string
	// The input is a stream: offset o becomes available at epoch + o/rate, so a restarted
	// worker catches up at full speed and then follows the stream, as with a Kafka topic.
	rate      float64
	epoch     time.Time
	heartbeat time.Duration
	batch     int
	// endFile, if set, ends the input: until the test writes a length into it the input is
	// the whole fixture, fed at rate; the test ends it once its kills are done, so that
	// the kills come mid-stream however slow the machine is.
	endFile string
}

// end returns the input's length as of now.
func (w *linkWorker) end() int64 {
	n := int64(len(w.lines))
	if w.endFile == "" {
		return n
	}
	b, err := os.ReadFile(w.endFile)
	if err != nil {
		return n
	}
	if e, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && e < n {
		return e
	}
	return n
}

func (w *linkWorker) run(ctx context.Context) error {
	s := NewSender(w.router, w.link, w.worker, w.workers)
	s.Token = testToken
	var start int64
	for {
		res, err := s.Heartbeat(ctx)
		if err == nil {
			start = res.NextOffset // resume where the sink stands
			break
		}
		if ctxtime.Sleep(ctx, 20*time.Millisecond) != nil {
			return nil
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { s.Heartbeats(hctx, w.heartbeat) })
	n := w.end()
	lastEndCheck := time.Now()
	off := firstOwned(start, w.worker, w.workers)
	var body bytes.Buffer
	for {
		if next, ok := s.Rewind(); ok {
			off = firstOwned(next, w.worker, w.workers) // the router restarted
		}
		if time.Since(lastEndCheck) > 20*time.Millisecond {
			n, lastEndCheck = w.end(), time.Now()
		}
		due := int64(float64(time.Since(w.epoch)) / float64(time.Second) * w.rate)
		if off >= n || off > due {
			// Idle (input exhausted or not yet available): keep beating, and watch for a
			// router restart, which means replaying from its position.
			if ctxtime.Sleep(ctx, 5*time.Millisecond) != nil {
				return nil
			}
			continue
		}
		body.Reset()
		next := off
		for k := 0; k < w.batch && next < n && next <= due; k++ {
			fmt.Fprintf(&body, `{"offset":%d,"link":%q,"worker":%d,"line":%q}`+"\n", next, w.link, w.worker, w.lines[next])
			next += int64(w.workers)
		}
		err := s.Send(ctx, body.Bytes())
		var restart *RestartError
		switch {
		case err == nil:
			off = next
		case errors.As(err, &restart):
			off = firstOwned(restart.NextOffset, w.worker, w.workers)
		case ctx.Err() != nil:
			return nil
		default:
			return err
		}
	}
}

func linkChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	lines, err := readFixture(os.Getenv(envFixture))
	if err != nil {
		fmt.Fprintln(os.Stderr, "link child:", err)
		return 2
	}
	atoi := func(k string) int { n, _ := strconv.Atoi(os.Getenv(k)); return n }
	rate, _ := strconv.ParseFloat(os.Getenv(envRate), 64)
	epoch, _ := strconv.ParseInt(os.Getenv(envEpoch), 10, 64)
	beat, _ := time.ParseDuration(os.Getenv(envBeat))
	w := &linkWorker{
		router: os.Getenv(envRouter), link: os.Getenv(envLink),
		worker: atoi(envWorker), workers: atoi(envWorkers),
		lines: lines, rate: rate, epoch: time.Unix(0, epoch), heartbeat: beat, batch: 64,
		endFile: os.Getenv(envEnd),
	}
	if err := w.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "link child:", err)
		return 1
	}
	return 0
}

func routerChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	session := time.Second
	if d, err := time.ParseDuration(os.Getenv(envSession)); err == nil {
		session = d
	}
	store, err := coord.Open(ctx, os.Getenv(envStore), coord.Options{SessionTimeout: session, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "router child:", err)
		return 2
	}
	defer store.Close()
	timeout, _ := time.ParseDuration(os.Getenv(envTimeout))
	every, _ := time.ParseDuration(os.Getenv(envCkptEvery))
	cfg := Config{
		Job: "wordcount", Links: strings.Split(os.Getenv(envLinks), ","), Store: store, TokenHash: testTokenHash,
		Listen: os.Getenv(envListen), HeartbeatTimeout: timeout, CheckpointInterval: every, Logger: log,
	}
	if raw := os.Getenv(envSinkURL); raw != "" {
		cfg.TakeOver = Fences(raw)
		cfg.OpenSink = func(ctx context.Context, _ *SinkEvidence) (Sink, error) {
			return OpenSink(ctx, raw, SinkOptions{Job: "wordcount", Router: os.Getenv(envListen), Logger: log})
		}
	} else {
		if cfg.Sink, err = openTestFileSink(os.Getenv(envSink), FsyncCheckpoint); err != nil {
			fmt.Fprintln(os.Stderr, "router child:", err)
			return 2
		}
	}
	r, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "router child:", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "router child:", err)
		return 1
	}
	return 0
}

// writeFixture writes n input lines and returns the file and its lines.
func writeFixture(t testing.TB, n int) (string, []string) {
	t.Helper()
	lines := make([]string, n)
	var b strings.Builder
	for i := range lines {
		h := fnv.New64a()
		fmt.Fprint(h, i)
		lines[i] = fmt.Sprintf("line %d the quick brown fox %x", i, h.Sum64())
		b.WriteString(lines[i])
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "input.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, lines
}

func readFixture(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n"), nil
}

// child is a re-executed test binary.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
}

// startChild runs the test binary as a child with env added; it is SIGKILLed at cleanup.
func startChild(t testing.TB, name string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	c := &child{name: name, cmd: cmd, out: &testenv.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

// kill SIGKILLs the child and reaps it.
func (c *child) kill() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop SIGTERMs the child and waits up to d before killing it.
func (c *child) stop(d time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(d):
		c.kill()
	}
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
