package wordcount

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// stormdock may run an index twice for a short, bounded time: a copy on a node cut off runs
// until its lease lapses and then drains, while its replacement already runs elsewhere. Here
// copy A of worker 1 is held in a write of its first batch (a drain that is slow to come:
// a frozen process, a slow disk), its lease lapses (SIGTERM: its context ends), its
// replacement B takes the epoch over and emits what A held; then A's held write comes
// through and A ends; then the job scales from 3 to 5 workers and the input grows. Every
// offset is in the output exactly once: A's drain wrote nothing, and its stop closed nothing
// of B's. The fault is injected (a hook holds A's write), not timed.
func TestLapsedCopyDrainsThroughAScale(t *testing.T) {
	const lines = 3000
	dir := t.TempDir()
	lw := &liveWorkers{t: t, dir: dir, in: filepath.Join(dir, "input.txt"), out: filepath.Join(dir, "out.jsonl"),
		running: map[int]*liveWorker{}, epoch: 1, workers: 3}
	writeLines(t, lw.in, lines)
	held, release := make(chan int, 1), make(chan struct{})
	var once sync.Once
	lw.mu.Lock()
	a := lw.startWith(1, func(cfg *Config) {
		cfg.beforeFlush = func(n int) {
			once.Do(func() {
				held <- n
				<-release
			})
		}
	})
	lw.start(0)
	lw.start(2)
	lw.mu.Unlock()
	defer lw.stopAll()
	n := <-held
	// A's lease lapses: SIGTERM, while its write is still held.
	a.cancel()
	// Its replacement starts (on another node, in the same epoch) and emits every offset of
	// worker 1, those A holds too.
	lw.mu.Lock()
	lw.start(1)
	lw.mu.Unlock()
	testenv.EventuallyWith(t, "every offset counted with A held", time.Minute, func() (bool, string) {
		seen, got := offsetsSoFar(t, lw.out)
		return len(seen) == lines, fmt.Sprintf("%d offsets in %d records", len(seen), got)
	})
	// A's held write comes through now, in its drain: it is refused, and A ends.
	close(release)
	if err := <-a.done; err != nil {
		t.Fatalf("copy A: %v", err)
	}
	if seen, got := offsets(t, lw.out); got != lines {
		t.Fatalf("after A's drain of %d records: %d records for %d offsets: the lapsed copy's drain reached the output", n, got, len(seen))
	}
	t.Logf("figure: the lapsed copy held a batch of %d records through its lapse and its replacement's takeover (both running meanwhile); duplicates in the output after its drain: 0", n)
	// The scale, and more input for the new partitioning.
	lw.scale(5)
	f, err := os.OpenFile(lw.in, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := lines; i < 2*lines; i++ {
		fmt.Fprintf(f, "line %d after the scale\n", i)
	}
	f.Close()
	testenv.EventuallyWith(t, "every offset counted after the scale", time.Minute, func() (bool, string) {
		seen, got := offsetsSoFar(t, lw.out)
		return len(seen) == 2*lines, fmt.Sprintf("%d offsets in %d records", len(seen), got)
	})
	lw.stopAll()
	seen, got := offsets(t, lw.out)
	for o := int64(0); o < 2*lines; o++ {
		if seen[o] != 1 {
			t.Errorf("offset %d counted %d times", o, seen[o])
		}
	}
	if got != 2*lines {
		t.Errorf("%d records for %d lines", got, 2*lines)
	}
	// The ledger: A's start was closed by B (in A's name), and no mark of A's came after.
	marks := ledgerMarks(t, lw.out)
	var aInst string
	for _, m := range marks {
		if m.Mark == markStart && m.Epoch == 1 && m.Worker == 1 {
			aInst = m.Instance
			break
		}
	}
	closedBy := -1
	for i, m := range marks {
		if m.Instance != aInst {
			continue
		}
		if m.Mark == markStop && closedBy < 0 {
			closedBy = i
		} else if closedBy >= 0 {
			t.Errorf("mark %d %+v of the lapsed copy after its start was closed", i, m)
		}
	}
	if closedBy < 0 {
		t.Errorf("the lapsed copy's start was never closed: %+v", marks)
	}
}

// ledgerMarks reads the ledger beside out; a line that is no mark fails the test.
func ledgerMarks(t *testing.T, out string) []mark {
	t.Helper()
	b, err := os.ReadFile(out + ".ledger")
	if err != nil {
		t.Fatal(err)
	}
	var ms []mark
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var m mark
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("ledger line %q: %v", line, err)
		}
		ms = append(ms, m)
	}
	return ms
}

