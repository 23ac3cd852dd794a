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
// stop when SIGTERM drains it; a restarted worker closes its own index's unfinished epochs
// (it is the only copy: stormdock never runs an index twice), taking d from its records in
// the output. A start is written only while no later epoch has started: a worker whose
// epoch is already over finds that under the lock and runs nothing.
//
// Epoch K+1 begins processing once every earlier epoch is closed (each of its indexes has
// stopped or never started). Offset o then belongs to the first epoch E, in order, whose
// candidate w = o % N_E had d_E(w) > o (it emitted o there); past every closed epoch, to the
// current one's o % N. So each offset has exactly one owner across any chain of changes
// (4 -> 8 -> 3), whatever each worker's progress: below its stop point an old owner kept it,
// at or above it passes on. Each worker emits its offsets in order and resumes after its
// last record, so its emitted offsets are a prefix of what it owns.
//
// What it needs: an output file all workers can read and lock (one host, or a shared
// filesystem with POSIX locks), a drain on SIGTERM, and never two copies of an index. A
// removed worker that dies without draining (its node lost at the moment of the scale-in)
// leaves its epoch open: the new epoch waits (logging which worker it waits for) until an
// operator scales back out over that index, whose new worker closes it.

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
	Next    int64  `json:"next,omitempty"`
}

// epochState is one epoch as the ledger tells it.
type epochState struct {
	workers int
	last    map[int]mark // each index's last mark
}

// ledger is the shared record of epochs beside an output file.
type ledger struct {
	f      *os.File // OUTPUT.ledger, read and appended
	out    string   // the output file, for a worker's own records
	pos    int64
	tail   []byte
	epochs map[int64]*epochState
	latest int64
}

func openLedger(output string) (*ledger, error) {
	f, err := os.OpenFile(output+".ledger", os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wordcount: ledger: %w", err)
	}
	return &ledger{f: f, out: output, epochs: map[int64]*epochState{}}, nil
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

// refresh reads the marks appended since the last read (the lock is held).
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
	if m.Mark == markStart {
		e.workers = m.Workers
		l.latest = max(l.latest, m.Epoch)
	}
	e.last[m.Worker] = m
}

// append writes marks (the exclusive lock is held).
func (l *ledger) append(ms ...mark) error {
	var b bytes.Buffer
	for _, m := range ms {
		_ = json.NewEncoder(&b).Encode(m)
	}
	if _, err := l.f.Write(b.Bytes()); err != nil {
		return fmt.Errorf("wordcount: write ledger: %w", err)
	}
	for _, m := range ms {
		l.apply(m)
	}
	return nil
}

// ownNext reads, from the output, 1 + the highest offset worker emitted in each epoch (the
// lock is held, so no record is half written).
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

// join enters epoch (workers of them) as worker, under the exclusive lock: it closes the
// worker's own unfinished epochs, and starts it in epoch unless a later one has begun
// (stale: it must run nothing). It returns where the worker resumes in epoch.
func (l *ledger) join(epoch int64, workers, worker int) (resume int64, stale bool, err error) {
	if err := l.lock(true); err != nil {
		return 0, false, fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	defer l.unlock()
	if err := l.refresh(); err != nil {
		return 0, false, err
	}
	var open []int64
	for e, st := range l.epochs {
		if m, ok := st.last[worker]; ok && m.Mark == markStart && (e != epoch || l.latest > epoch) {
			open = append(open, e)
		}
	}
	own, err := l.ownNext(worker)
	if err != nil {
		return 0, false, err
	}
	var ms []mark
	for _, e := range slices.Sorted(slices.Values(open)) {
		ms = append(ms, mark{Mark: markStop, Epoch: e, Worker: worker, Next: own[e]})
	}
	stale = l.latest > epoch
	if !stale {
		ms = append(ms, mark{Mark: markStart, Epoch: epoch, Workers: workers, Worker: worker})
	}
	if len(ms) > 0 {
		if err := l.append(ms...); err != nil {
			return 0, false, err
		}
	}
	return own[epoch], stale, nil
}

// stop ends worker's part in epoch: it emitted every offset it owns there below next.
func (l *ledger) stop(epoch int64, worker int, next int64) error {
	if err := l.lock(true); err != nil {
		return fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	defer l.unlock()
	if err := l.refresh(); err != nil {
		return err
	}
	if m, ok := l.epochs[epoch].last[worker]; !ok || m.Mark != markStart {
		return nil
	}
	return l.append(mark{Mark: markStop, Epoch: epoch, Worker: worker, Next: next})
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
	if err := l.lock(false); err != nil {
		return nil, "", fmt.Errorf("wordcount: lock ledger: %w", err)
	}
	err := l.refresh()
	l.unlock()
	if err != nil {
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
