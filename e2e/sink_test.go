package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/multidc"
)

// sinkWatch follows a mirrored job's sink (a file of JSON lines, a PostgreSQL table, a
// JetStream subject) until stopped, and checks all the time that it holds every offset
// exactly once: offsets 0, 1, 2, ... in order, none twice, none skipped, and (fencing
// sinks) none written by a router at an epoch older than one that wrote before. It
// remembers when each record arrived, for figures (the sink receiving again, switching
// links, the longest gap).
type sinkWatch struct {
	what string
	stop chan struct{}
	done chan struct{}

	mu         sync.Mutex
	path       string // a file sink's
	pos        int64  // bytes of the file read
	partial    []byte // a line being written
	epoch      int64  // the newest fencing epoch seen (a row's, a fence message's)
	arrivals   []time.Time
	offsets    []int64 // each arrival's offset
	next       int64   // the offset the next line must carry
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

// watchSink follows a file sink.
func watchSink(t testing.TB, path string) *sinkWatch {
	s := &sinkWatch{what: path, path: path}
	return s.run(t, 20*time.Millisecond, s.poll)
}

// run polls every period until stopped (and once more then).
func (s *sinkWatch) run(t testing.TB, every time.Duration, poll func()) *sinkWatch {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				poll()
				return
			case <-tick.C:
			}
			poll()
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
		s.addLocked(*rec.Offset, rec.Link, 0, now)
	}
	s.partial = append([]byte(nil), b...)
}

// addLocked takes the sink's next record: its offset, link, the fencing epoch it was
// written at (0: none) and when it arrived.
func (s *sinkWatch) addLocked(o int64, link string, epoch int64, at time.Time) {
	switch {
	case o < s.next:
		s.violations = append(s.violations, fmt.Sprintf("%s: offset %d delivered again (next due %d, from %s)", at.Format("15:04:05.000"), o, s.next, link))
	case o > s.next:
		s.violations = append(s.violations, fmt.Sprintf("%s: offsets %d..%d lost (got %d from %s)", at.Format("15:04:05.000"), s.next, o-1, o, link))
		s.next = o + 1
	default:
		s.next++
	}
	if epoch != 0 && epoch < s.epoch {
		s.violations = append(s.violations, fmt.Sprintf("%s: offset %d written at epoch %d after epoch %d: a fenced router's write was kept", at.Format("15:04:05.000"), o, epoch, s.epoch))
	}
	s.epoch = max(s.epoch, epoch)
	if s.lastLink != "" && link != s.lastLink {
		s.switches = append(s.switches, linkSwitch{at: at, from: s.lastLink, to: link, offset: o})
	}
	if !s.lastAt.IsZero() && at.Sub(s.lastAt) > s.maxGap {
		s.maxGap, s.maxGapEnd = at.Sub(s.lastAt), at
	}
	s.lastLink, s.lastAt = link, at
	s.arrivals = append(s.arrivals, at)
	s.offsets = append(s.offsets, o)
}

// fenceLocked takes a fence of a fencing sink: every record after it must be of its epoch
// or a newer one.
func (s *sinkWatch) fenceLocked(epoch int64, at time.Time) {
	if epoch <= s.epoch {
		s.violations = append(s.violations, fmt.Sprintf("%s: a fence of epoch %d after epoch %d", at.Format("15:04:05.000"), epoch, s.epoch))
	}
	s.epoch = max(s.epoch, epoch)
}

