package eventlog

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// testStore is an embedded store with the events' directory, and an admin client.
type testStore struct {
	t     testing.TB
	srv   *coord.Server
	ctx   context.Context
	admin *coord.Embedded
	wg    sync.WaitGroup
}

var quiet = slog.New(slog.DiscardHandler)

func newTestStore(t testing.TB) *testStore {
	t.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc := &testStore{t: t, srv: srv, ctx: ctx}
	t.Cleanup(func() {
		cancel()
		tc.wg.Wait()
		srv.Close()
	})
	tc.admin = tc.connect(-1)
	if _, err := tc.admin.Create(ctx, cluster.EventsKey, nil, coord.Persistent); err != nil {
		t.Fatal(err)
	}
	return tc
}

func (tc *testStore) connect(timeout time.Duration) *coord.Embedded {
	c, err := tc.srv.Connect(coord.Options{SessionTimeout: timeout, Logger: quiet})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c
}

// newMetrics makes the log's series, registered with reg unless it is nil.
func newMetrics(reg prometheus.Registerer) *Metrics {
	m := NewMetrics(prometheus.NewCounter(prometheus.CounterOpts{Name: "store_writes_total"}))
	if reg != nil {
		reg.MustRegister(m.Collectors()...)
	}
	return m
}

// TestEventLogTwoWriters appends from two masters at once: both end up serving the same
// events, in one order, within the count bound, each append one store transaction.
func TestEventLogTwoWriters(t *testing.T) {
	tc := newTestStore(t)
	cfg := Config{Max: 100, Flush: 2 * time.Millisecond}
	logs := make([]*Log, 2)
	regs := make([]*prometheus.Registry, 2)
	for i := range logs {
		regs[i] = prometheus.NewRegistry()
		logs[i] = New(tc.connect(-1), cfg, fmt.Sprintf("m%d", i), quiet, newMetrics(regs[i]))
		tc.wg.Add(1)
		go func() {
			defer tc.wg.Done()
			logs[i].Run(tc.ctx, func() (coord.Fence, bool) { return coord.Fence{}, i == 0 })
		}()
	}
	const each = 300
	var wg sync.WaitGroup
	for i, l := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range each {
				l.Emit(api.Event{Kind: api.EventAPICall, Object: fmt.Sprintf("job/j%d", n), Reason: fmt.Sprintf("from %d, #%d", i, n)})
				if n%37 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	last := func(l *Log) int64 {
		evs, _ := l.Query(api.EventFilter{}, 0)
		if len(evs) == 0 {
			return -1
		}
		return evs[len(evs)-1].ID
	}
	testenv.EventuallyWith(t, "both masters' events written and seen by both", 10*time.Second, func() (bool, string) {
		for _, l := range logs {
			l.qmu.Lock()
			q := len(l.queue)
			l.qmu.Unlock()
			if q > 0 {
				return false, fmt.Sprintf("%s has %d queued", l.master, q)
			}
		}
		return last(logs[0]) == last(logs[1]) && last(logs[0]) > 0, fmt.Sprintf("last ids %d, %d", last(logs[0]), last(logs[1]))
	})
	a, _ := logs[0].Query(api.EventFilter{}, 0)
	b, _ := logs[1].Query(api.EventFilter{}, 0)
	if len(a) != cfg.Max || len(b) != cfg.Max {
		t.Fatalf("masters serve %d and %d events; want the bound, %d", len(a), len(b), cfg.Max)
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Reason != b[i].Reason {
			t.Fatalf("event %d differs between masters: %+v vs %+v", i, a[i], b[i])
		}
		if i > 0 && a[i].ID <= a[i-1].ID {
			t.Fatalf("events out of order: %d after %d", a[i].ID, a[i-1].ID)
		}
	}
	// Each writer's own events keep their order.
	for _, from := range []string{"from 0", "from 1"} {
		prev := -1
		for _, e := range a {
			if strings.HasPrefix(e.Reason, from) {
				var n int
				fmt.Sscanf(e.Reason[strings.Index(e.Reason, "#")+1:], "%d", &n)
				if n <= prev {
					t.Fatalf("%s: #%d after #%d", from, n, prev)
				}
				prev = n
			}
		}
	}
	kids, err := tc.admin.Children(tc.ctx, cluster.EventsKey)
	if err != nil {
		t.Fatal(err)
	}
	if max := int(cfg.slotsKept()) + 1; len(kids) > max {
		t.Errorf("the store holds %d event slots; the bound of %d events needs %d at most", len(kids), cfg.Max, max)
	}
	batches := testenv.Metric(t, regs[0], "stormdock_master_event_batches_total", nil) + testenv.Metric(t, regs[1], "stormdock_master_event_batches_total", nil)
	t.Logf("figure: %d events from two masters appended in %.0f store transactions", 2*each, batches)
	if batches >= 2*each {
		t.Errorf("%.0f transactions for %d events: events are not batched", batches, 2*each)
	}
}

// TestEventLogAge drops what is older than the age bound, in the store too.
func TestEventLogAge(t *testing.T) {
	tc := newTestStore(t)
	l := New(tc.connect(-1), Config{Max: 100, MaxAge: time.Hour, Flush: time.Millisecond}, "m", quiet, newMetrics(nil))
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		l.Run(tc.ctx, func() (coord.Fence, bool) { return coord.Fence{}, false })
	}()
	old := time.Now().Add(-2 * time.Hour)
	for i := range 30 {
		l.Emit(api.Event{Kind: api.EventNodeLost, Object: "node/n", Time: old, Reason: fmt.Sprint(i)})
	}
	testenv.Eventually(t, "old events written", 5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.next >= 30
	})
	if evs, _ := l.Query(api.EventFilter{}, 0); len(evs) != 0 {
		t.Fatalf("events older than the age bound are served: %d", len(evs))
	}
	if err := l.trimAge(tc.ctx, l.store); err != nil {
		t.Fatal(err)
	}
	if kids, _ := tc.admin.Children(tc.ctx, cluster.EventsKey); len(kids) != 0 {
		t.Fatalf("old slots left in the store: %v", kids)
	}
	l.Emit(api.Event{Kind: api.EventNodeLost, Object: "node/n", Reason: "new"})
	testenv.Eventually(t, "a new event after the trim", 5*time.Second, func() bool {
		evs, _ := l.Query(api.EventFilter{}, 0)
		return len(evs) == 1 && evs[0].Reason == "new" && evs[0].ID >= 40
	})
}

