package wordcount

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Re-partitioning when the job's worker count changes, with every input offset counted
// exactly once.
//
// Workers take offset o when o % workers == worker. When the count changes (the live
// configuration's epoch grows), old and new workers must agree from which offset on the new
// partitioning applies, although each reads the input at its own pace and the removed ones
// are simply stopped. They agree through a ledger beside the shared output file
// (OUTPUT.ledger), appended under an exclusive flock that also covers every append of
// records to the output:
//
//	{"mark":"start","epoch":K,"workers":N,"worker":w}   worker w runs in epoch K (N workers)
//	{"mark":"stop","epoch":K,"worker":w,"next":d}       worker w emits nothing more in epoch K;
//	                                                    it emitted every offset it owns in K below d
//
// An old worker that learns of epoch K+1 (SIGHUP, or the file changing) flushes its records,
// writes its stop for K and its start for K+1 in one locked step; a removed worker writes its
// stop when SIGTERM drains it; a restarted worker closes its own index's unfinished epochs,
// taking d from the records of its index in the output. A start is written only while no
// later epoch has started: a worker whose epoch is already over finds that under the lock and
// runs nothing.
//
// Two copies of an index. stormdock runs an index as one process at a time except for a
// short, bounded overlap: a copy on a node cut off (or frozen) keeps running until its lease
// lapses and then drains, while its replacement has already started elsewhere. So each
// worker process is an instance with an id of its own, which its marks carry:
//
//	{"mark":"start","epoch":K,"workers":N,"worker":w,"instance":"I"}
//	{"mark":"stop","epoch":K,"worker":w,"instance":"I","next":d}
//
// and the ledger holds at most one open start per index and epoch. A joining instance closes
// whatever start of its index is still open (its predecessor's, in any epoch up to its own)
// before it writes its own, with d from the output; a stop closes only the start of its own
// instance, so a lapsed copy's late stop closes nothing of its replacement's. Every append
// of records to the output is made under the exclusive lock only while the writer's own
// start is the open one of its index and epoch: a copy whose start was closed by its
// replacement (superseded) emits nothing more, so the records of its drain never reach the
// output twice, and its replacement, which resumed after the last record of the index in the
// output, emits them once.
//
// Torn lines. A crash, a fatal signal or a full disk can cut a write short and leave a last
// line without its newline. Nothing is ever appended to such a line: under the exclusive
// lock a writer first seals a torn ledger line with a newline (a mark cut short has lost its
// closing brace, so it parses as nothing and counts for nothing; readers that follow the
// ledger by position keep their place), and cuts a torn output line off (a record whose
// write failed was never emitted: its writer reported the failure and wrote no stop after
// it). A failed append of records is cut off again at once.
//
// Epoch K+1 begins processing once every earlier epoch is closed (each of its indexes has
// stopped or never started). Offset o then belongs to the first epoch E, in order, whose
// candidate w = o % N_E had d_E(w) > o (it emitted o there); past every closed epoch, to the
// current one's o % N. So each offset has exactly one owner across any chain of changes
// (4 -> 8 -> 3), whatever each worker's progress: below its stop point an old owner kept it,
// at or above it passes on. Each worker emits its offsets in order and resumes after its
// index's last record, so its emitted offsets are a prefix of what it owns.
//
// What it needs: an output file all workers can read and lock (one host, or a shared
// filesystem with POSIX locks) and a drain on SIGTERM. A removed worker that dies without
// draining (its node lost at the moment of the scale-in) leaves its epoch open: the new epoch
// waits (logging which worker it waits for) until an operator scales back out over that
// index, whose new worker closes it.

// Ledger marks.
const (
	markStart = "start"
	markStop  = "stop"
)

type mark struct {
	Mark    string `json:"mark"`
	Epoch   int64  `json:"epoch"`
	Workers int    `json:"workers,omitempty"`
	Worker  int    `json:"worker"`
	// Instance is the worker process that wrote the start (and that a stop closes). Ledgers
	// written before instances have none: such a stop closes any start.
	Instance string `json:"instance,omitempty"`
	Next     int64  `json:"next,omitempty"`
}

// errSuperseded: another instance of the worker's index took over its epoch (see the
// ledger): this one must emit nothing more there.
var errSuperseded = errors.New("wordcount: another instance of this worker took over")

// epochState is one epoch as the ledger tells it.
type epochState struct {
	workers int
	last    map[int]mark // each index's last mark that counted
}

// ledger is the shared record of epochs beside an output file.
type ledger struct {
	f        *os.File // OUTPUT.ledger, read and appended
	out      string   // the output file, for a worker's own records
	instance string   // this worker process's id, in its marks
	pos      int64
	tail     []byte // bytes read after the last newline: a line being written, or torn
	epochs   map[int64]*epochState
	latest   int64
}

func openLedger(output, instance string) (*ledger, error) {
	f, err := os.OpenFile(output+".ledger", os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wordcount: ledger: %w", err)
	}
	return &ledger{f: f, out: output, instance: instance, epochs: map[int64]*epochState{}}, nil
}

