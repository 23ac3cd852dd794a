package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/master"
)

// Blocking queries (Nomad's; see api.IndexHeader). The reads that take them answer with
// an index: where what they answer, as their viewer sees it, last changed. The index is
// kept per read (viewer, path and query but index and wait) as a hash of the last answer
// and the index it changed at, so that `job status` of one job does not come back with
// every memory reading of ten thousand nodes, as it would with one counter for the whole
// master; and each viewer has its own counter, so that a tenant's indexes move with what
// its token shows alone, and tell it nothing of other tenants' changes.
//
// A read sent with an index not older than its own waits. While any wait, one goroutine
// (blockHub.loop) waits for the master's state to change (master.WaitChange), at most once
// per api.WatchInterval looks whether what reads answer from changed (the Snapshot, the job
// records, node settings, tenants, data centers: a stateToken), and if so renders each read
// that has waiters once, however many wait on it: a read whose answer's hash changed gets a
// new index, and its waiters are answered with that one render. The goroutine ends when the
// last waiter leaves. Each read keeps the state its answer was rendered at, so that a client
// that comes back with the read's index while the state is the same waits without a render.
//
// What reads take from elsewhere than the master's state (a mirrored job's sink line, read
// from the router's record in the store; registry hosts; times, as an avoidance's end) is
// up to date in every answer, but does not by itself end a wait.

const (
	// blockForget drops a read nobody asked for this long: a client that comes back later
	// with an index gets its answer at once (the read starts over with a new index).
	blockForget = 2 * time.Minute
	// blockReads bounds the reads kept; beyond it, reads nobody waits on are dropped.
	blockReads = 10000
	// staleRenders bounds how often a request renders its read again when renders made
	// after its own keep landing first.
	staleRenders = 3
)

// blockQuery is a request's ?index=N&wait=D.
type blockQuery struct {
	index uint64
	wait  time.Duration // with its jitter
}

// parseBlockQuery reads index and wait; a bad value is ErrBadInput.
func parseBlockQuery(q url.Values) (blockQuery, error) {
	var b blockQuery
	one := func(name string) (string, error) {
		vs := q[name]
		if len(vs) > 1 {
			return "", fmt.Errorf("%w: %s is given %d times: give it once", api.ErrBadInput, name, len(vs))
		}
		if len(vs) == 0 {
			return "", nil
		}
		return vs[0], nil
	}
	idx, err := one("index")
	if err != nil {
		return b, err
	}
	if idx != "" {
		if b.index, err = strconv.ParseUint(idx, 10, 64); err != nil {
			return b, fmt.Errorf("%w: index=%q: want the %s of an earlier answer, a whole number", api.ErrBadInput, clip(idx), api.IndexHeader)
		}
	}
	wait, err := one("wait")
	if err != nil {
		return b, err
	}
	b.wait = api.DefaultQueryWait
	if wait != "" {
		d, err := time.ParseDuration(wait)
		if err != nil || d <= 0 {
			return b, fmt.Errorf("%w: wait=%q: want a duration like 30s or 5m (at most %s)", api.ErrBadInput, clip(wait), api.MaxQueryWait)
		}
		b.wait = min(d, api.MaxQueryWait)
	}
	// Nomad's jitter: clients that started together do not all come back together.
	if j := int64(b.wait / 16); j > 0 {
		b.wait += time.Duration(rand.Int64N(j))
	}
	return b, nil
}

// clip bounds a query value quoted in a one-line error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// answer is a rendered read: what its handler wrote.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// recorder is the ResponseWriter a read renders into.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func render(h http.HandlerFunc, r *http.Request) *answer {
	rec := &recorder{header: http.Header{}}
	h(rec, r)
	rec.WriteHeader(http.StatusOK)
	return &answer{status: rec.status, header: rec.header, body: rec.body.Bytes()}
}

// write answers a with its index.
func (a *answer) write(w http.ResponseWriter, index uint64) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	w.Header().Set(api.IndexHeader, strconv.FormatUint(index, 10))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// blockKey names a read: its viewer, and its path and query but index and wait.
type blockKey struct {
	viewer principal
	req    string
}

func blockKeyOf(r *http.Request) blockKey {
	q := r.URL.Query()
	q.Del("index")
	q.Del("wait")
	return blockKey{viewer: principalOf(r.Context()), req: r.URL.Path + "?" + q.Encode()}
}

// stateToken is what reads answer from, as far as the master tells: while it is the same,
// so are their answers (but for what they read elsewhere; see above). The Snapshot is held
// weakly: a read kept for minutes must not keep a state the leader replaced (a third of
// the master's memory at ten thousand nodes).
type stateToken struct {
	snap                      weak.Pointer[master.Snapshot]
	jobs, confs, tenants, dcs uint64
}