// TestEventLogAtBound fills a master's events to the default bound with events of the size
// the leader records (a worker's move, with its reason) and reports what they take: in the
// master's memory and in the store.
func TestEventLogAtBound(t *testing.T) {
	tc := newTestStore(t)
	cfg := Config{Max: DefaultMax, Flush: time.Millisecond}
	reg := prometheus.NewRegistry()
	before := testenv.LiveHeap()
	l := New(tc.connect(-1), cfg, "m1", quiet, newMetrics(reg))
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		l.Run(tc.ctx, func() (coord.Fence, bool) { return coord.Fence{}, true })
	}()
	total := cfg.Max + cfg.Max/2 // past the bound: the oldest go
	for i := range total {
		w := i % 100
		l.Emit(api.Event{Kind: api.EventWorkerMoved, Object: fmt.Sprintf("worker/wordcount-%d/%d", i%50, w), Job: fmt.Sprintf("wordcount-%d", i%50),
			Tenant: "search", Worker: &w, Node: fmt.Sprintf("dc-a-r%d-n%d", i%25, i%40), DC: "dc-a", To: "dc-b-r3-n7", ToDC: "dc-b",
			Reason: "node dc-a-r3-n12 is lost: its entry left the store (session expired)"})
		if i%1000 == 999 {
			testenv.Eventually(t, "the queue written", 10*time.Second, func() bool {
				l.qmu.Lock()
				defer l.qmu.Unlock()
				return len(l.queue) == 0
			})
		}
	}
	testenv.Eventually(t, "every event written", 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.next > int64(total)
	})
	evs, _ := l.Query(api.EventFilter{}, 0)
	if len(evs) != cfg.Max {
		t.Fatalf("%d events served; the bound is %d", len(evs), cfg.Max)
	}
	evs = nil
	after := testenv.LiveHeap()
	kids, err := tc.admin.Children(tc.ctx, cluster.EventsKey)
	if err != nil {
		t.Fatal(err)
	}
	var stored int
	for _, k := range kids {
		e, err := tc.admin.Get(tc.ctx, cluster.EventsKey+"/"+k)
		if err != nil {
			t.Fatal(err)
		}
		stored += len(e.Value)
	}
	// What the master itself holds: the heap its events free when it drops them.
	l.mu.Lock()
	l.slots = map[int64][]api.Event{}
	l.mu.Unlock()
	dropped := testenv.LiveHeap()
	master := float64(int64(after)-int64(dropped)) / (1 << 20)
	kept := testenv.Metric(t, reg, "stormdock_master_events_kept", nil)
	batches := testenv.Metric(t, reg, "stormdock_master_event_batches_total", nil)
	t.Logf("figure: events at the bound (--events-max %d, %d recorded): %d served, %.0f held; the master's heap for them %.1f MiB (%.0f bytes an event; the test process, embedded store included, grew by %.1f MiB); store: %d slots, %.1f MiB; %.0f append transactions",
		cfg.Max, total, cfg.Max, kept, master, master*(1<<20)/kept, float64(int64(after)-int64(before))/(1<<20), len(kids), float64(stored)/(1<<20), batches)
	if len(kids) > int(cfg.slotsKept())+1 {
		t.Errorf("%d slots in the store; the bound needs %d", len(kids), cfg.slotsKept())
	}
	runtime.KeepAlive(l)
}

