package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/heapprofiler"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/placement/synth"
)

// fixture is a simulated cluster: a real master on an embedded store, and stand-in
// agents that register nodes and report every worker assigned to them as running (as
// scheduler's tests do), without processes. It is not the simulated-agent benchmark of
// the scale issue: it measures the console and its stream, not agents.
type fixture struct {
	b      testing.TB
	srv    *coord.Server
	agents *coord.Embedded // one session holds every stand-in node
	master *daemon.Master
	cl     *api.Client
	token  string
	mu     sync.Mutex
	nodes  map[string]*cluster.NodeRecord
	// assigned is when a stand-in last received an assignment.
	assigned time.Time
	ctx      context.Context
}

func newFixture(b testing.TB, cfg synth.Config) *fixture {
	b.Helper()
	srv, err := coord.NewServer(coord.ServerOptions{Logger: testenv.Logger(b, slog.LevelWarn)})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{b: b, srv: srv, nodes: map[string]*cluster.NodeRecord{}, ctx: ctx}
	mc, err := srv.Connect(coord.Options{Logger: testenv.Logger(b, slog.LevelWarn)})
	if err != nil {
		b.Fatal(err)
	}
	if f.agents, err = srv.Connect(coord.Options{Logger: testenv.Logger(b, slog.LevelWarn)}); err != nil {
		b.Fatal(err)
	}
	data := b.TempDir()
	f.master, err = daemon.NewMaster(ctx, daemon.MasterConfig{OpenedStore: mc, Listen: "127.0.0.1:0", ID: "m1", DataDir: data, Logger: testenv.Logger(b, slog.LevelWarn)})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.master.Run(ctx)
	}()
	var wg sync.WaitGroup
	b.Cleanup(func() {
		cancel()
		<-done
		wg.Wait()
		f.master.Close()
		f.agents.Close()
		mc.Close()
		srv.Close()
	})
	tok, err := os.ReadFile(filepath.Join(data, api.AdminTokenFile))
	if err != nil {
		b.Fatal(err)
	}
	f.token = strings.TrimSpace(string(tok))
	f.cl, _ = api.NewClient(f.master.URL(), f.token)
	for _, n := range cfg.Nodes() {
		f.node(ctx, n, &wg)
	}
	tenants := map[string]bool{}
	for _, spec := range cfg.JobSpecs() {
		if !tenants[spec.Tenant] {
			tenants[spec.Tenant] = true
			if err := desired.CreateTenant(ctx, mc, cluster.TenantRecord{Tenant: cluster.Tenant{Name: spec.Tenant, MaxPriority: cluster.MaxPriority}}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := desired.SubmitJob(ctx, mc, &spec); err != nil {
			b.Fatal(err)
		}
	}
	testenv.EventuallyWith(b, fmt.Sprintf("%d workers running", cfg.Workers), 5*time.Minute, func() (bool, string) {
		jobs, err := f.cl.Jobs(ctx)
		if err != nil {
			return false, err.Error()
		}
		running := 0
		for _, j := range jobs {
			running += j.Running
		}
		return running == cfg.Workers, fmt.Sprintf("%d running", running)
	})
	return f
}

// node registers a stand-in agent: its record, and every assigned worker reported running
// with a memory reading of half its request.
func (f *fixture) node(ctx context.Context, n cluster.Node, wg *sync.WaitGroup) {
	n.Labels = map[string]string{"isolation/process": "true"}
	rec := &cluster.NodeRecord{Node: n, Health: cluster.NodeHealth{State: cluster.HealthHealthy}, Isolation: []string{"process"}, Workers: []cluster.WorkerStatus{}}
	f.mu.Lock()
	f.nodes[n.ID] = rec
	val, _ := json.Marshal(rec)
	f.mu.Unlock()
	if _, err := f.agents.Create(ctx, must(cluster.NodeKey(n.ID)), val, coord.Ephemeral); err != nil {
		f.b.Fatal(err)
	}
	ch, err := f.agents.Watch(ctx, must(cluster.AssignmentKey(n.ID)))
	if err != nil {
		f.b.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range ch {
			var a cluster.NodeAssignment
			if ev.Exists {
				_ = json.Unmarshal(ev.Entry.Value, &a)
			}
			f.mu.Lock()
			f.assigned = time.Now()
			f.mu.Unlock()
			f.update(n.ID, func(r *cluster.NodeRecord) {
				r.Workers = r.Workers[:0]
				for _, w := range a.Workers {
					if !w.Stop {
						r.Workers = append(r.Workers, cluster.WorkerStatus{Key: w.Key, Generation: w.Generation, State: cluster.WorkerRunning,
							PID: 1000 + w.Key.Worker, Memory: w.Resources.Memory / 2})
					}
				}
			})
		}
	}()
}

// update changes a stand-in node's record and writes it.
func (f *fixture) update(id string, change func(*cluster.NodeRecord)) {
	f.mu.Lock()
	rec := f.nodes[id]
	change(rec)
	val, _ := json.Marshal(rec)
	f.mu.Unlock()
	_, _ = f.agents.Put(f.ctx, must(cluster.NodeKey(id)), val, coord.AnyVersion)
}

// metric reads a counter or gauge of the master, or a histogram's sum (count: name_count).
func (f *fixture) metric(name string) float64 {
	if base, ok := strings.CutSuffix(name, "_count"); ok {
		return f.histogramCount(base)
	}
	mfs, err := f.master.Registry().Gather()
	if err != nil {
		f.b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return m.Histogram.GetSampleSum()
			}
		}
	}
	return 0
}