func (h *blockHub) token() stateToken {
	// Node records and assignments reach answers through the Snapshot alone.
	s := h.m.Stamp()
	return stateToken{snap: weak.Make(h.m.Snapshot()), jobs: s[0], confs: s[2], tenants: s[4], dcs: s[5]}
}

// blockRead is one read's last answer as the master knows it.
type blockRead struct {
	index uint64 // where its answer last changed
	hash  uint64 // of that answer
	// render numbers the render the hash is of: an earlier one's result, landing later,
	// does not undo it. tok is the state that render began at.
	render uint64
	tok    stateToken
	asked  time.Time
	// changed is closed, and replaced, when the answer changes.
	changed chan struct{}

	// While requests wait on it (waiting > 0): how to render it again, and its last
	// answer, which every waiter is given (nil until one is rendered for them).
	waiting int
	h       http.HandlerFunc
	req     *http.Request
	ans     *answer
}

// blockHub holds the API's reads and their waiters.
type blockHub struct {
	a       *API
	m       *master.Master
	seed    maphash.Seed
	metrics blockMetrics

	mu    sync.Mutex
	reads map[blockKey]*blockRead
	// counters holds each viewer's index, the last it was given; an index starts at base,
	// the master's start in microseconds, so that an index of an earlier run, or of
	// another master, is most likely not taken for one of this run's.
	counters map[principal]uint64
	base     uint64
	renders  uint64     // renders begun, each numbered
	looked   stateToken // the state the loop last rendered the waited reads at (zero: none)
	swept    time.Time
	waiters  int
	stop     context.CancelFunc // the loop's, while it runs
	done     chan struct{}      // closed when the last loop returned

	// afterLook, when set (tests), runs between a request's look at the state (its render,
	// or the state token it waits on without one) and what it does with it: a test changes
	// the state there, as a change that comes just then would.
	afterLook func(r *http.Request)
}

func newBlockHub(a *API) *blockHub {
	return &blockHub{a: a, m: a.m, seed: maphash.MakeSeed(), metrics: newBlockMetrics(a.cfg.Registry),
		reads: map[blockKey]*blockRead{}, counters: map[principal]uint64{}, base: uint64(time.Now().UnixMicro())}
}

// counter is p's latest index. h.mu is held.
func (h *blockHub) counter(p principal) uint64 {
	return max(h.counters[p], h.base)
}

// read returns the read of key, made when there is none. h.mu is held.
func (h *blockHub) read(key blockKey, now time.Time) *blockRead {
	b, ok := h.reads[key]
	if !ok {
		h.sweep(now)
		b = &blockRead{changed: make(chan struct{})}
		h.reads[key] = b
		h.metrics.reads.Set(float64(len(h.reads)))
	}
	b.asked = now
	return b
}

// sweep drops the reads not asked for blockForget, now and then, and any it must to stay
// within blockReads; never one that requests wait on. h.mu is held.
func (h *blockHub) sweep(now time.Time) {
	if len(h.reads) < blockReads && now.Sub(h.swept) < blockForget/4 {
		return
	}
	h.swept = now
	for k, b := range h.reads {
		if b.waiting == 0 && (now.Sub(b.asked) > blockForget || len(h.reads) >= blockReads) {
			delete(h.reads, k)
		}
	}
	h.metrics.reads.Set(float64(len(h.reads)))
}

// begin numbers a render about to begin at state tok.
func (h *blockHub) begin() (uint64, stateToken) {
	tok := h.token()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renders++
	return h.renders, tok
}

// land records answer a of read b (of viewer p), from render n begun at state tok: a new
// index when it differs from the last. It reports false when a later render landed first:
// a may be of an earlier state, and is not recorded. h.mu is held.
func (h *blockHub) land(p principal, b *blockRead, n uint64, tok stateToken, a *answer) bool {
	if n < b.render {
		return false
	}
	b.render, b.tok = n, tok
	sum := h.hash(a)
	if b.index == 0 || sum != b.hash {
		h.counters[p] = h.counter(p) + 1
		b.index, b.hash = h.counters[p], sum
		close(b.changed)
		b.changed = make(chan struct{})
	}
	if b.waiting > 0 {
		b.ans = a
	}
	return true
}

func (h *blockHub) hash(a *answer) uint64 {
	var mh maphash.Hash
	mh.SetSeed(h.seed)
	var st [2]byte
	st[0], st[1] = byte(a.status>>8), byte(a.status)
	mh.Write(st[:])
	mh.WriteString(a.header.Get("Content-Type"))
	mh.Write(a.body)
	return mh.Sum64()
}

