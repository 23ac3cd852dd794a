package console_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/heapprofiler"
	"github.com/chromedp/cdproto/performance"
	"github.com/chromedp/chromedp"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkConsoleLive measures the console's live views on a local cluster (real agents
// and worker processes, headless chromium): an event caused in the cluster (a worker
// SIGKILLed by the benchmark) until its row is drawn on the events page; a line a worker
// writes (with its time in it) until the log view draws it; and the log view's memory
// after 100,000 lines streamed through it.
//
//	go test -run '^$' -bench ConsoleLive -benchtime 1x ./console
func BenchmarkConsoleLive(b *testing.B) {
	br := newBrowser(b)
	lc := startLocal(b, daemon.LocalConfig{Nodes: 6, Slots: 8})
	ctx := context.Background()
	if err := lc.Client.CreateTenant(ctx, cluster.Tenant{Name: "demo"}); err != nil {
		b.Fatal(err)
	}
	lc.Submit("name: victim\ntenant: demo\nworkers: 20\nresources: {memory: 16Mi, cpu: 0.01}\ncommand: [sleep, '100000']\ngracePeriod: 1s\n")
	lc.Submit(tickerSpec)
	lc.Submit("name: flood\ntenant: demo\nworkers: 1\nresources: {memory: 32Mi, cpu: 0.05}\n" +
		"command: [sh, -c, 'seq -f \"line %06g of the flood, with some words after it to make a log line of a usual length\" 1 100000; exec sleep 100000']\ngracePeriod: 1s\n")
	lc.WaitRunning("victim", 20)
	lc.WaitRunning("ticker", 2)
	lc.WaitRunning("flood", 1)
	for b.Loop() {
		liveFigures(b, br, lc)
	}
}