func (f *fixture) histogramCount(name string) float64 {
	mfs, err := f.master.Registry().Gather()
	if err != nil {
		f.b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 && mf.GetMetric()[0].Histogram != nil {
			return float64(mf.GetMetric()[0].Histogram.GetSampleCount())
		}
	}
	return 0
}

// BenchmarkConsole1000Nodes measures the console on a simulated cluster of 1,000 nodes
// (4 data centers x 5 racks x 50 nodes, 16 slots) and 10,000 workers of 100 jobs: time
// to first render, time for a change to appear, browser memory, bytes per update. Run it
// once: go test -run '^$' -bench Console1000 -benchtime 1x ./console
func BenchmarkConsole1000Nodes(b *testing.B) {
	cfg := synth.Config{DCs: 4, RacksPerDC: 5, NodesPerRack: 50, Slots: 16, Memory: 64 << 30, CPU: 32000,
		Jobs: 100, Workers: 10000, Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: 1}
	br := newBrowser(b)
	f := newFixture(b, cfg)
	total := len(cfg.Nodes())
	for b.Loop() {
		consoleFigures(b, br, f, total)
	}
}

// BenchmarkConsoleEvents10000 measures the events page with the masters' bound of events
// kept (10,000) on a simulated cluster of 1,000 nodes (1,000 workers: the map is not what
// it measures). Run it once: go test -run '^$' -bench ConsoleEvents -benchtime 1x ./console
func BenchmarkConsoleEvents10000(b *testing.B) {
	cfg := synth.Config{DCs: 4, RacksPerDC: 5, NodesPerRack: 50, Slots: 16, Memory: 64 << 30, CPU: 32000,
		Jobs: 10, Workers: 1000, Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: 1}
	br := newBrowser(b)
	f := newFixture(b, cfg)
	for b.Loop() {
		eventsFigures(b, br, f)
	}
}