// serve wraps a read's handler with blocking queries.
func (h *blockHub) serve(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := parseBlockQuery(r.URL.Query())
		if err != nil {
			failErr(w, err)
			return
		}
		key := blockKeyOf(r)
		if q.index > 0 {
			// A client back with the index of the read's last answer, while the state
			// that answer was rendered at is the master's still, waits without a render:
			// a thousand clients answered by one render come back for nothing more.
			tok := h.token()
			if h.afterLook != nil {
				h.afterLook(r)
			}
			h.mu.Lock()
			if b, ok := h.reads[key]; ok && b.index == q.index && b.tok == tok {
				b.asked = time.Now()
				h.joinAndWait(w, r, next, key, b, q)
				return
			}
			h.mu.Unlock()
		}
		a, index, b, atOnce := h.renderNow(next, r, key, q.index)
		if atOnce || index > q.index || q.index == 0 || (a.status >= 400 && a.status != http.StatusNotFound) {
			// Changed past the client's index (or a read it never had, or an index this
			// master never gave), or a failure: answered at once. A job that does not
			// exist (404) is an answer like another: a wait on it ends when it comes.
			h.mu.Unlock()
			a.write(w, index)
			return
		}
		// h.mu is held: b.ans is what b.index stands for.
		b.ans = a
		h.joinAndWait(w, r, next, key, b, q)
	}
}

// joinAndWait makes r one of read b's waiters, renders b again for it when the loop has
// moved past b's state (see renderAgain), and waits for b's answer to change. h.mu is held
// on entry and released.
func (h *blockHub) joinAndWait(w http.ResponseWriter, r *http.Request, next http.HandlerFunc, key blockKey, b *blockRead, q blockQuery) {
	again := h.join(b, next, r)
	changed := b.changed
	h.mu.Unlock()
	if again {
		h.renderAgain(next, r, key, b)
	}
	h.wait(w, r, next, key, b, q, changed)
}

// renderAgain renders read b for r, which joined it after the loop rendered the waited
// reads at another state than b's answer is of: the loop would not render b again until
// the state changes.
func (h *blockHub) renderAgain(next http.HandlerFunc, r *http.Request, key blockKey, b *blockRead) {
	n, tok := h.begin()
	a := render(next, r)
	h.mu.Lock()
	h.land(key.viewer, b, n, tok, a)
	h.mu.Unlock()
}

// renderNow renders read key for r and records it. It returns with h.mu held, the answer,
// its index and the read; atOnce says the answer is due at once whatever the read's
// index: after is an index this master never gave the viewer (another master's, or its own
// before a restart), which says nothing of what the client has; or renders made after r's
// kept landing first and the read keeps no answer of theirs (nobody waits on it): r's
// answer then goes with an index just below the read's, so that its client's next read is
// answered at once too.
func (h *blockHub) renderNow(next http.HandlerFunc, r *http.Request, key blockKey, after uint64) (a *answer, index uint64, b *blockRead, atOnce bool) {
	for try := 1; ; try++ {
		n, tok := h.begin()
		a = render(next, r)
		if h.afterLook != nil {
			h.afterLook(r)
		}
		h.mu.Lock()
		future := after > h.counter(key.viewer)
		b = h.read(key, time.Now())
		landed := h.land(key.viewer, b, n, tok, a)
		if !landed && b.ans != nil {
			a, landed = b.ans, true // a later render's, which waiters are given
		}
		if landed {
			return a, b.index, b, future
		}
		if try == staleRenders {
			return a, b.index - 1, b, true
		}
		h.mu.Unlock()
	}
}

// wait holds r, which joined read b, until the read's answer changes past q.index, q.wait
// elapses, the server shuts down or the client leaves.
func (h *blockHub) wait(w http.ResponseWriter, r *http.Request, next http.HandlerFunc, key blockKey, b *blockRead, q blockQuery, changed <-chan struct{}) {
	defer h.leave(b)
	// The server's write timeout would cut the wait: the answer is due after it.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(q.wait + api.WriteTimeout))
	timer := time.NewTimer(q.wait)
	defer timer.Stop()
	stop := h.a.stops.stopping(r)
	for {
		over := false
		select {
		case <-changed:
		case <-timer.C:
			over = true
		case <-stop:
			over = true
		case <-r.Context().Done():
			return
		}
		h.mu.Lock()
		a, index := b.ans, b.index
		changed = b.changed
		h.mu.Unlock()
		if index > q.index || over {
			// Changed; or the wait is over (Nomad's semantics: the same answer, with the
			// same index), or the server is shutting down.
			if a == nil {
				// Joined without a render (see serve), and nothing changed since: the
				// answer is made now.
				a, index, _, _ = h.renderNow(next, r, key, 0)
				h.mu.Unlock()
			}
			a.write(w, index)
			return
		}
	}
}

