package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/testenv"
)

// liveWorkers runs wordcount workers in this process the way agents run them: each with a
// live configuration file, rewritten and signalled on a change, stopped by cancelling (the
// SIGTERM drain).
type liveWorkers struct {
	t              *testing.T
	dir, in, out   string
	rate           float64
	mu             sync.Mutex
	running        map[int]*liveWorker
	wg             sync.WaitGroup
	epoch, workers int
	copies         int // workers started, for their configuration files' names
}

type liveWorker struct {
	conf   string
	reload chan struct{}
	cancel context.CancelFunc
	done   chan error
}

func (lw *liveWorkers) writeConfig(w *liveWorker, i int) {
	b, _ := json.Marshal(cluster.WorkerConfig{Job: "wc", Worker: i, Workers: lw.workers, Epoch: int64(lw.epoch)})
	tmp := w.conf + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		lw.t.Fatal(err)
	}
	if err := os.Rename(tmp, w.conf); err != nil {
		lw.t.Fatal(err)
	}
}

func (lw *liveWorkers) start(i int) { lw.startWith(i, nil) }

// startWith starts worker i, its configuration changed by mod (when not nil): a copy of
// its own, whose live configuration is a file of its own, as on another node.
func (lw *liveWorkers) startWith(i int, mod func(*Config)) *liveWorker {
	lw.copies++
	w := &liveWorker{conf: filepath.Join(lw.dir, fmt.Sprintf("config-%d-%d.json", i, lw.copies)), reload: make(chan struct{}, 1), done: make(chan error, 1)}
	lw.writeConfig(w, i)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	cfg := Config{Input: lw.in, Output: lw.out, ConfigFile: w.conf, Reload: w.reload, Worker: i, Workers: lw.workers,
		Job: "wc", Rate: lw.rate, Poll: 20 * time.Millisecond, Logger: quiet()}
	if mod != nil {
		mod(&cfg)
	}
	lw.running[i] = w
	lw.wg.Add(1)
	go func() {
		defer lw.wg.Done()
		w.done <- Run(ctx, cfg)
	}()
	return w
}

// scale changes the worker count as the master and agents do: the staying workers get the
// new configuration and a signal, the new ones start, the removed ones drain and stop.
func (lw *liveWorkers) scale(n int) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.epoch++
	lw.workers = n
	for i, w := range lw.running {
		if i < n {
			lw.writeConfig(w, i)
			w.reload <- struct{}{}
		}
	}
	for i := range n {
		if lw.running[i] == nil {
			lw.start(i)
		}
	}
	for i, w := range lw.running {
		if i >= n {
			w.cancel()
			if err := <-w.done; err != nil {
				lw.t.Errorf("worker %d: %v", i, err)
			}
			delete(lw.running, i)
		}
	}
}

func (lw *liveWorkers) stopAll() {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	for i, w := range lw.running {
		w.cancel()
		if err := <-w.done; err != nil {
			lw.t.Errorf("worker %d: %v", i, err)
		}
	}
	lw.running = map[int]*liveWorker{}
	lw.wg.Wait()
}

// offsets counts the records of each offset in the output, failing the test on a line that
// is no record: for the output once its writers have stopped.
func offsets(t *testing.T, path string) (map[int64]int, int) {
	t.Helper()
	return countRecords(t, path, false)
}

// offsetsSoFar counts like offsets while writers still append: a last line without its
// newline is a write in progress (an append is not atomic to a reader), not yet counted.
func offsetsSoFar(t *testing.T, path string) (map[int64]int, int) {
	t.Helper()
	return countRecords(t, path, true)
}

func countRecords(t *testing.T, path string, inProgress bool) (map[int64]int, int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return map[int64]int{}, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	if inProgress {
		b = b[:bytes.LastIndexByte(b, '\n')+1]
	}
	seen := map[int64]int{}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad output line %q: %v", sc.Text(), err)
		}
		seen[r.Offset]++
		n++
	}
	return seen, n
}

