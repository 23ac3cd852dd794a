package master

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// TestEventLogTwoWriters appends from two masters at once: both end up serving the same
// events, in one order, within the count bound, each append one store transaction.
func TestEventLogTwoWriters(t *testing.T) {
	tc := newTestCluster(t)
	cfg := EventsConfig{Max: 100, Flush: 2 * time.Millisecond}
	logs := make([]*eventLog, 2)
	regs := make([]*prometheus.Registry, 2)
	for i := range logs {
		regs[i] = prometheus.NewRegistry()
		logs[i] = newEventLog(tc.connect(-1), cfg, fmt.Sprintf("m%d", i), quiet, newMetrics(regs[i]))
		tc.wg.Add(1)
		go func() {
			defer tc.wg.Done()
			logs[i].run(tc.ctx, func() bool { return i == 0 })
		}()
	}
	const each = 300
	var wg sync.WaitGroup
	for i, l := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range each {
				l.emit(api.Event{Kind: api.EventAPICall, Object: fmt.Sprintf("job/j%d", n), Reason: fmt.Sprintf("from %d, #%d", i, n)})
				if n%37 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	last := func(l *eventLog) int64 {
		evs, _ := l.query(api.EventFilter{}, 0)
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
	a, _ := logs[0].query(api.EventFilter{}, 0)
	b, _ := logs[1].query(api.EventFilter{}, 0)
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
	tc := newTestCluster(t)
	l := newEventLog(tc.connect(-1), EventsConfig{Max: 100, MaxAge: time.Hour, Flush: time.Millisecond}, "m", quiet, newMetrics(nil))
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		l.run(tc.ctx, func() bool { return false })
	}()
	old := time.Now().Add(-2 * time.Hour)
	for i := range 30 {
		l.emit(api.Event{Kind: api.EventNodeLost, Object: "node/n", Time: old, Reason: fmt.Sprint(i)})
	}
	testenv.Eventually(t, "old events written", 5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.next >= 30
	})
	if evs, _ := l.query(api.EventFilter{}, 0); len(evs) != 0 {
		t.Fatalf("events older than the age bound are served: %d", len(evs))
	}
	if err := l.trimAge(tc.ctx); err != nil {
		t.Fatal(err)
	}
	if kids, _ := tc.admin.Children(tc.ctx, cluster.EventsKey); len(kids) != 0 {
		t.Fatalf("old slots left in the store: %v", kids)
	}
	l.emit(api.Event{Kind: api.EventNodeLost, Object: "node/n", Reason: "new"})
	testenv.Eventually(t, "a new event after the trim", 5*time.Second, func() bool {
		evs, _ := l.query(api.EventFilter{}, 0)
		return len(evs) == 1 && evs[0].Reason == "new" && evs[0].ID >= 40
	})
}

// sse reads a followed event stream into a channel.
func sse(t *testing.T, ctx context.Context, url, token string) <-chan api.Event {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("follow: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	ch := make(chan api.Event, 1000)
	go func() {
		defer resp.Body.Close()
		defer close(ch)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var e api.Event
				if json.Unmarshal([]byte(d), &e) == nil {
					ch <- e
				}
			}
		}
	}()
	return ch
}

