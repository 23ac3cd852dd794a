package multidc

import (
	"encoding/json"
	"fmt"
	"time"
)

// Record is one output record of a link, identified by the input offset it derives from.
type Record struct {
	Offset int64
	Link   string
	// Data is the record as the link sent it: one JSON object, no newline.
	Data json.RawMessage
	// received is when the router got it, for the delivery latency metric.
	received time.Time
}

// Limits bound what the router holds for each link.
type Limits struct {
	// Window is how far ahead of the first undelivered offset a link's records may be:
	// the per-link bound on buffered records. Default 8192.
	Window int64
	// Bytes bounds the payload bytes buffered per link. Default 32 MiB.
	Bytes int64
}

func (l Limits) withDefaults() Limits {
	if l.Window <= 0 {
		l.Window = 8192
	}
	if l.Bytes <= 0 {
		l.Bytes = 32 << 20
	}
	return l
}

// addResult says what became of a record handed to the orderer.
type addResult int

const (
	added        addResult = iota // buffered until delivered or superseded
	dupDelivered                  // its offset was already delivered, from any link
	dupHeld                       // this link sent that offset before and it is still held
	rejected                      // the link's buffer is full: the sender must retry
)

// linkBuf is everything the orderer keeps about one link.
type linkBuf struct {
	name    string
	pending map[int64]Record // received from this link, offset >= next
	bytes   int64            // payload bytes in pending
	// mark is the link's last produced offset: every offset up to it was received from the
	// link, offsets below the first undelivered one counting as received once the link
	// sends beyond them (a worker that resumes at nextOffset skips them on purpose).
	mark int64
	// seen holds received offsets above mark+1, so duplicates are told apart and mark can
	// advance over records that arrived out of order; entries at or below mark are stale.
	seen          map[int64]struct{}
	lastDelivered int64 // highest offset delivered from this link, -1 if none

	// Counters, exported by the metrics collector.
	received, delivered, dropped, rejected uint64
}

// orderer is the router's core: it holds every link's records until they are delivered,
// hands out the active link's records in offset order, and drops whatever was already
// delivered. It has no clock, no I/O and no lock; Router serializes the calls. Invariant:
// the records [next, next+k) handed to commit are the only ones ever delivered after next,
// so every offset goes to the sink once, whatever the interleaving and the failovers.
type orderer struct {
	links  []*linkBuf // configured order, the tie-break between equally advanced links
	byName map[string]*linkBuf
	next   int64    // first undelivered offset
	active *linkBuf // nil until one is chosen
	limits Limits
}

func newOrderer(links []string, next int64, limits Limits) *orderer {
	o := &orderer{byName: map[string]*linkBuf{}, next: next, limits: limits.withDefaults()}
	for _, name := range links {
		l := &linkBuf{name: name, pending: map[int64]Record{}, seen: map[int64]struct{}{}, mark: -1, lastDelivered: -1}
		o.links = append(o.links, l)
		o.byName[name] = l
	}
	return o
}

// seenCap bounds a link's seen set: past it, records below the first undelivered offset are
// no longer remembered and the link's mark stays conservative (lower) instead of growing
// memory without bound for a link that never fills its gaps.
func (o *orderer) seenCap() int { return int(2*o.limits.Window) + 1024 }

// add takes one record of the named link, which must exist.
func (o *orderer) add(r Record) addResult {
	l := o.byName[r.Link]
	off := r.Offset
	if off < o.next {
		l.received++
		l.dropped++
		if off > l.mark && len(l.seen) < o.seenCap() {
			l.seen[off] = struct{}{}
			l.advance()
		}
		return dupDelivered
	}
	if _, ok := l.pending[off]; ok {
		l.received++
		l.dropped++
		return dupHeld
	}
	size := int64(len(r.Data))
	// The record at next is always taken: it is the one delivery waits for, so refusing it
	// could stall the router with a buffer full of later offsets.
	if off != o.next && (off-o.next >= o.limits.Window || l.bytes+size > o.limits.Bytes) {
		l.rejected++
		return rejected
	}
	l.received++
	l.pending[off] = r
	l.bytes += size
	if l.mark < o.next-1 {
		l.mark = o.next - 1 // delivered offsets count as produced once the link is past them
	}
	l.seen[off] = struct{}{}
	l.advance()
	if len(l.seen) > o.seenCap()/2 {
		l.pruneSeen()
	}
	return added
}

func (l *linkBuf) advance() {
	for {
		if _, ok := l.seen[l.mark+1]; !ok {
			return
		}
		delete(l.seen, l.mark+1)
		l.mark++
	}
}

// pruneSeen drops the stale entries at or below mark left behind when mark jumped.
func (l *linkBuf) pruneSeen() {
	for off := range l.seen {
		if off <= l.mark {
			delete(l.seen, off)
		}
	}
}

// peek returns up to max records of the active link, starting at next, contiguous.
func (o *orderer) peek(max int) []Record {
	if o.active == nil {
		return nil
	}
	var out []Record
	for off := o.next; len(out) < max; off++ {
		r, ok := o.active.pending[off]
		if !ok {
			break
		}
		out = append(out, r)
	}
	return out
}

// commit records that recs, as returned by peek, reached the sink, and drops every link's
// copy of their offsets. It fails, changing nothing, unless recs starts at next and is
// contiguous: that check is what makes a double delivery impossible rather than unlikely.
func (o *orderer) commit(recs []Record) error {
	for i, r := range recs {
		if r.Offset != o.next+int64(i) {
			return fmt.Errorf("multidc: commit of offset %d at position %d, want %d", r.Offset, i, o.next+int64(i))
		}
		if o.byName[r.Link] == nil {
			return fmt.Errorf("multidc: commit of offset %d from unknown link %q", r.Offset, r.Link)
		}
	}
	if len(recs) == 0 {
		return nil
	}
	end := o.next + int64(len(recs))
	for _, r := range recs {
		from := o.byName[r.Link]
		from.delivered++
		from.lastDelivered = r.Offset
	}
	for _, l := range o.links {
		for off := o.next; off < end; off++ {
			p, ok := l.pending[off]
			if !ok {
				continue
			}
			delete(l.pending, off)
			l.bytes -= int64(len(p.Data))
			if recs[off-o.next].Link != l.name {
				l.dropped++ // a standby's copy, superseded by the delivered one
			}
		}
	}
	o.next = end
	return nil
}

// failover makes the named link the active one.
func (o *orderer) failover(to string) error {
	l, ok := o.byName[to]
	if !ok {
		return fmt.Errorf("multidc: unknown link %q", to)
	}
	o.active = l
	return nil
}

func (o *orderer) activeName() string {
	if o.active == nil {
		return ""
	}
	return o.active.name
}

// run is the number of records the link holds contiguously from next: what it could deliver
// right now if it were active.
func (o *orderer) run(l *linkBuf) int64 {
	return max(0, l.mark-(o.next-1))
}

// mostAdvanced returns, among the candidate links, the one with the highest mark (the
// longest contiguous run from next, or the smallest gap below it), earlier configured links
// winning ties; "" if there is no candidate.
func (o *orderer) mostAdvanced(candidates func(name string) bool) string {
	var best *linkBuf
	for _, l := range o.links {
		if candidates(l.name) && (best == nil || l.mark > best.mark) {
			best = l
		}
	}
	if best == nil {
		return ""
	}
	return best.name
}
