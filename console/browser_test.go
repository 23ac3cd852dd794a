package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/healthcheck"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// The jobs' workers follow an input file, so they run until stopped (the embedded sample
// would end them).
func wordcountSpec(input string) string {
	return fmt.Sprintf(`name: wordcount
tenant: demo
workers: 4
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, "5"]
placement: {spread: [dc, rack]}
gracePeriod: 2s
`, input)
}

func clicksSpec(input string) string {
	return fmt.Sprintf(`name: clicks
tenant: ads
workers: 3
resources: {memory: 96Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, "5"]
placement: {spread: [dc, rack]}
gracePeriod: 2s
`, input)
}

func mirrorSpec(input, out string) string {
	return fmt.Sprintf(`name: mirror
tenant: demo
workers: 2
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, "50"]
links: [dc-a, dc-b]
output: file://%s
gracePeriod: 2s
`, input, out)
}

// inputFile writes the lines the jobs read, where their tenant's uid may read them (a
// test's TempDir is its owner's alone).
func inputFile(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&b, "line %d of the console test's input, a few words to count\n", i)
	}
	dir, err := os.MkdirTemp("", "stormdock-console-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "input.txt")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConsole drives the console in chromium against a local cluster of 12 nodes (real
// agents, real worker processes): the admin logs in, finds a job's workers on the map,
// scales the job from its page and sees the new cells, drains a node and sees its cells
// move, reads and fails over a mirrored job's links; a tenant sees neither the other
// tenants' jobs nor admin actions; a wrong token is refused; a standby master serves the
// same console; the admin fails and restores a data center and kills a job. The
// screenshots of the README come from here.
func TestConsole(t *testing.T) {
	b := newBrowser(t)
	lc := startLocal(t, daemon.LocalConfig{Nodes: 12})
	ctx := context.Background()
	for _, tenant := range []string{"demo", "ads"} {
		if err := lc.Client.CreateTenant(ctx, cluster.Tenant{Name: tenant, MaxWorkers: 40, MaxMemory: 8 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	input := inputFile(t)
	lc.Submit(wordcountSpec(input))
	lc.Submit(clicksSpec(input))
	lc.Submit(mirrorSpec(input, lc.SinkPath("demo", "out.jsonl"))) // below the cluster's sink dir
	lc.Submit(tickerSpec)
	lc.WaitRunning("wordcount", 4)
	lc.WaitRunning("clicks", 3)
	lc.WaitRunning("mirror", 4)
	lc.WaitRunning("ticker", 2)
	testenv.EventuallyWith(t, "the mirrored job's router answering with an active link", 60*time.Second, func() (bool, string) {
		l, err := lc.Client.Links(ctx, "mirror")
		if err != nil {
			return false, err.Error()
		}
		return l.Source == "router" && l.Active != "", fmt.Sprintf("%+v", l)
	})

	admin := b.tab(t)
	t.Log("the admin logs in")
	admin.login(lc.API(), lc.Token)
	admin.until("the map with 12 nodes", 20*time.Second, `document.querySelectorAll('#map .node').length === 12`,
		`document.querySelectorAll('#map .node').length + ' nodes; ' + document.getElementById('login-error').textContent`)
	if v := admin.str(`document.getElementById('viewer').textContent`); v != "admin" {
		t.Errorf("viewer shows %q", v)
	}
	if m := admin.str(`document.getElementById('master').textContent`); !strings.Contains(m, "leader") {
		t.Errorf("master shows %q", m)
	}

	t.Log("the admin finds the job's workers on the map")
	admin.do(chromedp.Click(chromedp.CSS(`#legend button[data-job="wordcount"]`)))
	admin.until("wordcount's 4 workers highlighted", 10*time.Second, `document.querySelectorAll('#map .cell.hl').length === 4`,
		`document.querySelectorAll('#map .cell.hl').length`)
	var onMap []string
	admin.eval(`[...document.querySelectorAll('#map .cell.hl')].map((c) => c.closest('.node').dataset.id).sort()`, &onMap)
	if want := workerNodes(t, lc, "wordcount"); !slices.Equal(onMap, want) {
		t.Errorf("highlighted cells on nodes %v; the API places wordcount on %v", onMap, want)
	}
	// A click on a worker highlights its job.
	admin.eval(`document.querySelector('#map .cell[data-j="clicks"]').click(), true`, nil)
	admin.until("clicks's 3 workers highlighted", 10*time.Second,
		`document.querySelectorAll('#map .cell.hl').length === 3 && document.querySelectorAll('#map .cell.hl[data-j="clicks"]').length === 3`,
		`document.querySelectorAll('#map .cell.hl').length`)

	t.Log("the admin scales the job from its page and sees new cells on the map")
	admin.open("#/job/wordcount")
	admin.until("the job page with 4 workers", 10*time.Second, `document.querySelectorAll('#view-job tr[data-worker]').length === 4`, "")
	admin.clickText("#view-job", "Scale…")
	admin.confirm(map[string]string{"workers": "6"})
	admin.open("#/map")
	admin.until("6 running wordcount cells on the map", 60*time.Second,
		`document.querySelectorAll('#map .cell.s-running[data-j="wordcount"]').length === 6`,
		`document.querySelectorAll('#map .cell[data-j="wordcount"]').length + ' cells'`)
	if rec, err := lc.Client.Job(ctx, "wordcount"); err != nil || rec.Job.Spec.Workers != 6 {
		t.Fatalf("after scaling in the console the API says %d workers, %v", rec.Job.Spec.Workers, err)
	}
	admin.open("#/job/wordcount")
	admin.until("the job page with 6 running workers", 30*time.Second,
		`[...document.querySelectorAll('#view-job tr[data-worker]')].filter((r) => r.textContent.includes('running')).length === 6`, "")
	admin.screenshot("console-job.png")

	t.Log("the admin drains a node, with the keyboard, and sees its cells move")
	admin.open("#/map")
	node := admin.str(`document.querySelector('#map .cell[data-j="wordcount"]').closest('.node').dataset.id`)
	before := admin.num(fmt.Sprintf(`+document.querySelector('#map .node[data-id=%q]').dataset.workers`, node))
	admin.eval(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').focus(), true`, node), nil)
	admin.do(chromedp.KeyEvent(kb.Enter))
	admin.until("the node's panel", 10*time.Second, fmt.Sprintf(`document.querySelector('#detail h3')?.textContent === 'Node %s'`, node), "")
	admin.clickText("#detail", "Drain…")
	admin.confirm(nil)
	admin.until("the drained node empty, its cells elsewhere", 60*time.Second, fmt.Sprintf(
		`(() => { const n = document.querySelector('#map .node[data-id=%q]'); return n.classList.contains('draining') && n.dataset.workers === '0' &&
			document.querySelectorAll('#map .cell.s-running[data-j="wordcount"]').length === 6 &&
			document.querySelectorAll('#map .cell.s-running[data-j="clicks"]').length === 3; })()`, node),
		fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').getAttribute('aria-label')`, node))
	t.Logf("node %s drained: its %d workers moved", node, before)
	if n, ok := nodeView(t, lc, node); !ok || !n.Draining || n.SlotsUsed != 0 {
		t.Errorf("the API shows node %s as %+v after the drain", node, n)
	}
	// Arrow keys move between nodes.
	next := admin.str(fmt.Sprintf(`(() => { const all = [...document.querySelectorAll('#map .node')]; const i = all.findIndex((n) => n.dataset.id === %q); return all[(i + 1) %% all.length].dataset.id; })()`, node))
	admin.eval(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').focus(), true`, node), nil)
	admin.do(chromedp.KeyEvent(kb.ArrowRight))
	if got := admin.str(`document.activeElement.dataset.id || ''`); got != next {
		t.Errorf("ArrowRight from %s focused %q, want %s", node, got, next)
	}
	admin.do(chromedp.Click(chromedp.CSS("#filter-clear")))
	admin.until("no highlight", 5*time.Second, `!document.getElementById('map').classList.contains('highlighting')`, "")
	admin.screenshot("console-map.png")

	t.Log("the data centers show the placement engine's failure check")
	admin.open("#/dcs")
	admin.until("3 data centers, each with a failure check", 10*time.Second,
		`[...document.querySelectorAll('#dcs-table tr[data-dc]')].filter((r) => /the others take all|would wait/.test(r.textContent)).length === 3`,
		`document.getElementById('dcs-table').textContent`)

	t.Log("the admin reads the mirrored job's links and fails its output over")
	admin.open("#/job/mirror")
	admin.until("the mirrored job's links from its router", 20*time.Second,
		`document.querySelectorAll('#view-job tr[data-link]').length === 2 && document.querySelector('#view-job [data-active]')?.dataset.active`,
		`document.getElementById('view-job').textContent`)
	admin.until("the router's node on the page", 10*time.Second, `document.getElementById('view-job').textContent.includes('running')`, "")
	admin.screenshot("console-mirrored.png")
	// A failover needs a live standby: the drain above may have moved a link's workers, and
	// on a loaded machine they take a while to beat again (the router then refuses, "no
	// live standby link to fail over to", as it should).
	admin.until("both links alive", 60*time.Second,
		`[...document.querySelectorAll('#view-job tr[data-link]')].filter((r) => !/\bdown\b/.test(r.textContent)).length === 2`,
		`document.getElementById('view-job').textContent`)
	active := admin.str(`document.querySelector('#view-job [data-active]').dataset.active`)
	admin.clickText("#view-job", "Fail over…")
	admin.confirm(nil)
	admin.until("the other link active", 20*time.Second,
		fmt.Sprintf(`(document.querySelector('#view-job [data-active]')?.dataset.active || %q) !== %q`, active, active),
		`document.getElementById('view-job').textContent`)
	if l, err := lc.Client.Links(ctx, "mirror"); err != nil || l.Active == active || l.LastFailover == nil || l.LastFailover.Reason != "manual" {
		t.Errorf("after the console's failover the router says %+v, %v", l, err)
	}

	t.Log("a tenant sees its own jobs only, and no admin action")
	adsToken, err := lc.Client.TenantToken(ctx, "ads")
	if err != nil {
		t.Fatal(err)
	}
	ads := b.tab(t)
	ads.login(lc.API(), adsToken)
	// wordcount 6, mirror 4 and its router, ticker 2.
	ads.until("the tenant's map with every node, others' workers anonymous", 20*time.Second,
		`document.querySelectorAll('#map .node').length === 12 && document.querySelectorAll('#map .cell.other').length === 13 &&
		 document.querySelectorAll('#map .cell.s-running[data-j="clicks"]').length === 3`,
		`document.querySelectorAll('#map .cell.other').length + ' anonymous cells'`)
	var legend []string
	ads.eval(`[...document.querySelectorAll('#legend button')].map((b) => b.dataset.job)`, &legend)
	if !slices.Equal(legend, []string{"clicks"}) {
		t.Errorf("tenant ads's legend lists %v", legend)
	}
	if v := ads.str(`document.getElementById('viewer').textContent`); v != "tenant ads" {
		t.Errorf("viewer shows %q", v)
	}
	for _, view := range []string{"#/map", "#/jobs", "#/nodes", "#/dcs", "#/tenants"} {
		ads.open(view)
		ads.until("the view drawn", 10*time.Second, `document.body.dataset.version`, "")
		page := ads.str(`document.documentElement.outerHTML`)
		for _, other := range []string{"wordcount", "mirror", "demo"} {
			if regexp.MustCompile(`\b` + other + `\b`).MatchString(page) {
				t.Errorf("tenant ads sees %q on %s", other, view)
			}
		}
		var buttons []string
		ads.eval(`[...document.querySelectorAll('main button')].filter((b) => b.offsetParent !== null).map((b) => b.textContent.trim())`, &buttons)
		for _, b := range buttons {
			if b == "Drain…" || b == "Undrain…" || b == "Fail…" || b == "Restore…" {
				t.Errorf("tenant ads is offered %q on %s", b, view)
			}
		}
	}
	// And the API refuses what the console does not offer, from the tenant's own page.
	var codes []int
	ads.eval(fmt.Sprintf(`Promise.all([['/v1/nodes/%s/undrain'], ['/v1/dcs/dc-a/fail'], ['/v1/jobs/wordcount/scale', {workers: 1}]].map(([p, b]) =>
		fetch(p, {method: 'POST', headers: {Authorization: 'Bearer ' + sessionStorage.getItem('stormdock.token'), 'Content-Type': 'application/json'},
			body: JSON.stringify(b || {})}).then((r) => r.status)))`, node), &codes)
	if !slices.Equal(codes, []int{403, 403, 403}) {
		t.Errorf("the tenant's undrain, dc fail and scale of another tenant's job answered %v; want 403s", codes)
	}

	t.Log("a wrong token is refused")
	wrong := b.tab(t)
	wrong.login(lc.API(), "sdt_wrong")
	wrong.until("the refusal", 10*time.Second, `!document.getElementById('login-error').hidden`, "")
	if msg := wrong.str(`document.getElementById('login-error').textContent`); !strings.Contains(msg, "invalid API token") {
		t.Errorf("refusal says %q", msg)
	}
	if wrong.num(`document.getElementById('app').hidden ? 1 : 0`) != 1 {
		t.Error("the console shows the cluster to a wrong token")
	}

	t.Log("a standby master serves the same console")
	sctx, stop := context.WithCancel(ctx)
	standby, err := daemon.NewMaster(sctx, daemon.MasterConfig{Store: lc.StoreURL(), Listen: "127.0.0.1:0", ID: "standby", Logger: testenv.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = standby.Run(sctx)
	}()
	defer func() {
		stop()
		<-done
		standby.Close()
	}()
	st := b.tab(t)
	st.login(standby.URL(), lc.Token)
	st.until("the standby's map", 20*time.Second, fmt.Sprintf(`document.querySelectorAll('#map .node').length === 12 &&
		document.querySelector('#map .node[data-id=%q]').classList.contains('draining')`, node), "")
	if m := st.str(`document.getElementById('master').textContent`); !strings.Contains(m, "standby") {
		t.Errorf("the standby's console says %q", m)
	}
	st.eval(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').click(), true`, node), nil)
	st.clickText("#detail", "Undrain…")
	st.confirm(nil)
	for _, p := range []*tab{st, admin} {
		p.open("#/map")
		p.until("the node undrained, on both masters' consoles", 20*time.Second,
			fmt.Sprintf(`!document.querySelector('#map .node[data-id=%q]').classList.contains('draining')`, node), "")
	}

	t.Log("the admin fails a data center and restores it")
	admin.open("#/dcs")
	admin.clickText(`#dcs-table tr[data-dc="dc-c"]`, "Fail…")
	admin.confirm(nil)
	admin.open("#/map")
	admin.until("dc-c failed, wordcount's workers moved out of it", 60*time.Second,
		`document.querySelector('#map .dc[data-dc="dc-c"]').classList.contains('failed') &&
		 document.querySelectorAll('#map .dc[data-dc="dc-c"] .cell[data-j="wordcount"]').length === 0 &&
		 document.querySelectorAll('#map .cell.s-running[data-j="wordcount"]').length === 6`,
		`document.querySelector('#map .dc[data-dc="dc-c"]').textContent`)
	admin.open("#/dcs")
	admin.clickText(`#dcs-table tr[data-dc="dc-c"]`, "Restore…")
	admin.confirm(nil)
	admin.until("dc-c active again", 20*time.Second, `/active/.test(document.querySelector('#dcs-table tr[data-dc="dc-c"]').textContent)`, "")
	if dcs, err := lc.Client.DCs(ctx); err != nil || !slices.ContainsFunc(dcs, func(d api.DCView) bool { return d.Name == "dc-c" && d.State == cluster.DCActive }) {
		t.Errorf("after the console's restore the API says %+v, %v", dcs, err)
	}

	t.Log("the admin kills a job")
	admin.open("#/jobs")
	admin.clickText(`#jobs-table tr[data-job="clicks"]`, "Kill…")
	admin.confirm(map[string]string{"grace": "1s"})
	admin.open("#/map")
	admin.until("the killed job gone from the map and the legend", 60*time.Second,
		`!document.querySelector('#legend button[data-job="clicks"]') && !document.querySelector('#map .cell[data-j="clicks"]')`, "")

	consoleViews(t, lc, admin, ads)
}

// workerNodes lists the nodes of a job's workers, sorted, as the API says.
func workerNodes(t *testing.T, lc *clustertest.Local, job string) []string {
	t.Helper()
	st, err := lc.Client.Job(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, w := range st.Workers {
		out = append(out, w.Node)
	}
	slices.Sort(out)
	return out
}

func nodeView(t *testing.T, lc *clustertest.Local, id string) (api.NodeView, bool) {
	t.Helper()
	ns, err := lc.Client.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.ID == id {
			return n, true
		}
	}
	return api.NodeView{}, false
}

// TestConsoleMemoryPressure puts a node of a local cluster under real memory pressure (a
// 256 MiB limit on its cgroup parent and a worker that allocates in steps, as the health
// tests do) and sees its withheld slots on the map, with the reason.
func TestConsoleMemoryPressure(t *testing.T) {
	testenv.Cgroups(t)
	b := newBrowser(t)
	health := healthcheck.DefaultConfig()
	health.MemHigh, health.MemLow, health.MemCritical = 0.5, 0.3, 0.8
	health.ThrottleHold, health.HealthInterval = 2*time.Second, 100*time.Millisecond
	lc := startLocal(t, daemon.LocalConfig{Nodes: 1, DCs: []string{"dc-a"}, Slots: 8, Health: &health})
	ctx := context.Background()
	ns, err := lc.Client.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := ns[0].ID
	mem := filepath.Join("/sys/fs/cgroup/memory", lc.CgroupParent(node))
	for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
		if err := os.WriteFile(filepath.Join(mem, f), []byte(fmt.Sprint(256<<20)), 0o644); err != nil {
			t.Fatalf("limit the node's cgroup parent: %v", err)
		}
	}
	if err := lc.Client.CreateTenant(ctx, cluster.Tenant{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	p := b.tab(t)
	p.login(lc.API(), lc.Token)
	p.until("the map's node, all slots free", 20*time.Second, fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]')?.dataset.free === '8'`, node), "")
	lc.Submit(fmt.Sprintf("name: hog\ntenant: demo\nworkers: 1\nresources: {memory: 512Mi, cpu: 0.2}\ncommand: [%s, '4', 100ms, '240']\ngracePeriod: 1s\n", allocBinary))
	p.until("withheld slots on the node, with the reason", 60*time.Second, fmt.Sprintf(
		`(() => { const n = document.querySelector('#map .node[data-id=%q]'); return +n.dataset.withheld > 0 && n.querySelectorAll('.cell.withheld').length === +n.dataset.withheld &&
			n.classList.contains('h-throttled') && /memory/.test(n.querySelector('.nflags')?.textContent || ''); })()`, node),
		fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').getAttribute('aria-label')`, node))
	t.Logf("map: %s; %s", p.str(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q]').getAttribute('aria-label')`, node)),
		p.str(fmt.Sprintf(`document.querySelector('#map .node[data-id=%q] .nflags').textContent`, node)))
	if n, ok := nodeView(t, lc, node); !ok || n.SlotsThrottled == 0 {
		t.Logf("the API no longer shows the node throttled (%+v): the worker was evicted and memory came back", n)
	}
}