// TestMasterEvents runs a master with simulated agents and checks the events of a job's
// life, of a lost node and of a crash loop, followed as a stream, filtered, and scoped to
// a tenant.
func TestMasterEvents(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	srv := httptest.NewServer(m.Handler(nil))
	t.Cleanup(srv.Close)
	admin := setAdminToken(t, tc)
	n1 := tc.node(cluster.Node{ID: "n1", DC: "dc-a", Rack: "r1", Slots: 4, Memory: 4 << 30, CPU: 4000})
	tc.node(cluster.Node{ID: "n2", DC: "dc-b", Rack: "r1", Slots: 4, Memory: 4 << 30, CPU: 4000})
	testenv.Eventually(t, "leading with 2 nodes", 5*time.Second, func() bool { return m.Leader() && len(m.view().nodes) == 2 })
	ctx, cancel := context.WithCancel(tc.ctx)
	defer cancel()
	stream := sse(t, ctx, srv.URL+"/v1/events?follow=true", admin)
	for _, tn := range []string{"search", "ads"} {
		if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: tn}}); err != nil {
			t.Fatal(err)
		}
	}
	adsToken, err := SetTenantToken(tc.ctx, tc.admin, "ads")
	if err != nil {
		t.Fatal(err)
	}
	spec := testSpec("wc", 2)
	spec.Placement.Spread = []string{"dc"}
	if _, err := SubmitJob(tc.ctx, tc.admin, spec); err != nil {
		t.Fatal(err)
	}
	ads := testSpec("adjob", 1)
	ads.Tenant = "ads"
	if _, err := SubmitJob(tc.ctx, tc.admin, ads); err != nil {
		t.Fatal(err)
	}
	var got []api.Event
	waitFor := func(what string, match func(e api.Event) bool) api.Event {
		t.Helper()
		for _, e := range got {
			if match(e) {
				return e
			}
		}
		deadline := time.After(testenv.Timeout(10 * time.Second))
		for {
			select {
			case e, ok := <-stream:
				if !ok {
					t.Fatalf("stream ended waiting for %s", what)
				}
				got = append(got, e)
				if match(e) {
					return e
				}
			case <-deadline:
				t.Fatalf("no %s event; got %v", what, got)
			}
		}
	}
	kind := func(k, object string) func(api.Event) bool {
		return func(e api.Event) bool { return e.Kind == k && (object == "" || e.Object == object) }
	}
	waitFor("leading", kind(api.EventMasterLeading, ""))
	waitFor("wc submitted", kind(api.EventJobSubmitted, "job/wc"))
	waitFor("wc/0 placed", kind(api.EventWorkerPlaced, "worker/wc/0"))
	waitFor("wc/1 placed", kind(api.EventWorkerPlaced, "worker/wc/1"))
	waitFor("adjob/0 placed", kind(api.EventWorkerPlaced, "worker/adjob/0"))
	placedOnN1 := ""
	for _, e := range got {
		if e.Kind == api.EventWorkerPlaced && e.Node == "n1" && e.Job == "wc" {
			placedOnN1 = e.Object
		}
	}
	if placedOnN1 == "" {
		t.Fatalf("no worker of wc placed on n1: %v", got)
	}
	// Node n1 lost: its worker moves (the simulated agents run every assigned worker at once).
	n1.Close()
	lost := waitFor("n1 lost", kind(api.EventNodeLost, "node/n1"))
	if lost.DC != "dc-a" || !strings.Contains(lost.Reason, "session") {
		t.Errorf("lost event: %+v", lost)
	}
	moved := waitFor("worker moved off n1", func(e api.Event) bool { return e.Kind == api.EventWorkerMoved && e.Object == placedOnN1 })
	if moved.Node != "n1" || moved.To != "n2" || moved.Reason == "" || moved.Tenant != "search" {
		t.Errorf("move event: %+v", moved)
	}
	// Scaled: a job event and its new worker placed.
	if _, err := ScaleJob(tc.ctx, tc.admin, "wc", 3); err != nil {
		t.Fatal(err)
	}
	if e := waitFor("wc scaled", kind(api.EventJobScaled, "job/wc")); e.Reason != "from 2 to 3 workers" {
		t.Errorf("scale event: %+v", e)
	}
	waitFor("wc/2 placed", kind(api.EventWorkerPlaced, "worker/wc/2"))
	for i := 1; i < len(got); i++ {
		if got[i].ID <= got[i-1].ID {
			t.Fatalf("stream out of order: %d after %d", got[i].ID, got[i-1].ID)
		}
	}

	// The list, filtered; a tenant sees its own jobs' events alone.
	list := func(token, query string) []api.Event {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/events"+query, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var evs []api.Event
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&evs) != nil {
			t.Fatalf("GET /v1/events%s: %s", query, resp.Status)
		}
		return evs
	}
	for _, e := range list(admin, "?node=n2") {
		if e.Node != "n2" && e.To != "n2" {
			t.Errorf("node filter let through %+v", e)
		}
	}
	mine := list(adsToken, "")
	if len(mine) == 0 {
		t.Fatal("tenant ads sees no events")
	}
	for _, e := range mine {
		if e.Tenant != "ads" || e.Job != "adjob" {
			t.Errorf("tenant ads sees %+v", e)
		}
	}
	if evs := list(admin, "?job=wc&since=1h"); len(evs) == 0 {
		t.Error("no events of wc in the last hour")
	}
	for _, q := range []string{"?since=yesterday", "?job=Bad_Name", "?after=-1", "?follow=maybe"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/events"+q, nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/events%s: %s, want 400", q, resp.Status)
		}
	}
}