// eventsFigures measures the events page with the masters' bound of events kept (10,000):
// the first render (all kept events read and drawn), the page's memory and DOM.
func eventsFigures(b *testing.B, br *browser, f *fixture) {
	const kept = 10000
	log := f.master.Scheduler().Events()
	have, _ := log.Query(api.EventFilter{}, 0)
	var nodes []string
	f.mu.Lock()
	for id := range f.nodes {
		nodes = append(nodes, id)
	}
	f.mu.Unlock()
	slices.Sort(nodes)
	kinds := []string{api.EventWorkerStarted, api.EventWorkerExited, api.EventWorkerRestarted, api.EventWorkerMoved, api.EventNodeThrottled, api.EventAPICall}
	start := time.Now().Add(-50 * time.Minute)
	// In bursts the masters take (a queue beyond the bound is dropped), each appended before
	// the next.
	for i := len(have); i < kept; {
		n := min(1000, kept-i)
		for k := range n {
			w := (i + k) % 97
			e := api.Event{Time: start.Add(time.Duration(i+k) * 300 * time.Millisecond), Kind: kinds[(i+k)%len(kinds)],
				Object: fmt.Sprintf("worker/job%02d/%d", w%100, w), Job: fmt.Sprintf("job%02d", w%100), Tenant: "t0", Worker: &w,
				Node: nodes[(i+k)%len(nodes)], Reason: fmt.Sprintf("crashed: exited with code %d (bench event %d of %d)", (i+k)%7, i+k, kept)}
			log.Emit(e)
		}
		i += n
		testenv.Eventually(b, fmt.Sprintf("%d events kept", i), time.Minute, func() bool {
			evs, _ := log.Query(api.EventFilter{}, 0)
			return len(evs) >= i
		})
	}
	// The same answer read from here, as `stormdock events` does.
	var gets []time.Duration
	for range 3 {
		start := time.Now()
		evs, err := f.cl.Events(context.Background(), api.EventFilter{}, 0)
		if err != nil || len(evs) < kept {
			b.Fatalf("GET /v1/events: %d events, %v", len(evs), err)
		}
		gets = append(gets, time.Since(start))
	}
	b.Logf("figure: GET /v1/events with %d events kept, read by a Go client: %v, %v, %v", kept, gets[0].Round(time.Millisecond), gets[1].Round(time.Millisecond), gets[2].Round(time.Millisecond))
	p := br.tab(b)
	p.do(chromedp.Navigate(f.master.URL() + "/ui/"))
	p.eval(fmt.Sprintf(`sessionStorage.setItem('stormdock.token', %q), true`, f.token), nil)
	var renders, alls []float64
	var walls []time.Duration
	for range 3 {
		p.do(chromedp.Navigate("about:blank"))
		start := time.Now()
		p.do(chromedp.Navigate(f.master.URL() + "/ui/#/events"))
		p.until("every kept event on the events page", 2*time.Minute, fmt.Sprintf(`+document.getElementById('events-view')?.dataset.count >= %d && document.querySelectorAll('#events-view .event').length > 0`, kept),
			`String(document.getElementById('events-view')?.dataset.count) + ' ' + document.getElementById('events-view')?.textContent.slice(0, 200)`)
		walls = append(walls, time.Since(start))
		var ms, all float64
		p.eval(`performance.getEntriesByName('stormdock:events-render')[0].startTime`, &ms)
		p.eval(`performance.getEntriesByName('stormdock:events-all')[0].startTime`, &all)
		renders = append(renders, ms)
		alls = append(alls, all)
	}
	var rows, draw, read, started float64
	p.eval(`document.querySelectorAll('#events-view .event').length`, &rows)
	p.eval(`window.stormdockEvents.stats.firstDrawMs`, &draw)
	p.eval(`window.stormdockEvents.stats.readMs`, &read)
	p.eval(`window.stormdockEvents.stats.firstRenderMs - window.stormdockEvents.stats.readMs - window.stormdockEvents.stats.firstDrawMs`, &started)
	m := jsMetrics(b, p)
	b.Logf("figure: first render of the events page with %d events kept, at %d nodes: the newest 1,000 drawn after %.0f ms, %.0f ms, %.0f ms, all %d after %.0f ms, %.0f ms, %.0f ms (the page's marks); %v, %v, %v (navigation to all the rows, seen from the test); of the last: the page asked for them %.0f ms after navigating, the first answer took %.0f ms, drawing it %.1f ms; %d rows in the DOM; JS heap %.1f MiB, %d DOM nodes",
		kept, len(nodes), renders[0], renders[1], renders[2], kept, alls[0], alls[1], alls[2], walls[0].Round(time.Millisecond), walls[1].Round(time.Millisecond), walls[2].Round(time.Millisecond),
		started, read, draw, int(rows), m["JSHeapUsedSize"]/(1<<20), int(m["Nodes"]))
	b.ReportMetric(median(alls), "ms-events-all")
	b.ReportMetric(median(renders), "ms-events-first-render")
}