// join makes r wait on b, starting the loop when it is the first waiter; again reports
// that the loop rendered the waited reads at another state than b's answer is of (and
// will not render b until the state changes again). h.mu is held.
func (h *blockHub) join(b *blockRead, next http.HandlerFunc, r *http.Request) (again bool) {
	b.waiting++
	if b.req == nil {
		// The loop renders the read again in a context of its own, with the viewer's.
		b.h, b.req = next, r.Clone(context.Background())
	}
	h.waiters++
	h.metrics.waiting.Set(float64(h.waiters))
	if h.stop == nil {
		ctx, stop := context.WithCancel(context.Background())
		prev, done := h.done, make(chan struct{})
		h.stop, h.done, h.looked = stop, done, stateToken{}
		go h.loop(ctx, prev, done)
	}
	return h.looked != (stateToken{}) && b.tok != h.looked
}

// leave ends a wait on b; the last waiter stops the loop.
func (h *blockHub) leave(b *blockRead) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b.waiting--
	if b.waiting == 0 {
		b.h, b.req, b.ans = nil, nil, nil
	}
	h.waiters--
	h.metrics.waiting.Set(float64(h.waiters))
	if h.waiters == 0 {
		h.stop()
		h.stop = nil
	}
}

// loop renders the waited reads again when the master's state changes, until ctx ends (the
// last waiter left). prev is the previous loop's done channel: one loop runs at a time.
func (h *blockHub) loop(ctx context.Context, prev <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	if prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return
		}
	}
	seen := h.m.ChangeIndex()
	var lookedAt time.Time
	// A master that does not lead builds its state at most once per master.ReadRefresh: a
	// change seen before it was built is looked at again once it may have been, though
	// nothing else changes.
	var again time.Time
	// The first look renders the reads whose answers are of another state than the
	// master's: it may have changed since their waiters rendered them.
	var last stateToken
	for first := true; ; first = false {
		if !first {
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if !again.IsZero() {
				wctx, cancel = context.WithDeadline(ctx, again)
			}
			idx, err := h.m.WaitChange(wctx, seen)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				seen = idx
				again = time.Now().Add(master.ReadRefresh + api.WatchInterval)
			} else {
				again = time.Time{}
			}
			// At most one look per api.WatchInterval: changes within it are taken together.
			if ctxtime.Sleep(ctx, time.Until(lookedAt.Add(api.WatchInterval))) != nil {
				return
			}
		}
		tok := h.token()
		lookedAt = time.Now()
		if tok == last {
			continue // reads that joined since at another state rendered themselves
		}
		last = tok
		h.renderWaited(ctx, tok)
	}
}

// renderWaited renders once each read that requests wait on whose answer is of another
// state than tok, the master's now.
func (h *blockHub) renderWaited(ctx context.Context, tok stateToken) {
	type job struct {
		key blockKey
		b   *blockRead
		h   http.HandlerFunc
		req *http.Request
		n   uint64
	}
	h.mu.Lock()
	if ctx.Err() != nil {
		h.mu.Unlock()
		return // the last waiter left; a new loop may be looking already
	}
	h.looked = tok
	var jobs []job
	for k, b := range h.reads {
		if b.waiting > 0 && b.tok != tok {
			h.renders++
			jobs = append(jobs, job{k, b, b.h, b.req, h.renders})
		}
	}
	h.mu.Unlock()
	for _, j := range jobs {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, api.WriteTimeout)
		a := render(j.h, j.req.WithContext(context.WithValue(rctx, principalKey{}, j.key.viewer)))
		cancel()
		h.metrics.renders.Inc()
		h.mu.Lock()
		h.land(j.key.viewer, j.b, j.n, tok, a)
		h.mu.Unlock()
	}
}

// blockMetrics are the blocking queries' series.
type blockMetrics struct {
	waiting prometheus.Gauge
	reads   prometheus.Gauge
	renders prometheus.Counter
}

func newBlockMetrics(reg prometheus.Registerer) blockMetrics {
	const ns, sub = "stormdock", "master"
	m := blockMetrics{
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "blocking_queries",
			Help: "API reads waiting now for their answer to change (blocking queries: ?index=N)."}),
		reads: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "blocking_reads",
			Help: "Reads (viewer, path and query) whose last answer's hash and index the master keeps."}),
		renders: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "blocking_renders_total",
			Help: "Answers of waited reads made again after a change: one per read and change, however many wait on it."}),
	}
	if reg != nil {
		m.waiting = register(reg, m.waiting)
		m.reads = register(reg, m.reads)
		m.renders = register(reg, m.renders)
	}
	return m
}