// setAdminToken stores an admin token's hash and returns the token.
func setAdminToken(t *testing.T, tc *testCluster) string {
	t.Helper()
	tok := api.NewToken()
	if _, err := tc.admin.Put(tc.ctx, cluster.AdminTokenKey, []byte(api.HashToken(tok)), coord.AnyVersion); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestEventLogAtBound fills a master's events to the default bound with events of the size
// the leader records (a worker's move, with its reason) and reports what they take: in the
// master's memory and in the store.
func TestEventLogAtBound(t *testing.T) {
	tc := newTestCluster(t)
	cfg := EventsConfig{Max: DefaultEventsMax, Flush: time.Millisecond}
	reg := prometheus.NewRegistry()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := newEventLog(tc.connect(-1), cfg, "m1", quiet, newMetrics(reg))
	tc.wg.Add(1)
	go func() {
		defer tc.wg.Done()
		l.run(tc.ctx, func() bool { return true })
	}()
	total := cfg.Max + cfg.Max/2 // past the bound: the oldest go
	for i := range total {
		w := i % 100
		l.emit(api.Event{Kind: api.EventWorkerMoved, Object: fmt.Sprintf("worker/wordcount-%d/%d", i%50, w), Job: fmt.Sprintf("wordcount-%d", i%50),
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
	evs, _ := l.query(api.EventFilter{}, 0)
	if len(evs) != cfg.Max {
		t.Fatalf("%d events served; the bound is %d", len(evs), cfg.Max)
	}
	evs = nil
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
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
	evs = nil
	l.mu.Lock()
	held := l.slots
	l.slots = map[int64][]api.Event{}
	l.mu.Unlock()
	runtime.GC()
	var dropped runtime.MemStats
	runtime.ReadMemStats(&dropped)
	runtime.KeepAlive(held)
	held = nil
	runtime.GC()
	runtime.ReadMemStats(&dropped)
	master := float64(int64(after.HeapAlloc)-int64(dropped.HeapAlloc)) / (1 << 20)
	kept := testenv.Metric(t, reg, "stormdock_master_events_kept", nil)
	batches := testenv.Metric(t, reg, "stormdock_master_event_batches_total", nil)
	t.Logf("figure: events at the bound (--events-max %d, %d recorded): %d served, %.0f held; the master's heap for them %.1f MiB (%.0f bytes an event; the test process, embedded store included, grew by %.1f MiB); store: %d slots, %.1f MiB; %.0f append transactions",
		cfg.Max, total, cfg.Max, kept, master, master*(1<<20)/kept, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), len(kids), float64(stored)/(1<<20), batches)
	if len(kids) > int(cfg.slotsKept())+1 {
		t.Errorf("%d slots in the store; the bound needs %d", len(kids), cfg.slotsKept())
	}
	runtime.KeepAlive(l)
}

// TestFailoverEvents: a failover a router records in its job's record becomes a
// link.failover event of the job's tenant; the failover before the master led does not.
func TestFailoverEvents(t *testing.T) {
	tc := newTestCluster(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("mj", 1)
	spec.Links, spec.Output = []string{"dc-a", "dc-b"}, "file:///tmp/out.jsonl"
	if _, err := SubmitJob(tc.ctx, tc.admin, spec); err != nil {
		t.Fatal(err)
	}
	write := func(from, to, reason string, at time.Time, next int64) {
		t.Helper()
		rec := multidc.RouterRecord{Status: multidc.Status{Job: "mj", Active: to,
			LastFailover: &multidc.Failover{From: from, To: to, Reason: reason, At: at, NextOffset: next}}}
		b, _ := json.Marshal(rec)
		if _, err := tc.admin.Put(tc.ctx, cluster.RoutersKey+"/mj", b, coord.AnyVersion); err != nil {
			t.Fatal(err)
		}
	}
	write("dc-b", "dc-a", multidc.ReasonHeartbeat, time.Now().Add(-time.Hour), 10) // before this master
	m, _, _ := tc.master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	// A failover the moment the master leads, while its watch may still be listing the
	// routers' records, is recorded as one of its term (rounded up: the term began before).
	at := time.Now().Truncate(time.Millisecond).Add(time.Millisecond)
	write("dc-a", "dc-b", multidc.ReasonManual, at, 1234)
	testenv.EventuallyWith(t, "the failover's event", 5*time.Second, func() (bool, string) {
		evs, _ := m.events.query(api.EventFilter{Job: "mj"}, 0)
		var fo []api.Event
		for _, e := range evs {
			if e.Kind == api.EventLinkFailover {
				fo = append(fo, e)
			}
		}
		if len(fo) != 1 {
			return false, fmt.Sprintf("%+v", fo)
		}
		e := fo[0]
		ok := e.Object == "link/mj@dc-b" && e.Link == "dc-b" && e.Tenant == "search" && e.Time.Equal(at) &&
			e.Reason == "from dc-a to dc-b (manual), delivering from offset 1234"
		return ok, fmt.Sprintf("%+v", e)
	})
}

// A job submitted between a master's election and its first view of the cluster is in that
// view's baseline; its submission is still recorded, by the time it was made, while a job
// submitted before the term began is the last leader's to record.
func TestSubmittedAtTermStart(t *testing.T) {
	tc := newTestCluster(t)
	m, _, _ := tc.master("m1")
	testenv.Eventually(t, "leading", 5*time.Second, m.Leader)
	since := time.Now()
	job := func(name string, submitted time.Time) jobEntry {
		spec := testSpec(name, 1)
		return jobEntry{rec: cluster.JobRecord{Spec: *spec, State: cluster.JobRunning, Submitted: submitted}}
	}
	// The reconciler of a term whose first view holds both jobs.
	r := &reconciler{m: m, since: since}
	r.observeEvents(&view{jobs: map[string]jobEntry{
		"before": job("before", since.Add(-time.Second)),
		"after":  job("after", since.Add(time.Millisecond)),
	}})
	testenv.EventuallyWith(t, "the submission after the term began recorded", 5*time.Second, func() (bool, string) {
		var got []string
		for _, job := range []string{"before", "after"} {
			evs, _ := m.events.query(api.EventFilter{Job: job}, 0)
			for _, e := range evs {
				if e.Kind == api.EventJobSubmitted {
					got = append(got, e.Job)
				}
			}
		}
		return slices.Equal(got, []string{"after"}), fmt.Sprintf("submitted events for %v", got)
	})
}