func consoleFigures(b *testing.B, br *browser, f *fixture, total int) {
	// Browser memory: a tab of its own, on about:blank, then with the map drawn (after a
	// garbage collection): the page's JavaScript heap and DOM, and the proportional set size
	// of every chromium process.
	q := br.tab(b)
	q.do(chromedp.Navigate(f.master.URL() + "/ui/"))
	q.eval(fmt.Sprintf(`sessionStorage.setItem('stormdock.token', %q), true`, f.token), nil)
	q.do(chromedp.Navigate("about:blank"))
	settle := func(p *tab) {
		ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Action[cdp.Empty](func(ctx context.Context, t *chromedp.Target) (cdp.Empty, error) {
			return cdp.Call(ctx, t, heapprofiler.CollectGarbage, cdp.Empty{})
		})); err != nil {
			b.Fatal(err)
		}
		p.eval(`new Promise((r) => setTimeout(() => r(true), 1000))`, nil)
	}
	settle(q)
	idle := processTreePSS(br.pid())
	q.do(chromedp.Navigate(f.master.URL() + "/ui/#/map"))
	q.until("the whole map", 2*time.Minute, fmt.Sprintf(`document.querySelectorAll('#map .node').length === %d`, total), "")
	settle(q)
	pss := processTreePSS(br.pid())
	ctx, cancel := context.WithTimeout(q.ctx, time.Minute)
	res, err := chromedp.Run(ctx, chromedp.Action[performance.GetMetricsResult](func(ctx context.Context, t *chromedp.Target) (performance.GetMetricsResult, error) {
		if _, err := cdp.Call(ctx, t, performance.Enable, performance.EnableParams{}); err != nil {
			return performance.GetMetricsResult{}, err
		}
		return cdp.Call(ctx, t, performance.GetMetrics, cdp.Empty{})
	}))
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]float64{}
	for _, x := range res.Metrics {
		m[x.Name] = x.Value
	}
	b.Logf("figure: browser memory with the map drawn: JS heap %.1f MiB used of %.1f MiB, %d DOM nodes; chromium's processes %s PSS, against %s with the tab on about:blank: %.0f MiB more",
		m["JSHeapUsedSize"]/(1<<20), m["JSHeapTotalSize"]/(1<<20), int(m["Nodes"]), pssLine(pss), pssLine(idle), float64(pss[""]-idle[""])/(1<<20))
	b.ReportMetric(m["JSHeapUsedSize"]/(1<<20), "MiB-js-heap")
	b.ReportMetric(float64(pss[""]-idle[""])/(1<<20), "MiB-pss-over-blank")
	q.screenshot("console-map-1000.png")
	q.do(chromedp.Navigate("about:blank"))

	p := br.tab(b)
	// Time to first render: from navigation to the whole map drawn, as the page measures it
	// (its User Timing mark once the first snapshot is drawn) and as seen from here.
	p.do(chromedp.Navigate(f.master.URL() + "/ui/"))
	p.eval(fmt.Sprintf(`sessionStorage.setItem('stormdock.token', %q), true`, f.token), nil)
	var renders []float64
	var walls []time.Duration
	var snapWire float64
	for range 3 {
		p.do(chromedp.Navigate("about:blank"))
		sent := f.metric("stormdock_master_watch_sent_bytes_total")
		start := time.Now()
		p.do(chromedp.Navigate(f.master.URL() + "/ui/#/map"))
		p.until("the whole map", 2*time.Minute, fmt.Sprintf(`document.querySelectorAll('#map .node').length === %d`, total), `document.querySelectorAll('#map .node').length`)
		walls = append(walls, time.Since(start))
		snapWire = f.metric("stormdock_master_watch_sent_bytes_total") - sent
		var ms float64
		p.eval(`performance.getEntriesByName('stormdock:first-render')[0].startTime`, &ms)
		renders = append(renders, ms)
	}
	var first struct{ Events, Bytes, LastApplyMs float64 }
	p.eval(`window.stormdockStats`, &first)
	var cells int
	p.eval(`document.querySelectorAll('#map .cell').length`, &cells)
	b.Logf("figure: time to first render, %d nodes, %d cells: %.0f ms, %.0f ms, %.0f ms (the page's mark once the snapshot is drawn); %v, %v, %v (navigation to the whole map, seen from the test)",
		total, cells, renders[0], renders[1], renders[2], walls[0].Round(time.Millisecond), walls[1].Round(time.Millisecond), walls[2].Round(time.Millisecond))
	b.Logf("figure: snapshot %d bytes of JSON, %.0f bytes on the wire (gzip)", int(first.Bytes), snapWire)
	b.ReportMetric(median(renders), "ms-first-render")

	// A change on one node (its health withholds slots), written to the store by its
	// stand-in agent: the time until the page shows it, and the bytes of the update.
	var nodes []string
	f.mu.Lock()
	for id := range f.nodes {
		nodes = append(nodes, id)
	}
	f.mu.Unlock()
	slices.Sort(nodes)
	var lat []float64
	var before struct{ Events, Bytes, LastApplyMs float64 }
	p.eval(`window.stormdockStats`, &before)
	sent, events := f.metric("stormdock_master_watch_sent_bytes_total"), f.metric("stormdock_master_watch_events_total")
	const build = "stormdock_master_watch_build_duration_seconds"
	buildSum, builds := f.metric(build), f.metric(build+"_count")
	const changes = 20
	b.Logf("open watch streams: %.0f", f.metric("stormdock_master_watch_streams"))
	for i := range changes {
		id := nodes[i*len(nodes)/changes]
		withheld := 1 + i%3
		start := time.Now()
		f.update(id, func(r *cluster.NodeRecord) {
			r.Health = cluster.NodeHealth{State: cluster.HealthThrottled, Reason: fmt.Sprintf("memory %d%% used (bench)", 85+i%10), Throttled: withheld}
		})
		p.waitFor(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]')?.dataset.withheld === '%d'`, id, withheld))
		lat = append(lat, float64(time.Since(start).Microseconds())/1000)
	}
	var after struct{ Events, Bytes, LastApplyMs float64 }
	p.eval(`window.stormdockStats`, &after)
	wire := f.metric("stormdock_master_watch_sent_bytes_total") - sent
	n := f.metric("stormdock_master_watch_events_total") - events
	slices.Sort(lat)
	b.Logf("figure: a node's health change, written to the store, shown on the map after: median %.0f ms, p90 %.0f ms, max %.0f ms (%d changes)",
		lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1], changes)
	b.Logf("figure: bytes per update for one node's change: %.0f bytes of JSON, %.0f bytes on the wire (gzip), over %.0f events (%.0f bytes on the wire in all, keep-alives included)",
		(after.Bytes-before.Bytes)/max(after.Events-before.Events, 1), wire/max(n, 1), n, wire)
	nb := f.metric(build+"_count") - builds
	b.Logf("figure: the master built the map %.0f times for them, %.1f ms a build on average (one node decoded and drawn again)",
		nb, 1000*(f.metric(build)-buildSum)/max(nb, 1))
	b.ReportMetric(lat[len(lat)/2], "ms-change-median")
	b.ReportMetric(wire/max(n, 1), "B/update-wire")

	// Churn: every node rewrites its record once a second with new memory readings (an
	// agent writes at most once per heartbeat), a tenth of a node's memory up and down, so
	// that every write changes the map. Meanwhile: the master's build time, the stream's
	// bytes, and the time for a health change to show.
	churnCtx, stopChurn := context.WithCancel(context.Background())
	churnDone := make(chan struct{})
	var churned atomic.Int64
	go func() {
		defer close(churnDone)
		tick := time.NewTicker(time.Second / time.Duration(len(nodes)))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-churnCtx.Done():
				return
			case <-tick.C:
			}
			id := nodes[i%len(nodes)]
			up := (i/len(nodes))%2 == 0
			f.update(id, func(r *cluster.NodeRecord) {
				for k := range r.Workers {
					if up {
						r.Workers[k].Memory += r.Node.Memory / 10 / cluster.Bytes(max(len(r.Workers), 1))
					} else {
						r.Workers[k].Memory -= r.Node.Memory / 10 / cluster.Bytes(max(len(r.Workers), 1))
					}
				}
			})
			churned.Add(1)
		}
	}()
	testenv.Eventually(b, "the churn rewrote every node's record once", time.Minute, func() bool { return churned.Load() >= int64(len(nodes)) })
	const churnFor = 10 * time.Second
	buildSum, builds = f.metric(build), f.metric(build+"_count")
	sent, events = f.metric("stormdock_master_watch_sent_bytes_total"), f.metric("stormdock_master_watch_events_total")
	p.eval(`window.stormdockStats`, &before)
	churnStart := time.Now()
	lat = lat[:0]
	for i := 0; time.Since(churnStart) < churnFor; i++ {
		id := nodes[(i*37+11)%len(nodes)]
		withheld := 4 + i%3
		start := time.Now()
		f.update(id, func(r *cluster.NodeRecord) {
			r.Health = cluster.NodeHealth{State: cluster.HealthThrottled, Reason: "memory (churn)", Throttled: withheld}
		})
		p.waitFor(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]')?.dataset.withheld === '%d'`, id, withheld))
		lat = append(lat, float64(time.Since(start).Microseconds())/1000)
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(churnStart)
	stopChurn()
	<-churnDone
	p.eval(`window.stormdockStats`, &after)
	nb = f.metric(build+"_count") - builds
	took := f.metric(build) - buildSum
	wire = f.metric("stormdock_master_watch_sent_bytes_total") - sent
	n = f.metric("stormdock_master_watch_events_total") - events
	slices.Sort(lat)
	b.Logf("figure: churn, every node's record rewritten once a second (1,000 writes/s), for %v: the master built the map %.0f times, %.1f ms a build, %.0f%% of a core; the stream sent %.0f events, %.0f kB/s on the wire (%.0f kB/s of JSON); the page's last draw took %.1f ms",
		elapsed.Round(time.Second), nb, 1000*took/max(nb, 1), 100*took/elapsed.Seconds(), n, wire/1000/elapsed.Seconds(), (after.Bytes-before.Bytes)/1000/elapsed.Seconds(), after.LastApplyMs)
	b.Logf("figure: during the churn a node's health change showed after: median %.0f ms, p90 %.0f ms, max %.0f ms (%d changes)",
		lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1], len(lat))

	// The churn spent the master's map-building budget (package master: a fifth of a core,
	// watchBuildShare, up to watchBuildBurst, 500 ms: 2.5 s to refill): the scale-out's
	// figure is of a master with a full one. The refill is time itself, not an event.
	time.Sleep(3 * time.Second)

	// A scale-out through the API: the leader places the new workers and the map shows
	// their cells.
	jobs, err := f.cl.Jobs(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	j := jobs[0]
	buildSum, builds = f.metric(build), f.metric(build+"_count")
	start := time.Now()
	if _, err := f.cl.ScaleJob(context.Background(), j.Name, j.Workers+10); err != nil {
		b.Fatal(err)
	}
	p.waitFor(fmt.Sprintf(`document.querySelectorAll('#map .cell[data-j=%q]').length === %d`, j.Name, j.Workers+10))
	shown := time.Now()
	f.mu.Lock()
	assigned := f.assigned
	f.mu.Unlock()
	nb = f.metric(build+"_count") - builds
	b.Logf("figure: during the scale-out the master built the map %.0f times, %.1f ms a build on average", nb, 1000*(f.metric(build)-buildSum)/max(nb, 1))
	b.Logf("figure: scale-out of %s from %d to %d workers through the API, new cells on the map after %v: the leader's assignments reached the nodes after %v, the map showed them %v later",
		j.Name, j.Workers, j.Workers+10, shown.Sub(start).Round(time.Millisecond), assigned.Sub(start).Round(time.Millisecond), shown.Sub(assigned).Round(time.Millisecond))
}