// TestEmitPastBound: a burst past the count bound keeps the newest Max events, in order, and
// counts the rest as dropped; what a flush writes leaves the queue, what it did not stays.
func TestEmitPastBound(t *testing.T) {
	tc := newTestStore(t)
	cfg := Config{Max: 100}
	reg := prometheus.NewRegistry()
	l := New(tc.connect(-1), cfg, "m1", quiet, newMetrics(reg))
	for i := range 3*cfg.Max + 7 {
		l.Emit(api.Event{Kind: api.EventWorkerMoved, Object: fmt.Sprintf("worker/w/%d", i)})
	}
	l.qmu.Lock()
	if len(l.queue) != cfg.Max || l.dropped != 2*cfg.Max+7 || l.queue[0].Object != fmt.Sprintf("worker/w/%d", 2*cfg.Max+7) {
		t.Fatalf("queue of %d from %s, %d dropped", len(l.queue), l.queue[0].Object, l.dropped)
	}
	l.qmu.Unlock()
	if _, err := l.flush(tc.ctx); err != nil {
		t.Fatal(err)
	}
	l.qmu.Lock()
	defer l.qmu.Unlock()
	if len(l.queue) != 0 || l.dropped != 0 {
		t.Fatalf("after a flush: %d queued, %d dropped", len(l.queue), l.dropped)
	}
}

// BenchmarkEmitPastBound is a data center's loss recorded: far more events than the bound
// at once (each op emits one beyond it).
func BenchmarkEmitPastBound(b *testing.B) {
	l := New(nil, Config{}, "m1", quiet, newMetrics(nil))
	for i := range DefaultMax {
		l.Emit(api.Event{Kind: api.EventWorkerMoved, Object: fmt.Sprintf("worker/w/%d", i)})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Emit(api.Event{Kind: api.EventWorkerMoved, Object: "worker/w/0"})
	}
}
