package console_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/jobmetrics"
)

// TestConsoleCharts: a job's page draws its metrics (throughput, cpu, memory, the job's own
// series, the worker count) as charts, by the console itself, under the page's
// Content-Security-Policy (no violation is reported), and marks the scaling decisions on
// the worker count's chart; a tenant's page for another tenant's job shows none of them.
func TestConsoleCharts(t *testing.T) {
	b := newBrowser(t)
	lc := startLocal(t, daemon.LocalConfig{Nodes: 3, RacksPerDC: 1, Metrics: jobmetrics.Config{Interval: time.Second}})
	ctx := context.Background()
	for _, tn := range []string{"demo", "ads"} {
		if err := lc.Client.CreateTenant(ctx, cluster.Tenant{Name: tn, MaxWorkers: 10}); err != nil {
			t.Fatal(err)
		}
	}
	// 2,000 lines at 5 a second: a backlog at once, which the policy answers with workers.
	lc.Submit(fmt.Sprintf(`name: wordcount
tenant: demo
workers: 1
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, "5"]
gracePeriod: 2s
scaling: {min: 1, max: 3, metric: input_backlog, target: 100, cooldownUp: 1s}
`, inputFile(t)))
	testenv.EventuallyWith(t, "an autoscaling decision", 90*time.Second, func() (bool, string) {
		evs, err := lc.Client.Events(ctx, api.EventFilter{Job: "wordcount"}, 100)
		if err != nil {
			return false, err.Error()
		}
		var kinds []string
		for _, e := range evs {
			if e.Kind == api.EventJobAutoscaled {
				return true, ""
			}
			kinds = append(kinds, e.Kind)
		}
		return false, strings.Join(kinds, ", ")
	})

	admin := b.tab(t)
	admin.login(lc.API(), lc.Token)
	admin.until("the map", 20*time.Second, `document.querySelectorAll('#map .node').length === 3`, "")
	admin.eval(`window.cspViolations = [], document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI)), true`, nil)
	admin.open("#/job/wordcount")
	want := []string{"throughput", "cpu", "memory", "input_backlog", "lines_processed_total", "workers"}
	admin.until("the job's charts, each with points", 60*time.Second, fmt.Sprintf(
		`(() => { const got = [...document.querySelectorAll('#view-job figure.chart-box')].filter((f) => +f.dataset.points > 1 && f.querySelector('svg path.line')).map((f) => f.dataset.series);
			return %s.every((s) => got.includes(s)); })()`, jsList(want)),
		`[...document.querySelectorAll('#view-job figure.chart-box')].map((f) => f.dataset.series + ':' + f.dataset.points).join(' ') || document.querySelector('#view-job .charts')?.textContent`)
	admin.until("the decision marked on the worker count", 30*time.Second,
		`[...document.querySelectorAll('#view-job figure[data-series="workers"] .mark.auto')].some((m) => m.dataset.decision.includes('input_backlog'))`,
		`document.querySelector('#view-job figure[data-series="workers"]')?.outerHTML.length`)
	// The page's own redraws (every second, from the stream) keep the charts.
	admin.eval(`document.querySelector('#view-job .charts').dataset.kept = 'yes', true`, nil)
	admin.until("the charts kept across redraws", 10*time.Second,
		`document.querySelectorAll('#view-job tr[data-worker]').length > 0 && document.querySelector('#view-job .charts')?.dataset.kept === 'yes'`, "")
	var violations []string
	admin.eval(`window.cspViolations`, &violations)
	if len(violations) > 0 {
		t.Errorf("Content-Security-Policy violations: %v", violations)
	}
	// A few more points for the picture.
	admin.until("ten points on the worker count", 60*time.Second, `+document.querySelector('#view-job figure[data-series="workers"]').dataset.points >= 10`, "")
	admin.screenshot("console-charts.png")

	// A tenant sees its own jobs' charts, never another tenant's.
	tok, err := lc.Client.TenantToken(ctx, "ads")
	if err != nil {
		t.Fatal(err)
	}
	ads := b.tab(t)
	ads.login(lc.API(), tok)
	ads.until("the tenant's console", 20*time.Second, `document.getElementById('viewer').textContent.includes('ads')`, "")
	ads.open("#/job/wordcount")
	ads.until("no such job for the tenant", 10*time.Second, `document.getElementById('view-job').textContent.includes('No such job')`, "")
	if n := ads.num(`document.querySelectorAll('figure.chart-box').length`); n != 0 {
		t.Errorf("tenant ads sees %d charts of demo's job", n)
	}
	var series []string
	ads.eval(`fetch('/v1/jobs/wordcount/metrics', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('stormdock.token')}}).then((r) => [String(r.status)])`, &series)
	if !slices.Equal(series, []string{"403"}) {
		t.Errorf("tenant ads reading demo's metrics from the page: %v, want 403", series)
	}
}

func jsList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return "[" + strings.Join(q, ",") + "]"
}