// waitFor waits until a JavaScript condition holds, checking on every change of the page.
func (p *tab) waitFor(cond string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, testenv.Timeout(time.Minute))
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](cond, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(testenv.Timeout(time.Minute)))); err != nil {
		p.t.Fatalf("waiting for %s: %v", cond, err)
	}
}

// processTreePSS sums the proportional set size of a process and its descendants, by
// chromium process type (--type=renderer, gpu-process, ...; "browser" for the main one).
func processTreePSS(root int) map[string]int64 {
	children := map[int][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		pid, _ := strconv.Atoi(strings.Fields(s)[0])
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := map[string]int64{}
	var walk func(int)
	walk = func(pid int) {
		kind := "browser"
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			// Chromium rewrites its children's command lines as one space-separated string.
			for _, arg := range strings.FieldsFunc(string(cmd), func(r rune) bool { return r == 0 || r == ' ' }) {
				if t, ok := strings.CutPrefix(arg, "--type="); ok {
					kind = t
				}
			}
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
			sc := bufio.NewScanner(strings.NewReader(string(b)))
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "Pss:" {
					kb, _ := strconv.ParseInt(f[1], 10, 64)
					out[kind] += kb << 10
					out[""] += kb << 10
				}
			}
		}
		for _, c := range children[pid] {
			walk(c)
		}
	}
	walk(root)
	return out
}

// pssLine writes the PSS of each process type in MiB.
func pssLine(pss map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(pss)) {
		if k != "" {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, float64(pss[k])/(1<<20)))
		}
	}
	return fmt.Sprintf("%.0f MiB (%s)", float64(pss[""])/(1<<20), strings.Join(parts, ", "))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// must is a store key of a name the fixture made valid.
func must(key string, err error) string {
	if err != nil {
		panic(err)
	}
	return key
}