// Two instances of one index: the one that joined last holds the epoch; the other's
// records and stop are refused, and a stop in its name written by anyone closes nothing of
// the holder's.
func TestLedgerInstances(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out.jsonl")
	open := func(inst string) *ledger {
		l, err := openLedger(out, inst)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := open("a"), open("b")
	outF, err := os.OpenFile(out, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer outF.Close()
	if _, _, err := a.join(1, 2, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.emit(outF, 1, 0, []byte(`{"offset":0,"epoch":1,"worker":0}`+"\n"+`{"offset":2,"epoch":1,"worker":0}`+"\n")); err != nil {
		t.Fatal(err)
	}
	// B, the replacement, joins the same epoch: it resumes after A's last record.
	if resume, stale, err := b.join(1, 2, 0); err != nil || stale || resume != 3 {
		t.Fatalf("B joins: resume %d, stale %v, %v; want 3", resume, stale, err)
	}
	if err := a.emit(outF, 1, 0, []byte(`{"offset":4,"epoch":1,"worker":0}`+"\n")); !errors.Is(err, errSuperseded) {
		t.Fatalf("A emits after B joined: %v; want errSuperseded", err)
	}
	if err := b.emit(outF, 1, 0, []byte(`{"offset":4,"epoch":1,"worker":0}`+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.stop(1, 0, 7); err != nil {
		t.Fatal(err)
	}
	// A stop in A's name, as a writer that does not check would append it, closes nothing.
	if err := a.lock(true); err != nil {
		t.Fatal(err)
	}
	err = a.append(mark{Mark: markStop, Epoch: 1, Worker: 0, Instance: "a", Next: 7})
	a.unlock()
	if err != nil {
		t.Fatal(err)
	}
	if held, err := a.heldByOther(1, 0); err != nil || !held {
		t.Fatalf("after A's stops: held by another %v, %v; want B's start still open", held, err)
	}
	if p, waiting, err := b.partition(2, 3); err != nil || p != nil || !strings.Contains(waiting, "worker 0 of epoch 1") {
		t.Fatalf("partition of epoch 2: %v, %q, %v; want it to wait for B", p, waiting, err)
	}
	if err := b.stop(1, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := b.stop(1, 1, 0); err != nil { // worker 1 never started: nothing to stop
		t.Fatal(err)
	}
	p, _, err := b.partition(2, 3)
	if err != nil || p == nil {
		t.Fatalf("partition after B's stop: %v, %v", p, err)
	}
	if e, w := p.owner(4); e != 1 || w != 0 {
		t.Errorf("offset 4 owned by worker %d of epoch %d; want B's (0 of 1)", w, e)
	}
	if e, w := p.owner(6); e != 2 || w != 0 {
		t.Errorf("offset 6 owned by worker %d of epoch %d; want 0 of 2 (B stopped at 5, not A's 7)", w, e)
	}
}

// A torn last line, as a crash leaves it, is never joined by the next write: the ledger's is
// sealed (a line of its own that counts for nothing, so that readers following the ledger by
// position keep their place), the output's is cut off, in the ledger worker's output and in
// the plain file sink's alike.
func TestTornTailsWrittenByHand(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	tornMark := `{"mark":"start","epoch":1,"workers":1,"wor`
	tornRecord := `{"offset":7,"epoch":1,"worker":0,"counts":{"li`
	good := `{"offset":0,"epoch":1,"worker":0,"workers":1,"counts":{}}` + "\n"
	if err := os.WriteFile(out+".ledger", []byte(tornMark), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte(good+tornRecord), 0o644); err != nil {
		t.Fatal(err)
	}
	// A reader that read the torn mark before anyone sealed it.
	follower, err := openLedger(out, "f")
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	if err := follower.lock(false); err != nil {
		t.Fatal(err)
	}
	if err := follower.refresh(); err != nil {
		t.Fatal(err)
	}
	follower.unlock()

	in := filepath.Join(dir, "input.txt")
	writeLines(t, in, 10)
	conf := filepath.Join(dir, "config.json")
	if err := os.WriteFile(conf, []byte(`{"job":"wc","worker":0,"workers":1,"epoch":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Input: in, Output: out, ConfigFile: conf, Workers: 1, Job: "wc", Poll: 20 * time.Millisecond, Logger: quiet()})
	}()
	testenv.EventuallyWith(t, "the ten lines counted (one was before)", 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(out)
		return bytes.Count(b, []byte("\n")) == 10 && bytes.HasSuffix(b, []byte("\n")), string(b)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	seen, n := offsets(t, out) // fails the test on a line that is no record
	if n != 10 || len(seen) != 10 {
		t.Errorf("%d records of %d offsets; want the ten lines once (the torn record cut)", n, len(seen))
	}
	b, _ := os.ReadFile(out + ".ledger")
	first, rest, _ := strings.Cut(string(b), "\n")
	if first != tornMark {
		t.Errorf("the ledger's first line is %q; want the torn mark sealed as it was", first)
	}
	var marks int
	for _, line := range strings.Split(strings.TrimSuffix(rest, "\n"), "\n") {
		var m mark
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("ledger line %q after the torn one is no mark: %v", line, err)
		}
		marks++
	}
	if marks != 2 {
		t.Errorf("%d marks after the torn line; want a start and a stop:\n%s", marks, b)
	}
	// The follower reads on from where it was and sees both.
	if err := follower.lock(false); err != nil {
		t.Fatal(err)
	}
	err = follower.refresh()
	follower.unlock()
	if m, ok := follower.epochs[1].last[0]; err != nil || !ok || m.Mark != markStop {
		t.Errorf("the follower's view of worker 0 in epoch 1: %+v, %v; want its stop", m, err)
	}

	// The plain file sink (no live configuration) on a file with a torn last record.
	plain := filepath.Join(dir, "plain.jsonl")
	if err := os.WriteFile(plain, []byte(good+tornRecord), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		done <- Run(ctx, Config{Input: in, Output: plain, Workers: 1, Poll: 20 * time.Millisecond, Logger: quiet()})
	}()
	testenv.EventuallyWith(t, "the plain sink's ten lines", 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(plain)
		return bytes.Count(b, []byte("\n")) == 11, string(b)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	lines := 0
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Errorf("plain sink line %q: %v", sc.Text(), err)
		}
		lines++
	}
	if lines != 11 {
		t.Errorf("%d lines in the plain sink; want the one before and the ten new", lines)
	}
}

// A full disk (a real tmpfs filled up) cuts writes short. The output: a worker's batch that
// does not fit fails the worker and is cut off again, and once there is space a new worker
// goes on after the last whole record, every offset exactly once and every line whole. The
// ledger: a mark cut short is sealed by the next writer, whose mark stays whole and counts.
func TestFullDiskLeavesNoJoinedLine(t *testing.T) {
	disk := testenv.Tmpfs(t, 1<<20)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "input.txt"), filepath.Join(disk, "out.jsonl")
	const lines = 4000
	writeLines(t, in, lines)
	filler := filepath.Join(disk, "filler")
	if err := os.WriteFile(filler, make([]byte, 3<<18), 0o600); err != nil { // 768 KiB
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "config.json")
	if err := os.WriteFile(conf, []byte(`{"job":"wc","worker":0,"workers":1,"epoch":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Input: in, Output: out, ConfigFile: conf, Workers: 1, Job: "wc", Poll: 20 * time.Millisecond, Logger: quiet()}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(time.Minute))
	defer cancel()
	err := Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("worker on a full disk: %v; want it to fail with the disk's error", err)
	}
	wholeLines(t, out)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The worker again (the agent restarts it), with space.
	ctx2, cancel2 := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(ctx2, cfg) }()
	testenv.EventuallyWith(t, "every offset counted after the disk had space again", time.Minute, func() (bool, string) {
		n := wholeLines(t, out)
		return n == lines, fmt.Sprintf("%d records", n)
	})
	cancel2()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	seen, n := offsets(t, out)
	for o := int64(0); o < lines; o++ {
		if seen[o] != 1 {
			t.Errorf("offset %d counted %d times", o, seen[o])
		}
	}
	if n != lines {
		t.Errorf("%d records for %d lines", n, lines)
	}

	// The ledger: padded so that the next mark straddles the end of its last page, which is
	// all the space a full disk leaves it.
	lpath := filepath.Join(disk, "l.jsonl")
	pad := strings.Repeat("#", 4096-30-1) + "\n"
	if err := os.WriteFile(lpath+".ledger", []byte(pad), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := openLedger(lpath, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	full := testenv.FillUp(t, disk)
	if _, _, err := l.join(1, 1, 0); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("join on a full disk: %v; want the disk's error", err)
	}
	b, _ := os.ReadFile(lpath + ".ledger")
	if torn := b[len(pad):]; len(torn) == 0 || bytes.HasSuffix(torn, []byte("\n")) {
		t.Fatalf("the mark on a full disk is %q; want it cut short (the test's padding is off)", torn)
	}
	if err := os.Remove(full); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.join(1, 1, 0); err != nil {
		t.Fatal(err)
	}
	fresh, err := openLedger(lpath, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if held, err := fresh.heldByOther(1, 0); err != nil || !held {
		t.Errorf("after the disk had space again: worker 0 held %v, %v; want the start written then", held, err)
	}
	b, _ = os.ReadFile(lpath + ".ledger")
	lastLines := strings.Split(strings.TrimSuffix(string(b[len(pad):]), "\n"), "\n")
	var m mark
	if len(lastLines) != 2 || json.Unmarshal([]byte(lastLines[1]), &m) != nil || m.Mark != markStart {
		t.Errorf("the ledger after the padding: %q; want the torn mark sealed, then the start whole", lastLines)
	}
}

// wholeLines counts the records of out, failing the test on a line that is no record or
// on a last line without its newline.
func wholeLines(t *testing.T, out string) int {
	t.Helper()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 0 && !bytes.HasSuffix(b, []byte("\n")) {
		t.Fatalf("%s ends in a torn line: %q", out, b[max(0, bytes.LastIndexByte(b, '\n')+1):])
	}
	_, n := offsets(t, out)
	return n
}