// epochs returns the newest fencing epoch seen.
func (s *sinkWatch) epochs() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// resumedAfter says how long after cut the sink received again after its longest pause:
// the arrival that ended the longest gap between cut and the first arrival after until,
// minus cut. Without any arrival in that window, false.
func (s *sinkWatch) resumedAfter(cut, until time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, best, resumed := cut, time.Duration(-1), time.Time{}
	for _, a := range s.arrivals {
		if !a.After(cut) {
			continue
		}
		if a.After(until) && !resumed.IsZero() {
			break
		}
		if g := a.Sub(prev); g > best {
			best, resumed = g, a
		}
		prev = a
	}
	if resumed.IsZero() {
		return 0, false
	}
	return resumed.Sub(cut), true
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

// longestStall returns the longest the sink waited for a new offset while the input already
// held its line: for each new offset after the first, the time from the later of the previous
// new offset's arrival and the moment its line entered the input (in) to its arrival. Unlike
// longestGap it leaves out the input's own pauses (the tests write their input in bursts, once
// a second), so it is the sink's longest gap while input kept flowing. It also returns the
// offset that ended the stall and when it arrived.
func (s *sinkWatch) longestStall(in *inputLog) (longest time.Duration, offset int64, end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	newest, prev := int64(-1), time.Time{}
	for i, o := range s.offsets {
		if o <= newest {
			continue // delivered again: a violation of its own, no new offset
		}
		at := s.arrivals[i]
		if !prev.IsZero() {
			from := prev
			if w, ok := in.at(o); ok && w.After(from) {
				from = w
			}
			if d := at.Sub(from); d > longest {
				longest, offset, end = d, o, at
			}
		}
		newest, prev = o, at
	}
	return longest, offset, end
}

// inputLog remembers when each batch of a test's input lines was written, so that a sink's
// gaps can be told from the input's own pauses (longestStall).
type inputLog struct {
	mu    sync.Mutex
	first []int64     // the offset of each batch's first line, ascending
	began []time.Time // when the batch's write began: its lines were not readable before
}

// wrote records that lines from offset first on were written from at on.
func (l *inputLog) wrote(first int64, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.first = append(l.first, first)
	l.began = append(l.began, at)
}

// at returns when the line of offset o was written, false if it never was.
func (l *inputLog) at(o int64) (time.Time, bool) {
	if l == nil {
		return time.Time{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.first), func(i int) bool { return l.first[i] > o }) - 1
	if i < 0 {
		return time.Time{}, false
	}
	return l.began[i], true
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
		t.Error("sink " + s.what + ": " + v)
	}
}

func (s *sinkWatch) report() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// watchPG follows a postgres sink's table, with SQL: every row in offset order, the time it
// was written (the database's clock, this machine's) as its arrival.
func watchPG(t testing.TB, srv *pgtest.Server, db, table string) *sinkWatch {
	s := &sinkWatch{what: "postgres table " + table}
	var conn *pgx.Conn
	t.Cleanup(func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	})
	return s.run(t, 50*time.Millisecond, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if conn == nil || conn.IsClosed() {
			c, err := srv.Admin(ctx, db) // its socket: no cut of the test's reaches it
			if err != nil {
				return
			}
			conn = c
		}
		s.mu.Lock()
		next := s.next
		s.mu.Unlock()
		rows, err := conn.Query(ctx, `SELECT "offset", link, epoch, written FROM `+table+` WHERE "offset" >= $1 ORDER BY "offset"`, next)
		if err != nil {
			return // the table is not made yet
		}
		defer rows.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for rows.Next() {
			var off, epoch int64
			var link string
			var at time.Time
			if err := rows.Scan(&off, &link, &epoch, &at); err != nil {
				return
			}
			s.addLocked(off, link, epoch, at)
		}
	})
}

// watchJetStream follows a JetStream sink's subject from the server's own view of its
// stream (an ordered consumer of it, from its first message): records in order, fence
// messages raising the epoch every later record must hold, the server's timestamp as the
// arrival.
func watchJetStream(t testing.TB, srv *natstest.Server, subject string) *sinkWatch {
	s := &sinkWatch{what: "JetStream subject " + subject}
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var it jetstream.MessagesContext
	t.Cleanup(func() {
		if it != nil {
			it.Stop()
		}
	})
	return s.run(t, 50*time.Millisecond, func() {
		if it == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			name, err := js.StreamNameBySubject(ctx, subject)
			if err != nil {
				return // not made yet
			}
			cons, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{})
			if err != nil {
				return
			}
			if it, err = cons.Messages(); err != nil {
				it = nil
				return
			}
		}
		for {
			m, err := it.Next(jetstream.NextMaxWait(20 * time.Millisecond))
			if err != nil {
				return // nothing more now
			}
			md, err := m.Metadata()
			if err != nil || m.Subject() != subject {
				continue
			}
			h := m.Headers()
			epoch, _ := strconv.ParseInt(h.Get(multidc.HeaderEpoch), 10, 64)
			s.mu.Lock()
			if h.Get(multidc.HeaderKind) == multidc.KindFence {
				s.fenceLocked(epoch, md.Timestamp)
				s.mu.Unlock()
				continue
			}
			var rec struct {
				Offset *int64 `json:"offset"`
				Link   string `json:"link"`
			}
			if err := json.Unmarshal(m.Data(), &rec); err != nil || rec.Offset == nil {
				s.violations = append(s.violations, fmt.Sprintf("message %d: unreadable: %q", md.Sequence.Stream, m.Data()))
			} else {
				if epoch != s.epoch {
					s.violations = append(s.violations, fmt.Sprintf("%s: offset %d published at epoch %d after the fence of epoch %d",
						md.Timestamp.Format("15:04:05.000"), *rec.Offset, epoch, s.epoch))
				}
				s.addLocked(*rec.Offset, rec.Link, epoch, md.Timestamp)
			}
			s.mu.Unlock()
		}
	})
}
