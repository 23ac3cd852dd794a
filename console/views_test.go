package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

// tickerSpec is a job whose workers print a marker line, then a numbered tick with the
// time (ns since the epoch) ten times a second: what the log view is tested and measured
// with.
const tickerSpec = `name: ticker
tenant: demo
workers: 2
resources: {memory: 32Mi, cpu: 0.05}
command: [sh, -c, 'echo "marker $STORMDOCK_JOB/$STORMDOCK_WORKER"; i=0; while :; do i=$((i+1)); echo "tick $i $(date +%s%N)"; sleep 0.1; done']
env: {MODE: slow}
placement: {spread: [dc]}
gracePeriod: 1s
`

// storeRecords reads a job's record and history from the cluster's store, as bytes with
// their versions: what "changes nothing" is judged by.
func storeRecords(t *testing.T, s coord.KV, job string) string {
	t.Helper()
	var out []string
	for _, key := range []func(string) (string, error){cluster.JobKey, cluster.JobHistoryKey} {
		k, err := key(job)
		if err != nil {
			t.Fatal(err)
		}
		e, err := s.Get(context.Background(), k)
		if err != nil {
			t.Fatalf("read %s: %v", k, err)
		}
		out = append(out, fmt.Sprintf("%s v%d %s", k, e.Version, e.Value))
	}
	return strings.Join(out, "\n")
}