func liveFigures(b *testing.B, br *browser, lc *clustertest.Local) {
	ctx := context.Background()
	p := br.tab(b)
	p.login(lc.API(), lc.Token)
	p.until("the map", time.Minute, `document.body.dataset.version`, "")

	// Events: a worker of victim SIGKILLed every 300 ms, 40 times (each of the 20 twice, so
	// that none crash-loops), until the page draws its worker.exited.
	p.open("#/events?kind=worker.exited")
	p.until("the events page live", time.Minute, `window.stormdockEvents && window.stormdockEvents.live`, "")
	// The same stream followed from here, as `stormdock events -f` does: what of the time is
	// the cluster's and the master's, and what the page's.
	fctx, stopFollow := context.WithCancel(ctx)
	var mu sync.Mutex
	arrived := map[int64]time.Time{}
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		_ = lc.Client.FollowEvents(fctx, api.EventFilter{Kinds: []string{api.EventWorkerExited}}, func(e api.Event) error {
			mu.Lock()
			arrived[e.ID] = time.Now()
			mu.Unlock()
			return nil
		})
	}()
	defer func() {
		stopFollow()
		<-followed
	}()
	type kill struct {
		worker int
		at     time.Time
	}
	var kills []kill
	for round := range 2 {
		for w := range 20 {
			st, err := lc.Client.Job(ctx, "victim")
			if err != nil {
				b.Fatal(err)
			}
			wv := st.Workers[w]
			if wv.PID == 0 || wv.State != cluster.WorkerRunning {
				testenv.Eventually(b, fmt.Sprintf("victim/%d running again", w), time.Minute, func() bool {
					st, err = lc.Client.Job(ctx, "victim")
					return err == nil && st.Workers[w].PID != 0 && st.Workers[w].State == cluster.WorkerRunning
				})
				wv = st.Workers[w]
			}
			at := time.Now()
			if err := syscall.Kill(wv.PID, syscall.SIGKILL); err != nil {
				b.Fatalf("kill victim/%d (pid %d): %v", w, wv.PID, err)
			}
			kills = append(kills, kill{w, at})
			time.Sleep(300 * time.Millisecond)
		}
		b.Logf("round %d of kills done", round+1)
	}
	var eventMs, streamMs []float64
	for _, k := range kills {
		var shown struct{ ID, At float64 }
		testenv.EventuallyWith(b, fmt.Sprintf("victim/%d's exit on the page", k.worker), time.Minute, func() (bool, string) {
			p.eval(fmt.Sprintf(`(() => { const e = window.stormdockEvents.evs.find((e) => e.job === 'victim' && e.worker === %d && Date.parse(e.time) >= %d);
				return e ? {id: e.id, at: window.stormdockEvents.stats.shown.get(e.id) || 0} : {id: 0, at: 0}; })()`, k.worker, k.at.Add(-50*time.Millisecond).UnixMilli()), &shown)
			return shown.At > 0, ""
		})
		eventMs = append(eventMs, shown.At-float64(k.at.UnixNano())/1e6)
		mu.Lock()
		if at, ok := arrived[int64(shown.ID)]; ok {
			streamMs = append(streamMs, float64(at.Sub(k.at).Microseconds())/1000)
		}
		mu.Unlock()
	}
	b.Logf("figure: a worker SIGKILLed -> its worker.exited drawn on the events page, %d kills: p50 %.0f ms, p99 %.0f ms, max %.0f ms; the same event read from the stream by a Go client (as `events -f`): p50 %.0f ms, p99 %.0f ms (%d)",
		len(eventMs), percentile(eventMs, 0.5), percentile(eventMs, 0.99), percentile(eventMs, 1), percentile(streamMs, 0.5), percentile(streamMs, 0.99), len(streamMs))
	b.ReportMetric(percentile(eventMs, 0.5), "ms-event-p50")
	b.ReportMetric(percentile(eventMs, 0.99), "ms-event-p99")

	// Log lines: ticker's worker 0 writes a tick with its time ten times a second; the page
	// notes when it draws each line.
	p.open("#/job/ticker/logs?source=0&tail=0")
	p.eval(`window.stormdockLogTimes = []; window.stormdockLogProbe = (lines, at) => { for (const l of lines) { const m = /^tick \d+ (\d+)$/.exec(l); if (m) window.stormdockLogTimes.push(at - Number(BigInt(m[1]) / 1000n) / 1000); } }; true`, nil)
	p.until("200 ticks drawn", 2*time.Minute, `window.stormdockLogTimes.length >= 200`, `window.stormdockLogTimes.length`)
	var lineMs []float64
	p.eval(`window.stormdockLogTimes.slice(-200)`, &lineMs)
	b.Logf("figure: a line written by a worker -> drawn in the log view (following, through master and agent), %d lines: p50 %.0f ms, p99 %.0f ms, max %.0f ms",
		len(lineMs), percentile(lineMs, 0.5), percentile(lineMs, 0.99), percentile(lineMs, 1))
	b.ReportMetric(percentile(lineMs, 0.5), "ms-line-p50")
	b.ReportMetric(percentile(lineMs, 0.99), "ms-line-p99")

	// Memory: the log view before and after 100,000 lines streamed through it.
	q := br.tab(b)
	q.login(lc.API(), lc.Token)
	q.until("the map", time.Minute, `document.body.dataset.version`, "")
	q.open("#/job/flood/overview")
	q.until("the job page", time.Minute, `document.querySelector('#view-job .job-head h2')`, "")
	before := jsMetrics(b, q)
	q.open("#/job/flood/logs?source=0&tail=-1")
	q.until("100,000 lines streamed through the view", 5*time.Minute,
		`+document.getElementById('job-logs').dataset.lines + +document.getElementById('job-logs').dataset.dropped >= 100000`,
		`document.getElementById('job-logs').dataset.lines + ' + ' + document.getElementById('job-logs').dataset.dropped`)
	after := jsMetrics(b, q)
	var held, rows int
	q.eval(`+document.getElementById('job-logs').dataset.lines`, &held)
	q.eval(`document.querySelectorAll('#job-logs .line').length`, &rows)
	b.Logf("figure: the log view after 100,000 lines streamed through it: %d lines held, %d drawn; JS heap %.1f MiB (%.1f MiB before, on the job's overview), %d DOM nodes (%d before)",
		held, rows, after["JSHeapUsedSize"]/(1<<20), before["JSHeapUsedSize"]/(1<<20), int(after["Nodes"]), int(before["Nodes"]))
	b.ReportMetric(after["JSHeapUsedSize"]/(1<<20), "MiB-js-heap-100k-lines")
}

// jsMetrics collects garbage in the tab, then reads its JavaScript heap and DOM sizes.
func jsMetrics(b *testing.B, p *tab) map[string]float64 {
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	res, err := chromedp.Run(ctx, chromedp.Action[performance.GetMetricsResult](func(ctx context.Context, t *chromedp.Target) (performance.GetMetricsResult, error) {
		if _, err := cdp.Call(ctx, t, heapprofiler.CollectGarbage, cdp.Empty{}); err != nil {
			return performance.GetMetricsResult{}, err
		}
		if _, err := cdp.Call(ctx, t, performance.Enable, performance.EnableParams{}); err != nil {
			return performance.GetMetricsResult{}, err
		}
		return cdp.Call(ctx, t, performance.GetMetrics, cdp.Empty{})
	}))
	if err != nil {
		b.Fatal(err)
	}
	m := map[string]float64{}
	for _, x := range res.Metrics {
		m[x.Name] = x.Value
	}
	return m
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
