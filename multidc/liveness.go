package multidc

import "time"

// liveness tells from heartbeats which links are alive. Like the orderer it takes the time
// as an argument, so that it is deterministic under test.
//
// Besides the heartbeat timeout it uses a faster signal: when a connection a worker used
// closes (the kernel closes a killed process's sockets), the worker is dead unless it beats
// again within grace. A live worker whose connection closed for a benign reason (an idle
// timeout) beats again within one heartbeat interval, well inside grace; a worker behind a
// proxy gives no such signal and is left to the timeout.
type liveness struct {
	timeout time.Duration
	grace   time.Duration
	links   map[string]*linkBeats
}

type linkBeats struct {
	// workers is the link's worker count as its workers report it (workers=N); 0 until one
	// does, and then every index below it must beat for the link to be alive.
	workers int
	last    map[int]time.Time // worker index -> last heartbeat
	closed  map[int]time.Time // worker index -> when a connection of it closed, since its last beat
}

func newLiveness(links []string, timeout, grace time.Duration) *liveness {
	lv := &liveness{timeout: timeout, grace: grace, links: map[string]*linkBeats{}}
	for _, l := range links {
		lv.links[l] = &linkBeats{last: map[int]time.Time{}, closed: map[int]time.Time{}}
	}
	return lv
}

// connClosed records that a connection the worker used closed at now.
func (lv *liveness) connClosed(link string, worker int, now time.Time) {
	if b := lv.links[link]; b != nil {
		if _, ok := b.last[worker]; ok {
			b.closed[worker] = now
		}
	}
}

// fresh reports whether a worker last heard from at t counts as alive at now.
func (lv *liveness) fresh(b *linkBeats, worker int, t, now time.Time) bool {
	if c, ok := b.closed[worker]; ok && now.Sub(c) > lv.grace {
		return false
	}
	return now.Sub(t) <= lv.timeout
}

// forgetAfter is how long a worker that the link's worker count does not cover stays
// required after its last heartbeat: long enough that a dead worker fails its link over,
// short enough that a link whose workers were renumbered heals.
const forgetAfter = 10

// beat records a heartbeat of a link's worker at now. workers > 0 sets the link's worker
// count; a smaller count than before forgets the workers above it (a scale-in).
func (lv *liveness) beat(link string, worker, workers int, now time.Time) {
	b := lv.links[link]
	if workers > 0 && workers != b.workers {
		b.workers = workers
		for w := range b.last {
			if w >= workers {
				delete(b.last, w)
				delete(b.closed, w)
			}
		}
	}
	if prev, ok := b.last[worker]; !ok || now.After(prev) {
		b.last[worker] = now
	}
	if c, ok := b.closed[worker]; ok && now.After(c) {
		delete(b.closed, worker)
	}
}

// alive reports whether every worker the link needs has beaten within the timeout, and
// none of them lost a connection without beating again within grace.
func (lv *liveness) alive(link string, now time.Time) bool {
	oldest, ok := lv.oldest(link, now)
	if !ok || now.Sub(oldest) > lv.timeout {
		return false
	}
	b := lv.links[link]
	for w, t := range b.last {
		if (b.workers == 0 || w < b.workers) && !lv.fresh(b, w, t, now) {
			return false
		}
	}
	return true
}

// oldest returns the last heartbeat of the link's stalest required worker; false when a
// required worker never beat or no worker ever did.
func (lv *liveness) oldest(link string, now time.Time) (time.Time, bool) {
	b := lv.links[link]
	var oldest time.Time
	if b.workers > 0 {
		for w := 0; w < b.workers; w++ {
			t, ok := b.last[w]
			if !ok {
				return time.Time{}, false
			}
			if oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
		}
		return oldest, true
	}
	for w, t := range b.last {
		if now.Sub(t) > forgetAfter*lv.timeout {
			delete(b.last, w) // see forgetAfter
			delete(b.closed, w)
			continue
		}
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return oldest, !oldest.IsZero()
}

// counts returns how many of the link's required workers are alive, and how many it needs.
func (lv *liveness) counts(link string, now time.Time) (alive, want int) {
	b := lv.links[link]
	want = b.workers
	if want == 0 {
		want = len(b.last)
	}
	for w, t := range b.last {
		if (b.workers == 0 || w < b.workers) && lv.fresh(b, w, t, now) {
			alive++
		}
	}
	return alive, want
}