// consoleViews drives the views of events, logs, rollouts and why in the cluster of
// TestConsole (its jobs wordcount, mirror and clicks, and ticker), as the admin in tab admin
// and as tenant ads in tab ads: a node killed shows as node.lost on the events page and the node's
// page; a worker's marker line shows in its log view (found by search), new lines follow,
// and the download holds it; a router's log shows; a spec with errors shows them with
// field and line and changes nothing in the store; a canary update made in the editor waits
// for promotion, Promote finishes it and the history shows its diff; a rollback to a chosen
// generation; an unplaced worker's explanation and a node's avoidance, ended from the page;
// and tenant ads sees neither the other tenants' events nor their logs.
func consoleViews(t *testing.T, lc *clustertest.Local, admin, ads *tab) {
	ctx := context.Background()
	store, err := coord.Open(ctx, lc.StoreURL(), coord.Options{Logger: testenv.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	t.Run("logs", func(t *testing.T) {
		admin := admin.in(t)
		admin.open("#/job/ticker/logs?source=0&tail=-1")
		admin.until("ticks in worker 0's log view", 30*time.Second,
			`[...document.querySelectorAll('#job-logs .line')].some((l) => l.textContent.startsWith('tick '))`,
			`document.querySelector('#job-logs').textContent.slice(0, 300)`)
		admin.do(chromedp.SendKeys(chromedp.CSS(`#job-logs input[type="search"]`), "marker ticker/"))
		admin.until("the marker line found by search and shown", 10*time.Second,
			`[...document.querySelectorAll('#job-logs .line.current mark')].some((m) => m.textContent === 'marker ticker/') &&
			 document.querySelector('#job-logs .line.current').textContent === 'marker ticker/0'`,
			`[...document.querySelectorAll('#job-logs .toolbar [role=status]')].map((s) => s.textContent).join(' | ')`)
		if got := admin.str(`[...document.querySelectorAll('#job-logs .toolbar [role=status]')][0].textContent`); got != "1 of 1 in the lines loaded" {
			t.Errorf("search says %q", got)
		}
		admin.screenshot("console-logs.png")
		// End (from the keyboard) goes back to the end, which then follows what comes: the
		// last line drawn is a newer one, and more lines are held.
		admin.eval(`document.querySelector('#job-logs .log').focus(), true`, nil)
		admin.do(chromedp.KeyEvent(kb.End))
		last := `(() => { const ls = document.querySelectorAll('#job-logs .line'); return ls.length ? ls[ls.length - 1].textContent : ''; })()`
		held := admin.num(`+document.getElementById('job-logs').dataset.lines`)
		lastLine := admin.str(last)
		admin.until("new lines follow at the end", 30*time.Second,
			fmt.Sprintf(`+document.getElementById('job-logs').dataset.lines >= %d + 3 && %s !== %q && /^(tick|marker) /.test(%s)`, held, last, lastLine, last), last)
		if node := admin.str(`document.getElementById('job-logs').dataset.node`); node == "" || !slicesContain(workerNodes(t, lc, "ticker"), node) {
			t.Errorf("the log view says it reads node %q; ticker runs on %v", node, workerNodes(t, lc, "ticker"))
		}

		// Download: the whole log kept on the node, as a file.
		dir := t.TempDir()
		downloads(t, admin, dir)
		admin.clickText("#job-logs", "Download")
		var saved []byte
		testenv.EventuallyWith(t, "the downloaded log", 20*time.Second, func() (bool, string) {
			saved, _ = os.ReadFile(filepath.Join(dir, "ticker-0.log"))
			ents, _ := os.ReadDir(dir)
			return strings.HasPrefix(string(saved), "marker ticker/0\n") && strings.Contains(string(saved), "\ntick 1 "), fmt.Sprint(ents)
		})

		// A mirrored job's output router's log, and a link worker's.
		admin.open("#/job/mirror/logs?source=router/0")
		admin.until("the router's log", 30*time.Second, `+document.getElementById('job-logs').dataset.lines > 0 && document.getElementById('job-logs').dataset.node`,
			`document.querySelector('#job-logs').textContent.slice(0, 300)`)
		admin.open("#/job/mirror/logs?source=dc-b/1")
		admin.until("link dc-b's worker 1's log", 30*time.Second, `+document.getElementById('job-logs').dataset.lines > 0 && document.querySelector('#job-logs select').value === 'dc-b/1'`,
			`document.querySelector('#job-logs').textContent.slice(0, 300)`)
	})

	t.Run("rollouts", func(t *testing.T) {
		admin := admin.in(t)
		admin.open("#/job/ticker/spec")
		admin.until("the spec in the editor", 20*time.Second, `document.getElementById('job-spec').dataset.loaded === 'true'`,
			`document.getElementById('job-spec').textContent.slice(0, 300)`)
		spec := admin.str(`document.querySelector('#job-spec textarea').value`)
		if parsed, err := cluster.ParseJobSpec([]byte(spec)); err != nil || parsed.Env["MODE"] != "slow" {
			t.Fatalf("the editor holds %v, %v:\n%s", parsed, err, spec)
		}
		setSpec := func(text string) {
			admin.eval(fmt.Sprintf(`(() => { const t = document.querySelector('#job-spec textarea'); t.value = %q; t.dispatchEvent(new Event('input')); return true; })()`, text), nil)
		}

		// A spec with errors: each shown with its field and line, nothing stored.
		before := storeRecords(t, store, "ticker")
		bad := strings.Replace(spec, "workers: 2", "workers: many", 1) + "colour: red\n"
		lines := strings.Split(bad, "\n")
		setSpec(bad)
		for _, button := range []string{"Check", "Update…"} {
			admin.clickText("#job-spec", button)
			admin.until("the spec's problems", 20*time.Second, `document.querySelectorAll('#job-spec .problems li').length === 2 && document.getElementById('job-spec').dataset.state === 'refused'`,
				`document.querySelector('#job-spec .spec-result').textContent`)
			var problems []struct{ Field, Line, Text string }
			admin.eval(`[...document.querySelectorAll('#job-spec .problems li')].map((l) => ({field: l.dataset.field, line: l.dataset.line, text: l.textContent}))`, &problems)
			want := map[string]string{"workers": "workers: many", "colour": "colour: red"}
			for _, p := range problems {
				n, _ := strconv.Atoi(p.Line)
				if n < 1 || n > len(lines) || lines[n-1] != want[p.Field] {
					t.Errorf("problem %+v points at line %d, which is %q", p, n, lines[min(max(n, 1), len(lines))-1])
				}
			}
			if admin.num(`document.getElementById('confirm').open ? 1 : 0`) != 0 {
				t.Errorf("%s on a spec with errors asked to confirm an update", button)
			}
		}
		admin.screenshot("console-spec-error.png")
		// The problem's line is one click away.
		admin.clickText("#job-spec .problems", "line "+lineOf(bad, "colour: red"))
		if sel := admin.str(`(() => { const t = document.querySelector('#job-spec textarea'); return t.value.slice(t.selectionStart, t.selectionEnd); })()`); sel != "colour: red" {
			t.Errorf("going to the problem's line selects %q", sel)
		}
		if after := storeRecords(t, store, "ticker"); after != before {
			t.Fatalf("a spec with errors changed the store:\nbefore %s\nafter  %s", before, after)
		}

		// A canary update from the editor: it waits for promotion; Promote finishes it.
		good := strings.Replace(spec, "MODE: slow", "MODE: fast", 1) + "update:\n  canary: 1\n  minHealthy: 1s\n"
		setSpec(good)
		admin.clickText("#job-spec", "Check")
		admin.until("the dry run's changes", 20*time.Second, `document.getElementById('job-spec').dataset.state === 'checked'`, `document.querySelector('#job-spec .spec-result').textContent`)
		var fields []string
		admin.eval(`[...document.querySelectorAll('#job-spec .diff li')].map((l) => l.dataset.field)`, &fields)
		if strings.Join(fields, " ") != "env.MODE update.canary update.minHealthy" {
			t.Errorf("the dry run lists changes of %v", fields)
		}
		if after := storeRecords(t, store, "ticker"); after != before {
			t.Fatalf("the dry run changed the store:\nbefore %s\nafter  %s", before, after)
		}
		admin.clickText("#job-spec", "Update…")
		admin.confirm(nil)
		admin.until("the canary waiting for promotion", 60*time.Second, `document.querySelector('#view-job section.rollout')?.dataset.state === 'awaiting-promotion'`,
			`document.querySelector('#view-job .job-head').textContent`)
		admin.screenshot("console-rollout.png")
		// Paused from the page, the store says so; resumed, it waits for promotion again.
		admin.clickText("#view-job section.rollout", "Pause")
		admin.confirm(nil)
		admin.until("the rollout paused", 60*time.Second, `document.querySelector('#view-job section.rollout')?.dataset.state === 'paused'`,
			`document.querySelector('#view-job .job-head').textContent`)
		if st, err := lc.Client.Job(ctx, "ticker"); err != nil || st.Job.Rollout == nil || st.Job.Rollout.State != cluster.RolloutPaused {
			t.Fatalf("after Pause the API says rollout %+v, %v", st.Job.Rollout, err)
		}
		admin.clickText("#view-job section.rollout", "Resume")
		admin.confirm(nil)
		admin.until("the canary waiting for promotion again", 60*time.Second, `document.querySelector('#view-job section.rollout')?.dataset.state === 'awaiting-promotion'`,
			`document.querySelector('#view-job .job-head').textContent`)
		admin.clickText("#view-job section.rollout", "Promote")
		admin.confirm(nil)
		admin.until("the rollout done", 60*time.Second, `document.querySelector('#view-job section.rollout')?.dataset.state === 'done'`,
			`document.querySelector('#view-job .job-head').textContent`)
		st, err := lc.Client.Job(ctx, "ticker")
		if err != nil || st.Job.Generation != 2 || st.Job.Rollout == nil || st.Job.Rollout.State != cluster.RolloutDone {
			t.Fatalf("after Promote the API says generation %d, rollout %+v, %v", st.Job.Generation, st.Job.Rollout, err)
		}
		for _, w := range st.Workers {
			if w.Generation != 2 {
				t.Errorf("worker %d runs generation %d after the rollout", w.Worker, w.Generation)
			}
		}
		admin.open("#/job/ticker/history")
		admin.until("generation 2's diff in the history", 20*time.Second,
			`(() => { const li = document.querySelector('#job-history tr[data-generation="2"] li[data-field="env.MODE"]'); return li && li.querySelector('del').textContent === 'slow' && li.querySelector('ins').textContent === 'fast'; })()`,
			`document.getElementById('job-history').textContent`)
		admin.screenshot("console-history.png")

		// The run before the rollout's restart is the previous run's log.
		admin.open("#/job/ticker/logs?source=0")
		admin.clickText("#job-logs", "Previous run")
		admin.until("the previous run's log, ended", 30*time.Second, `/end of the log/.test(document.querySelector('#job-logs').textContent) && +document.getElementById('job-logs').dataset.lines > 0`,
			`document.querySelector('#job-logs').textContent.slice(0, 300)`)

		// A restart by data center, one at a time, from the job's head.
		admin.clickText("#view-job .job-head", "Restart…")
		admin.until("the restart dialog", 10*time.Second, `document.querySelector('#confirm-fields select[name="by"]')`, "")
		admin.eval(`document.querySelector('#confirm-fields select[name="by"]').value = 'dc', true`, nil)
		admin.confirm(map[string]string{"maxParallel": "1"})
		admin.until("the restart done", 60*time.Second,
			`(() => { const r = document.querySelector('#view-job section.rollout'); return r && r.dataset.state === 'done' && /restart of generation 2/.test(r.textContent) && /by dc, 1 at a time/.test(r.textContent); })()`,
			`document.querySelector('#view-job .job-head').textContent`)

		// Back to generation 1, chosen in the dialog.
		admin.open("#/job/ticker/history")
		admin.clickText(`#job-history tr[data-generation="1"]`, "Roll back to this…")
		admin.until("the dialog offers generation 1", 10*time.Second, `document.querySelector('#confirm-fields select[name="to"]')?.value === '1'`, "")
		admin.confirm(nil)
		admin.until("generation 3 with generation 1's spec", 60*time.Second,
			`(() => { const li = document.querySelector('#job-history tr[data-generation="3"] li[data-field="env.MODE"]'); return li && li.querySelector('ins').textContent === 'slow'; })()`,
			`document.getElementById('job-history').textContent`)
		if rec, err := lc.Client.Job(ctx, "ticker"); err != nil || rec.Job.Spec.Env["MODE"] != "slow" || rec.Job.Rollout.Kind != cluster.RolloutRollback {
			t.Errorf("after the rollback the API says %+v, %v", rec.Job, err)
		}
	})

	t.Run("why", func(t *testing.T) {
		admin := admin.in(t)
		lc.Submit("name: picky\ntenant: demo\nworkers: 1\nresources: {memory: 16Mi, cpu: 0.05}\ncommand: [sleep, '600']\nplacement: {dcs: [dc-a, dc-b], nodeLabels: {disk: ssd}}\n")
		// A node that avoids picky (as the leader notes it after a crash loop there).
		node := lc.Nodes()[0]
		now := time.Now().UTC().Truncate(time.Millisecond)
		if err := desired.UpdateNodeConf(ctx, store, node, func(c *cluster.NodeConf) {
			c.Avoid = append(c.Avoid, "picky")
			c.Avoided = append(c.Avoided, cluster.Avoidance{Job: "picky", Since: now, Until: now.Add(20 * time.Minute), Strikes: 2})
		}); err != nil {
			t.Fatal(err)
		}
		admin.open("#/job/picky/why")
		// 12 nodes, 4 in each data center: dc-c's fail the dc check first, every one the label.
		admin.until("the placement engine's explanation", 30*time.Second,
			`(() => { const cells = (c) => [...(document.querySelector('#job-why tr[data-check="' + c + '"]')?.cells || [])].slice(1, 3).map((x) => x.textContent).join('/');
				return cells('label') === '8/12' && cells('dc') === '4/4'; })()`,
			`document.getElementById('job-why').textContent`)
		admin.until("the avoiding node, since and until when", 30*time.Second, fmt.Sprintf(
			`(() => { const r = document.querySelector('#job-why table.avoided tr[data-node=%q]');
				return r && r.cells[3].textContent === '2' && /in (19|20) min/.test(r.cells[2].textContent) && /ago/.test(r.cells[1].textContent); })()`, node),
			`document.getElementById('job-why').textContent`)
		admin.screenshot("console-why.png")
		admin.clickText(fmt.Sprintf(`#job-why tr[data-node=%q]`, node), "End it now…")
		admin.confirm(nil)
		admin.until("the avoidance gone", 30*time.Second, `!document.querySelector('#job-why table.avoided')`, `document.getElementById('job-why').textContent`)
		if st, err := lc.Client.Job(ctx, "picky"); err != nil || len(st.Avoided) != 0 {
			t.Errorf("after ending it the API says avoided %+v, %v", st.Avoided, err)
		}
	})

	t.Run("tenant", func(t *testing.T) {
		ads := ads.in(t)
		ads.open("#/events")
		ads.until("tenant ads's events", 20*time.Second, `+document.getElementById('events-view').dataset.count > 0`, `document.getElementById('events-view').textContent.slice(0, 200)`)
		var tenants []string
		ads.eval(`[...new Set(window.stormdockEvents.evs.map((e) => e.tenant || '-'))]`, &tenants)
		if strings.Join(tenants, ",") != "ads" {
			t.Errorf("tenant ads's events page holds events of tenants %v", tenants)
		}
		page := ads.str(`document.documentElement.outerHTML`)
		for _, other := range []string{"ticker", "wordcount", "mirror", "picky", "demo"} {
			if regexp.MustCompile(`\b` + other + `\b`).MatchString(page) {
				t.Errorf("tenant ads sees %q on its events page", other)
			}
		}
		// Another tenant's log: refused by the API, and no page for it.
		var status int
		ads.eval(`fetch('/v1/jobs/ticker/logs?worker=0', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('stormdock.token')}}).then((r) => r.status)`, &status)
		if status != 403 && status != 404 {
			t.Errorf("tenant ads reading ticker's log: %d", status)
		}
		ads.open("#/job/ticker/logs")
		ads.until("no page for another tenant's job", 10*time.Second, `/No such job/.test(document.getElementById('view-job').textContent)`, "")
		if n := ads.num(`document.querySelectorAll('#job-logs .line').length`); n != 0 {
			t.Errorf("tenant ads's page shows %d lines of ticker's log", n)
		}
	})

	t.Run("events", func(t *testing.T) {
		admin := admin.in(t)
		admin.open("#/events")
		admin.until("the events kept", 20*time.Second, `+document.getElementById('events-view').dataset.count > 20`, "")
		admin.screenshot("console-events.png")
		admin.open("#/events?kind=node.")
		admin.until("node events alone", 20*time.Second, `window.stormdockEvents.evs.length > 0 && window.stormdockEvents.evs.every((e) => e.kind.startsWith('node.'))`,
			`window.stormdockEvents.evs.map((e) => e.kind).join(' ')`)
		if v := admin.str(`document.querySelector('#events-view input[name="kind"]').value`); v != "node." {
			t.Errorf("the kind filter shows %q", v)
		}
		// A node killed: node.lost on the page, live, and on the node's own page.
		var node string
		for _, n := range lc.Nodes() {
			if !slicesContain(workerNodes(t, lc, "mirror"), n) {
				node = n
			}
		}
		if err := lc.KillNode(ctx, node); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		lost := fmt.Sprintf(`window.stormdockEvents.evs.some((e) => e.kind === 'node.lost' && e.node === %q) && document.querySelector('#events-view .event[data-kind="node.lost"]')`, node)
		admin.until("node.lost on the events page", 30*time.Second, lost, `document.getElementById('events-view').dataset.count`)
		t.Logf("node %s killed: node.lost on the page after %v (the store's session timeout is most of it)", node, time.Since(killed).Round(time.Millisecond))
		admin.open("#/node/" + node)
		admin.until("node.lost on the node's page", 20*time.Second, `document.querySelector('#view-node .event[data-kind="node.lost"]')`, `document.getElementById('view-node').textContent.slice(0, 300)`)
		admin.screenshot("console-node.png")
		admin.open("#/job/ticker/events")
		admin.until("the job's events on its page", 20*time.Second, `document.querySelector('#job-events .event[data-kind="rollout.step"]')`, `document.getElementById('job-events').textContent.slice(0, 300)`)
	})
}

func lineOf(text, line string) string {
	for i, l := range strings.Split(text, "\n") {
		if l == line {
			return strconv.Itoa(i + 1)
		}
	}
	return "?"
}

func slicesContain(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// downloads makes the tab's browser save downloads into dir.
func downloads(t *testing.T, p *tab, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, testenv.Timeout(10*time.Second))
	defer cancel()
	c := chromedp.FromContext(p.ctx)
	if _, err := cdp.Call(ctx, c.Browser, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, BrowserContextID: c.BrowserContextID, DownloadPath: dir}); err != nil {
		t.Fatalf("set the download directory: %v", err)
	}
}