func (l *ledger) Close() error { return l.f.Close() }

// lock takes the ledger's lock: exclusive for appends, shared for reads.
func (l *ledger) lock(exclusive bool) error {
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(l.f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func (l *ledger) unlock() { _ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN) }

// refresh reads the marks appended since the last read (the lock is held). A line that is no
// mark (a torn one, sealed) counts for nothing.
func (l *ledger) refresh() error {
	buf := make([]byte, 64<<10)
	for {
		n, err := l.f.ReadAt(buf, l.pos)
		l.pos += int64(n)
		l.tail = append(l.tail, buf[:n]...)
		if errors.Is(err, io.EOF) || n == 0 {
			break
		}
		if err != nil {
			return fmt.Errorf("wordcount: read ledger: %w", err)
		}
	}
	for {
		i := bytes.IndexByte(l.tail, '\n')
		if i < 0 {
			break
		}
		var m mark
		if err := json.Unmarshal(l.tail[:i], &m); err == nil {
			l.apply(m)
		}
		l.tail = l.tail[i+1:]
	}
	return nil
}

func (l *ledger) apply(m mark) {
	e := l.epochs[m.Epoch]
	if e == nil {
		e = &epochState{last: map[int]mark{}}
		l.epochs[m.Epoch] = e
	}
	if m.Mark == markStop {
		// A stop closes its own instance's start, and nothing else: a lapsed copy's late
		// stop leaves its replacement's start open.
		if cur, ok := e.last[m.Worker]; !ok || cur.Mark != markStart || !sameInstance(cur.Instance, m.Instance) {
			return
		}
	}
	if m.Mark == markStart {
		e.workers = m.Workers
		l.latest = max(l.latest, m.Epoch)
	}
	e.last[m.Worker] = m
}

// sameInstance reports whether a stop of instance b closes a start of instance a; marks of
// ledgers written before instances name none, and match any.
func sameInstance(a, b string) bool { return a == "" || b == "" || a == b }

// open returns the open start of worker in epoch, if any.
func (l *ledger) open(epoch int64, worker int) (mark, bool) {
	e := l.epochs[epoch]
	if e == nil {
		return mark{}, false
	}
	m, ok := e.last[worker]
	return m, ok && m.Mark == markStart
}

// holds reports whether this instance's start is the open one of worker in epoch.
func (l *ledger) holds(epoch int64, worker int) bool {
	m, ok := l.open(epoch, worker)
	return ok && m.Instance == l.instance
}

// append writes marks (the exclusive lock is held) and reads them back. A torn last line is
// sealed first, so that no mark is ever joined onto it.
func (l *ledger) append(ms ...mark) error {
	if err := l.refresh(); err != nil {
		return err
	}
	var b bytes.Buffer
	if len(l.tail) > 0 {
		// Under the exclusive lock no one is writing: these bytes are a torn line.
		b.WriteByte('\n')
	}
	for _, m := range ms {
		_ = json.NewEncoder(&b).Encode(m)
	}
	if _, err := l.f.Write(b.Bytes()); err != nil {
		return fmt.Errorf("wordcount: write ledger: %w", err)
	}
	return l.refresh()
}

// ownNext reads, from the output, 1 + the highest offset of worker's index in each epoch,
// whichever instance emitted it (the lock is held, so no record is half written).
func (l *ledger) ownNext(worker int) (map[int64]int64, error) {
	f, err := os.Open(l.out)
	if errors.Is(err, os.ErrNotExist) {
		return map[int64]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wordcount: read output: %w", err)
	}
	defer f.Close()
	next := map[int64]int64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var r struct {
			Offset int64 `json:"offset"`
			Worker int   `json:"worker"`
			Epoch  int64 `json:"epoch"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Worker == worker && r.Epoch > 0 {
			next[r.Epoch] = max(next[r.Epoch], r.Offset+1)
		}
	}
	return next, sc.Err()
}

// join enters epoch (workers of them) as worker, under the exclusive lock: it closes every
// start of its index still open up to epoch (a crashed predecessor's, or a lapsed copy's
// whose replacement this is), and starts this instance in epoch unless a later one has begun
// (stale: it must run nothing). It returns where the worker resumes in epoch.
func (l *ledger) join(epoch int64, workers, worker int) (resume int64, stale bool, err error) {
	if err := l.lock(true); err != nil {
		return 0, false, fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	defer l.unlock()
	if err := l.refresh(); err != nil {
		return 0, false, err
	}
	stale = l.latest > epoch
	var open []int64
	for e := range l.epochs {
		if m, ok := l.open(e, worker); ok && (e != epoch || stale || m.Instance != l.instance) {
			open = append(open, e)
		}
	}
	own, err := l.ownNext(worker)
	if err != nil {
		return 0, false, err
	}
	var ms []mark
	for _, e := range slices.Sorted(slices.Values(open)) {
		m, _ := l.open(e, worker)
		ms = append(ms, mark{Mark: markStop, Epoch: e, Worker: worker, Instance: m.Instance, Next: own[e]})
	}
	if !stale {
		ms = append(ms, mark{Mark: markStart, Epoch: epoch, Workers: workers, Worker: worker, Instance: l.instance})
	}
	if len(ms) > 0 {
		if err := l.append(ms...); err != nil {
			return 0, false, err
		}
	}
	return own[epoch], stale, nil
}

// stop ends worker's part in epoch: it emitted every offset it owns there below next. It
// writes nothing once this instance no longer holds the epoch (its replacement closed it).
func (l *ledger) stop(epoch int64, worker int, next int64) error {
	err := l.holding(epoch, worker, func() error {
		return l.append(mark{Mark: markStop, Epoch: epoch, Worker: worker, Instance: l.instance, Next: next})
	})
	if errors.Is(err, errSuperseded) {
		return nil
	}
	return err
}

// emit appends whole record lines to the output for worker in epoch, under the exclusive
// lock, only while this instance holds the epoch (errSuperseded otherwise: nothing is
// written). A torn last line is cut off first; a failed append is cut off again.
func (l *ledger) emit(out *os.File, epoch int64, worker int, lines []byte) error {
	return l.holding(epoch, worker, func() error { return appendLines(out, lines) })
}

// holding runs fn under the exclusive lock while this instance's start is the open one of
// worker's index in epoch, and returns errSuperseded without running it otherwise.
func (l *ledger) holding(epoch int64, worker int, fn func() error) error {
	if err := l.lock(true); err != nil {
		return fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	defer l.unlock()
	if err := l.refresh(); err != nil {
		return err
	}
	if !l.holds(epoch, worker) {
		return errSuperseded
	}
	return fn()
}

// heldByOther reports whether another instance holds worker's index in epoch now: a
// superseded instance waits while it does.
func (l *ledger) heldByOther(epoch int64, worker int) (bool, error) {
	err := l.readShared()
	m, ok := l.open(epoch, worker)
	return ok && m.Instance != l.instance, err
}

// readShared reads the marks appended since the last read, under the shared lock.
func (l *ledger) readShared() error {
	if err := l.lock(false); err != nil {
		return fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	defer l.unlock()
	return l.refresh()
}

// appendLines writes lines (whole, newline-ended) at the end of f, whose writers all hold one
// lock: a torn last line (no newline) is cut off first, so the first line never joins it,
// and a write that fails is cut off again.
func appendLines(f *os.File, lines []byte) error {
	end, err := cutTorn(f)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(lines, end); err != nil {
		if terr := f.Truncate(end); terr != nil {
			return fmt.Errorf("wordcount: write %s: %w (and cut it back: %v)", f.Name(), err, terr)
		}
		return fmt.Errorf("wordcount: write %s: %w", f.Name(), err)
	}
	return nil
}

// cutTorn cuts f after its last newline when it ends without one (a torn line), and returns
// its end.
func cutTorn(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("wordcount: %w", err)
	}
	size := fi.Size()
	end := size
	buf := make([]byte, 4096)
	for end > 0 {
		n := min(int64(len(buf)), end)
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return 0, fmt.Errorf("wordcount: read %s: %w", f.Name(), err)
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			end = end - n + int64(i) + 1
			break
		}
		end -= n
	}
	if end < size {
		if err := f.Truncate(end); err != nil {
			return 0, fmt.Errorf("wordcount: cut the torn last line of %s: %w", f.Name(), err)
		}
	}
	return end, nil
}

// partition is who owns which offset, once every epoch before the current one is closed.
type partition struct {
	epochs []closedEpoch
	epoch  int64
	n      int
}

type closedEpoch struct {
	epoch int64
	n     int
	next  map[int]int64 // d_E(w); absent: 0
}

// owner returns the epoch and worker that own offset o.
func (p *partition) owner(o int64) (int64, int) {
	for _, e := range p.epochs {
		w := int(o % int64(e.n))
		if o < e.next[w] {
			return e.epoch, w
		}
	}
	return p.epoch, int(o % int64(p.n))
}

// partition reads the ledger (shared lock) and returns the partitioning of epoch (n
// workers), or, while an earlier epoch is still open, the index it waits for.
func (l *ledger) partition(epoch int64, n int) (*partition, string, error) {
	if err := l.readShared(); err != nil {
		return nil, "", err
	}
	p := &partition{epoch: epoch, n: n}
	for _, e := range slices.Sorted(func(yield func(int64) bool) {
		for e := range l.epochs {
			if e < epoch && !yield(e) {
				return
			}
		}
	}) {
		st := l.epochs[e]
		if st.workers <= 0 {
			continue // no start mark: the epoch never ran
		}
		ce := closedEpoch{epoch: e, n: st.workers, next: map[int]int64{}}
		for w := range st.workers {
			m, ok := st.last[w]
			if ok && m.Mark == markStart {
				return nil, fmt.Sprintf("worker %d of epoch %d has not handed over yet", w, e), nil
			}
			if ok {
				ce.next[w] = m.Next
			}
		}
		p.epochs = append(p.epochs, ce)
	}
	return p, "", nil
}
