package multidc

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// simWorker is one worker of a link in the model: it sends its offsets (o % workers ==
// index) in order, retrying a rejected one, and may be restarted.
type simWorker struct {
	link   string
	index  int
	stride int
	cursor int64 // next offset to send
}

func payload(link string, off int64, pad int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"offset":%d,"link":%q,"pad":%q}`, off, link, strings.Repeat("x", pad)))
}

// TestOrdererProperty drives the orderer with random interleavings of two or three links'
// records (several workers per link, resends, restarts from 0 or from the delivery point,
// tiny buffers), random failovers at any point (also between a peek and its commit) and
// failed sink writes, and checks that the sink gets offsets 0..N-1, each once, in order,
// every record from the link that was active when it was handed out.
func TestOrdererProperty(t *testing.T) {
	iters := 250
	if testing.Short() {
		iters = 50
	}
	var total modelStats
	var mu sync.Mutex
	t.Run("seeds", func(t *testing.T) {
		for seed := range uint64(iters) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				st := runOrdererModel(t, seed)
				mu.Lock()
				total.add(st)
				mu.Unlock()
			})
		}
	})
	t.Logf("over %d runs: %+v", iters, total)
	// The model must have reached the cases it is about, or it proves nothing.
	if total.switches == 0 || total.switchesInFlight == 0 || total.rejected == 0 || total.dupDelivered == 0 ||
		total.dupHeld == 0 || total.failedWrites == 0 || total.restarts == 0 {
		t.Fatalf("the model missed a case: %+v", total)
	}
}

type modelStats struct {
	switches, switchesInFlight, rejected, dupDelivered, dupHeld, failedWrites, restarts int
}

func (s *modelStats) add(o modelStats) {
	s.switches += o.switches
	s.switchesInFlight += o.switchesInFlight
	s.rejected += o.rejected
	s.dupDelivered += o.dupDelivered
	s.dupHeld += o.dupHeld
	s.failedWrites += o.failedWrites
	s.restarts += o.restarts
}

func runOrdererModel(t *testing.T, seed uint64) (st modelStats) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	n := int64(20 + rng.IntN(300))
	links := []string{"dc-a", "dc-b", "dc-c"}[:2+rng.IntN(2)]
	limits := Limits{Window: int64(2 + rng.IntN(40)), Bytes: int64(200 + rng.IntN(3000))}
	o := newOrderer(links, 0, limits)
	pads := make([]int, n) // record sizes vary per offset, the same on every link
	for i := range pads {
		pads[i] = rng.IntN(120)
	}
	var workers []*simWorker
	for _, l := range links {
		w := 1 + rng.IntN(3)
		for i := range w {
			workers = append(workers, &simWorker{link: l, index: i, stride: w, cursor: int64(i)})
		}
	}
	var sink []Record
	var inflight []Record // peeked, not committed: a sink write in progress
	pFail := rng.Float64() * 0.05
	pSwitch := rng.Float64() * 0.05
	pRestart := rng.Float64() * 0.01
	for step := 0; o.next < n; step++ {
		if step > 2_000_000 {
			t.Fatalf("no progress: next=%d of %d after %d steps", o.next, n, step)
		}
		x := rng.Float64()
		switch {
		case x < pSwitch:
			to := links[rng.IntN(len(links))]
			if to != o.activeName() {
				st.switches++
				if inflight != nil {
					st.switchesInFlight++
				}
			}
			if err := o.failover(to); err != nil {
				t.Fatal(err)
			}
		case x < pSwitch+pRestart:
			w := workers[rng.IntN(len(workers))]
			from := int64(0)
			if rng.IntN(2) == 0 {
				from = o.next // resume at nextOffset, as the heartbeat answer allows
			}
			w.cursor = firstOwned(from, w.index, w.stride)
			st.restarts++
		case x < 0.15:
			// The delivery goroutine: peek, write (which may fail), commit.
			if inflight == nil {
				inflight = o.peek(1 + rng.IntN(8))
				if len(inflight) > 0 && inflight[0].Link != o.activeName() {
					t.Fatalf("peek handed out link %s while %s is active", inflight[0].Link, o.activeName())
				}
				continue
			}
			if rng.Float64() < pFail {
				inflight = nil // the write failed: it is retried with a new peek
				st.failedWrites++
				continue
			}
			if err := o.commit(inflight); err != nil {
				t.Fatal(err)
			}
			sink = append(sink, inflight...)
			inflight = nil
		default:
			w := workers[rng.IntN(len(workers))]
			if w.cursor >= n {
				continue
			}
			// Now and then a worker re-sends a recent record (a retried batch).
			off := w.cursor
			if rng.IntN(10) == 0 && off >= int64(w.stride) {
				off -= int64(w.stride) * int64(1+rng.IntN(3))
				off = max(off, int64(w.index))
			}
			res := o.add(Record{Offset: off, Link: w.link, Data: payload(w.link, off, pads[off])})
			if off == w.cursor && res != rejected {
				w.cursor += int64(w.stride)
			}
			switch res {
			case rejected:
				st.rejected++
			case dupDelivered:
				st.dupDelivered++
			case dupHeld:
				st.dupHeld++
			}
		}
		if o.active == nil {
			_ = o.failover(links[0])
		}
		checkOrdererInvariants(t, o)
	}
	if int64(len(sink)) != n {
		t.Fatalf("sink has %d records, want %d", len(sink), n)
	}
	for i, r := range sink {
		if r.Offset != int64(i) {
			t.Fatalf("sink[%d] has offset %d", i, r.Offset)
		}
		if want := string(payload(r.Link, r.Offset, pads[r.Offset])); string(r.Data) != want {
			t.Fatalf("sink[%d] = %s, want %s", i, r.Data, want)
		}
	}
	return st
}

func firstOwned(from int64, index, stride int) int64 {
	o := from - from%int64(stride) + int64(index)
	if o < from {
		o += int64(stride)
	}
	return o
}

func checkOrdererInvariants(t *testing.T, o *orderer) {
	t.Helper()
	for _, l := range o.links {
		var bytes, maxRec int64
		for off, r := range l.pending {
			if off < o.next || r.Offset != off || r.Link != l.name {
				t.Fatalf("link %s holds offset %d (record %d from %s) with next %d", l.name, off, r.Offset, r.Link, o.next)
			}
			bytes += int64(len(r.Data))
			maxRec = max(maxRec, int64(len(r.Data)))
		}
		if bytes != l.bytes {
			t.Fatalf("link %s: bytes %d, pending holds %d", l.name, l.bytes, bytes)
		}
		if int64(len(l.pending)) > o.limits.Window {
			t.Fatalf("link %s holds %d records, window %d", l.name, len(l.pending), o.limits.Window)
		}
		if l.bytes > o.limits.Bytes+maxRec {
			t.Fatalf("link %s holds %d bytes, limit %d", l.name, l.bytes, o.limits.Bytes)
		}
		for off := o.next; off <= l.mark; off++ {
			if _, ok := l.pending[off]; !ok {
				t.Fatalf("link %s: mark %d but offset %d (next %d) is not held", l.name, l.mark, off, o.next)
			}
		}
	}
}

func rec(link string, off int64) Record {
	return Record{Offset: off, Link: link, Data: payload(link, off, 0)}
}

func TestOrdererFailoverPicksLongestRun(t *testing.T) {
	o := newOrderer([]string{"dc-a", "dc-b", "dc-c"}, 0, Limits{})
	if err := o.failover("dc-a"); err != nil {
		t.Fatal(err)
	}
	for off := range int64(10) {
		o.add(rec("dc-a", off))
	}
	for _, off := range []int64{0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11} { // dc-b: gap at 7
		o.add(rec("dc-b", off))
	}
	for off := range int64(9) { // dc-c: 0..8, contiguous
		o.add(rec("dc-c", off))
	}
	if err := o.commit(o.peek(4)); err != nil { // 0..3 from dc-a
		t.Fatal(err)
	}
	all := func(n string) bool { return n != "dc-a" }
	if got := o.mostAdvanced(all); got != "dc-c" {
		t.Fatalf("most advanced = %s, want dc-c (run 4..8 beats dc-b's 4..6)", got)
	}
	if r := o.run(o.byName["dc-b"]); r != 3 {
		t.Fatalf("dc-b run = %d, want 3", r)
	}
	o.add(rec("dc-c", 9))
	o.add(rec("dc-b", 7))
	if got := o.mostAdvanced(all); got != "dc-b" {
		t.Fatalf("most advanced = %s, want dc-b (4..11)", got)
	}
	_ = o.failover("dc-b")
	got := o.peek(100)
	if len(got) != 8 || got[0].Offset != 4 || got[0].Link != "dc-b" {
		t.Fatalf("after failover peek = %v", got)
	}
	if err := o.commit(got); err != nil {
		t.Fatal(err)
	}
	if l := o.byName["dc-c"]; len(l.pending) != 0 || l.bytes != 0 {
		t.Fatalf("dc-c still holds %d records (%d bytes) below next", len(l.pending), l.bytes)
	}
	if o.next != 12 || o.byName["dc-b"].lastDelivered != 11 || o.byName["dc-a"].lastDelivered != 3 {
		t.Fatalf("next %d, lastDelivered a=%d b=%d", o.next, o.byName["dc-a"].lastDelivered, o.byName["dc-b"].lastDelivered)
	}
}

func TestOrdererCommitRefusesGapsAndRepeats(t *testing.T) {
	o := newOrderer([]string{"dc-a"}, 5, Limits{})
	_ = o.failover("dc-a")
	for _, bad := range [][]Record{
		{rec("dc-a", 4)},
		{rec("dc-a", 6)},
		{rec("dc-a", 5), rec("dc-a", 7)},
		{rec("dc-x", 5)},
	} {
		if err := o.commit(bad); err == nil {
			t.Fatalf("commit of %v at next 5 succeeded", bad)
		}
	}
	if o.next != 5 {
		t.Fatalf("a refused commit moved next to %d", o.next)
	}
}

func TestOrdererBackpressure(t *testing.T) {
	o := newOrderer([]string{"dc-a", "dc-b"}, 0, Limits{Window: 4, Bytes: 1 << 20})
	_ = o.failover("dc-a")
	for off := int64(1); off < 4; off++ {
		if r := o.add(rec("dc-b", off)); r != added {
			t.Fatalf("offset %d: %v", off, r)
		}
	}
	if r := o.add(rec("dc-b", 4)); r != rejected {
		t.Fatalf("offset 4 past the window: %v, want rejected", r)
	}
	// Bytes: a link full of later offsets still takes the one at next.
	o2 := newOrderer([]string{"dc-a"}, 0, Limits{Window: 100, Bytes: 100})
	_ = o2.failover("dc-a")
	for off := int64(1); ; off++ {
		if o2.add(Record{Offset: off, Link: "dc-a", Data: payload("dc-a", off, 30)}) == rejected {
			break
		}
	}
	if r := o2.add(Record{Offset: 0, Link: "dc-a", Data: payload("dc-a", 0, 30)}); r != added {
		t.Fatalf("the record at next was %v with a full buffer", r)
	}
	if r := o2.add(rec("dc-a", 0)); r != dupHeld {
		t.Fatalf("re-sent record: %v, want dupHeld", r)
	}
	if err := o2.commit(o2.peek(100)); err != nil {
		t.Fatal(err)
	}
	if r := o2.add(rec("dc-a", 0)); r != dupDelivered {
		t.Fatalf("delivered record: %v, want dupDelivered", r)
	}
}