func writeLines(t *testing.T, path string, n int) {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "line %d of the storm %s\n", i, strings.Repeat("dock ", i%4))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Scaling a running word count from 4 to 8 to 3 workers mid-stream: every offset of the input
// is in the output exactly once.
func TestScaleMidStreamExactlyOnce(t *testing.T) {
	const lines = 20000
	dir := t.TempDir()
	lw := &liveWorkers{t: t, dir: dir, in: filepath.Join(dir, "input.txt"), out: filepath.Join(dir, "out.jsonl"),
		rate: 2000, running: map[int]*liveWorker{}, epoch: 1, workers: 4}
	writeLines(t, lw.in, lines)
	lw.mu.Lock()
	for i := range 4 {
		lw.start(i)
	}
	lw.mu.Unlock()
	defer lw.stopAll()
	progress := func(n int) func() bool {
		return func() bool { _, got := offsetsSoFar(t, lw.out); return got >= n }
	}
	testenv.Eventually(t, "a quarter of the input counted", 30*time.Second, progress(lines/4))
	lw.scale(8)
	testenv.Eventually(t, "half of the input counted", 30*time.Second, progress(lines/2))
	lw.scale(3)
	testenv.EventuallyWith(t, "every offset counted", time.Minute, func() (bool, string) {
		seen, n := offsetsSoFar(t, lw.out)
		return len(seen) == lines, fmt.Sprintf("%d offsets in %d records", len(seen), n)
	})
	lw.stopAll()
	seen, n := offsets(t, lw.out)
	for o := int64(0); o < lines; o++ {
		if seen[o] != 1 {
			t.Errorf("offset %d counted %d times", o, seen[o])
		}
	}
	if n != lines {
		t.Errorf("%d records for %d lines", n, lines)
	}
}

// A restarted worker resumes after its last record, and closes the epoch its crashed
// predecessor left open; a worker of an epoch already over runs nothing.
func TestLedgerRestartAndStale(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	l, err := openLedger(out, "i1")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, stale, err := l.join(1, 2, 0); err != nil || stale {
		t.Fatalf("join: stale %v, %v", stale, err)
	}
	if _, _, err := l.join(1, 2, 1); err != nil {
		t.Fatal(err)
	}
	// Worker 1 emitted offsets 1 and 3, then crashed: no stop.
	if err := os.WriteFile(out, []byte(`{"offset":1,"epoch":1,"worker":1}`+"\n"+`{"offset":3,"epoch":1,"worker":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Restarted in the same epoch it resumes after offset 3.
	if resume, _, err := l.join(1, 2, 1); err != nil || resume != 4 {
		t.Fatalf("resume = %d, %v; want 4", resume, err)
	}
	if err := l.stop(1, 0, 0); err != nil {
		t.Fatal(err)
	}
	// Epoch 2 cannot partition while worker 1 of epoch 1 has not handed over.
	if _, _, err := l.join(2, 3, 0); err != nil {
		t.Fatal(err)
	}
	if p, waiting, err := l.partition(2, 3); err != nil || p != nil || !strings.Contains(waiting, "worker 1 of epoch 1") {
		t.Fatalf("partition = %v, %q, %v; want to wait for worker 1", p, waiting, err)
	}
	// Worker 1, crashed again, comes back in epoch 2: it closes epoch 1 at 4.
	if _, _, err := l.join(2, 3, 1); err != nil {
		t.Fatal(err)
	}
	p, _, err := l.partition(2, 3)
	if err != nil || p == nil {
		t.Fatalf("partition after the handover: %v, %v", p, err)
	}
	for o, want := range map[int64][2]int64{0: {2, 0}, 1: {1, 1}, 3: {1, 1}, 5: {2, 2}, 6: {2, 0}, 2: {2, 2}} {
		if e, w := p.owner(o); e != want[0] || int64(w) != want[1] {
			t.Errorf("offset %d owned by worker %d of epoch %d, want %d of %d", o, w, e, want[1], want[0])
		}
	}
	// A worker still configured for epoch 1 is stale.
	if _, stale, err := l.join(1, 2, 0); err != nil || !stale {
		t.Fatalf("join of an old epoch: stale %v, %v", stale, err)
	}
}
