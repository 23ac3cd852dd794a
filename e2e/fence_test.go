package e2e

import (
	"bytes"
	bin "encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fencingBound is how long a worker may run as two processes when its node is cut off: the
// node's copy runs until its lease lapses, session timeout after the last sync the store's
// leader answered its keeper, which is no later than the leader expires the node's session
// (but for the half tick a follower may take to pass a client's pings on), which comes before
// the master moves the worker; the launcher notices the lapse within a tenth of the lease's
// life, and a quarter covers both; it kills the worker at most its grace period after
// SIGTERM. Sampling /proc
// adds its own period and the time a scan takes on a loaded machine: slack covers both.
func fencingBound(session, grace time.Duration) time.Duration {
	const slack = time.Second
	return session/4 + grace + slack
}

// fenceWatch samples a job's worker processes (/proc) until stopped and records every time a
// worker index ran as two or more processes for longer than the bound (bound 0: at all), and
// the longest such overlap.
type fenceWatch struct {
	job   string
	bound time.Duration
	procs func(job string) map[string][]procWorker // workerProcs, or containerProcs
	stop  chan struct{}
	done  chan struct{}

	mu         sync.Mutex
	since      map[string]time.Time // worker -> when its current overlap was first seen
	flagged    map[string]bool
	violations []string
	longest    time.Duration
	longestKey string
	longestAt  string // when, and the processes, for the report
	samples    int
}

func watchFence(t testing.TB, job string, bound time.Duration) *fenceWatch {
	return watchFenceOf(t, job, bound, workerProcs)
}

// watchFenceOf is watchFence with the job's processes found by procs.
func watchFenceOf(t testing.TB, job string, bound time.Duration, procs func(string) map[string][]procWorker) *fenceWatch {
	w := &fenceWatch{job: job, bound: bound, procs: procs, stop: make(chan struct{}), done: make(chan struct{}),
		since: map[string]time.Time{}, flagged: map[string]bool{}}
	go w.loop()
	t.Cleanup(w.end)
	return w
}

func (w *fenceWatch) loop() {
	defer close(w.done)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		w.sample(w.procs(w.job), time.Now())
	}
}

func (w *fenceWatch) sample(procs map[string][]procWorker, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples++
	for k := range w.since {
		if len(procs[k]) < 2 {
			delete(w.since, k)
			delete(w.flagged, k)
		}
	}
	for k, ps := range procs {
		if len(ps) < 2 {
			continue
		}
		first, ok := w.since[k]
		if !ok {
			w.since[k], first = now, now
		}
		d := now.Sub(first)
		if d > w.longest {
			w.longest, w.longestKey = d, k
			w.longestAt = fmt.Sprintf("from %s: %v", first.Format("15:04:05.000"), ps)
		}
		if (d > w.bound || w.bound == 0) && !w.flagged[k] { // bound 0: no copy may ever run twice
			w.flagged[k] = true
			w.violations = append(w.violations, fmt.Sprintf("%s: worker %s of %s ran as %d processes for more than %s (since %s): %v",
				now.Format("15:04:05.000"), k, w.job, len(ps), w.bound, first.Format("15:04:05.000"), ps))
		}
	}
}

func (w *fenceWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// report returns the violations so far, the longest overlap and the samples taken.
func (w *fenceWatch) report() (violations []string, longest time.Duration, key string, samples int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.violations...), w.longest, w.longestKey, w.samples
}

// longestDetail says when the longest overlap began and which processes it was.
func (w *fenceWatch) longestDetail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.longestAt
}

// check fails the test for every overlap beyond the bound and logs the longest one.
func (w *fenceWatch) check(t *testing.T) {
	t.Helper()
	v, longest, key, samples := w.report()
	if samples == 0 {
		t.Errorf("no sample of %s's processes was taken", w.job)
	}
	for _, s := range v {
		t.Error("ran twice beyond the fencing bound: " + s)
	}
	t.Logf("figure: %s: longest time a worker ran twice: %s (worker %q; bound %s; %d samples) %s", w.job, longest.Round(time.Millisecond), key, w.bound, samples, w.longestDetail())
}

// cgroupStarts records every worker cgroup made under a node's cgroup parent (inotify): the
// agent makes one (NODE.JOB[.LINK].INDEX) before it starts a worker, so even a worker started
// and stopped again within milliseconds is seen, which sampling /proc would miss.
type cgroupStarts struct {
	node string
	fd   int
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	starts []cgroupStart
}

type cgroupStart struct {
	name string // the worker's id: NODE.JOB[.LINK].INDEX
	at   time.Time
}

// watchStarts watches a node's cgroup parent (the memory hierarchy's on cgroup v1) until the
// test ends.
func watchStarts(t testing.TB, h *harness, node string) *cgroupStarts {
	t.Helper()
	root := "/sys/fs/cgroup"
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err == nil {
		root = "/sys/fs/cgroup/memory"
	}
	dir := filepath.Join(root, h.Cgroup, node)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		t.Fatalf("watch %s: %v", dir, err)
	}
	s := &cgroupStarts{node: node, fd: fd, stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop()
	t.Cleanup(s.end)
	return s
}

func (s *cgroupStarts) loop() {
	defer close(s.done)
	defer unix.Close(s.fd)
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 100); err != nil || n == 0 {
			continue
		}
		n, err := unix.Read(s.fd, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		now := time.Now()
		s.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: wd, mask, cookie, len, then len bytes of name.
			mask := bin.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(bin.NativeEndian.Uint32(buf[off+12:]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+nameLen]
			if mask&unix.IN_ISDIR != 0 {
				s.starts = append(s.starts, cgroupStart{name: string(bytes.TrimRight(name, "\x00")), at: now})
			}
			off += unix.SizeofInotifyEvent + nameLen
		}
		s.mu.Unlock()
	}
}

func (s *cgroupStarts) end() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// since returns the starts seen at or after t.
func (s *cgroupStarts) since(t time.Time) []cgroupStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []cgroupStart
	for _, st := range s.starts {
		if !st.at.Before(t) {
			out = append(out, st)
		}
	}
	return out
}

// workerCgroup is the cgroup name a node's agent gives a worker of a plain job (agents'
// workerID, for names short enough to be kept whole).
func workerCgroup(node, job, worker string) string {
	if link, idx, ok := strings.Cut(worker, "/"); ok {
		return strings.Join([]string{node, job, link, idx}, ".")
	}
	return strings.Join([]string{node, job, worker}, ".")
}

// sortedKeys returns a map's keys in order, for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
