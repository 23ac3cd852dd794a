package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// sinkWatch follows a mirrored job's file sink (one JSON object per line: offset, link,
// record) until stopped, and checks all the time that it holds every offset exactly once:
// offsets 0, 1, 2, ... in order, none twice, none skipped. It remembers when each line
// arrived, for figures (the sink receiving again, switching links).
type sinkWatch struct {
	path string
	stop chan struct{}
	done chan struct{}

	mu         sync.Mutex
	pos        int64  // bytes of the file read
	partial    []byte // a line being written
	next       int64  // the offset the next line must carry
	lastAt     time.Time
	lastLink   string
	maxGap     time.Duration // the longest the sink received nothing, between two records
	maxGapEnd  time.Time
	switches   []linkSwitch
	violations []string
}

// linkSwitch is a moment the sink's records started coming from another link.
type linkSwitch struct {
	at       time.Time
	from, to string
	offset   int64
}

func watchSink(t testing.TB, path string) *sinkWatch {
	s := &sinkWatch{path: path, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				s.poll()
				return
			case <-tick.C:
			}
			s.poll()
		}
	}()
	t.Cleanup(s.end)
	return s
}

func (s *sinkWatch) end() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// poll reads what was appended since the last poll.
func (s *sinkWatch) poll() {
	f, err := os.Open(s.path)
	if err != nil {
		return // not made yet
	}
	defer f.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := f.Seek(s.pos, io.SeekStart); err != nil {
		return
	}
	b, err := io.ReadAll(f)
	if err != nil || len(b) == 0 {
		return
	}
	s.pos += int64(len(b))
	b = append(s.partial, b...)
	now := time.Now()
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		line := b[:i]
		b = b[i+1:]
		var rec struct {
			Offset *int64 `json:"offset"`
			Link   string `json:"link"`
		}
		if err := json.Unmarshal(line, &rec); err != nil || rec.Offset == nil {
			s.violations = append(s.violations, fmt.Sprintf("%s: unreadable sink line %q: %v", now.Format("15:04:05.000"), line, err))
			continue
		}
		switch o := *rec.Offset; {
		case o < s.next:
			s.violations = append(s.violations, fmt.Sprintf("%s: offset %d delivered again (next due %d, from %s)", now.Format("15:04:05.000"), o, s.next, rec.Link))
		case o > s.next:
			s.violations = append(s.violations, fmt.Sprintf("%s: offsets %d..%d lost (got %d from %s)", now.Format("15:04:05.000"), s.next, o-1, o, rec.Link))
			s.next = o + 1
		default:
			s.next++
		}
		if s.lastLink != "" && rec.Link != s.lastLink {
			s.switches = append(s.switches, linkSwitch{at: now, from: s.lastLink, to: rec.Link, offset: *rec.Offset})
		}
		if !s.lastAt.IsZero() && now.Sub(s.lastAt) > s.maxGap {
			s.maxGap, s.maxGapEnd = now.Sub(s.lastAt), now
		}
		s.lastLink, s.lastAt = rec.Link, now
	}
	s.partial = append([]byte(nil), b...)
}

// delivered returns how many offsets the sink holds (all of 0..n-1), the link of the last
// record and when it arrived.
func (s *sinkWatch) delivered() (n int64, link string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next, s.lastLink, s.lastAt
}

// longestGap returns the longest time the sink received nothing between two records, and
// when it ended.
func (s *sinkWatch) longestGap() (time.Duration, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxGap, s.maxGapEnd
}

// switchedSince returns the first switch of links at or after t.
func (s *sinkWatch) switchedSince(t time.Time) (linkSwitch, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sw := range s.switches {
		if !sw.at.Before(t) {
			return sw, true
		}
	}
	return linkSwitch{}, false
}

// check fails the test for every offset lost, doubled or unreadable.
func (s *sinkWatch) check(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.violations {
		t.Error("sink: " + v)
	}
}

func (s *sinkWatch) report() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}
