package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/monitoring"
)

// follower is a CLI process that prints lines as they come (events -f, job logs -f), each
// stamped with the time it arrived.
type follower struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []stamped
	more  chan struct{}
	done  chan struct{}
	errb  testenv.Buffer
}

type stamped struct {
	text string
	at   time.Time
}

// follow runs the stormdock binary with args and env, reading its output line by line.
func follow(t *testing.T, env []string, args ...string) *follower {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f := &follower{cmd: cmd, more: make(chan struct{}, 1), done: make(chan struct{})}
	cmd.Stderr = &f.errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			now := time.Now()
			f.mu.Lock()
			f.lines = append(f.lines, stamped{sc.Text(), now})
			f.mu.Unlock()
			select {
			case f.more <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-f.done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})
	return f
}

// wait returns the first line from index from on that match takes, and its index.
func (f *follower) wait(t *testing.T, what string, from int, match func(string) bool) (stamped, int) {
	t.Helper()
	deadline := time.After(testenv.Timeout(60 * time.Second))
	for {
		f.mu.Lock()
		for i := from; i < len(f.lines); i++ {
			if match(f.lines[i].text) {
				l := f.lines[i]
				f.mu.Unlock()
				return l, i
			}
		}
		from = max(from, len(f.lines))
		f.mu.Unlock()
		select {
		case <-f.more:
		case <-f.done:
			f.mu.Lock()
			n := len(f.lines)
			f.mu.Unlock()
			if n <= from {
				t.Fatalf("%s: the follower ended first: %s", what, f.errb.String())
			}
		case <-deadline:
			t.Fatalf("no %s within %s (the follower printed %d lines; stderr %q)", what, testenv.Timeout(60*time.Second), from, f.errb.String())
		}
	}
}

// events decodes the events a follower of `events -f -o json` printed.
func (f *follower) events() []eventAt {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []eventAt
	for _, l := range f.lines {
		var e api.Event
		if json.Unmarshal([]byte(l.text), &e) == nil && e.Kind != "" {
			out = append(out, eventAt{e, l.at})
		}
	}
	return out
}

type eventAt struct {
	api.Event
	at time.Time
}

// waitEvent waits for an event that match takes, printed by an events follower.
func (f *follower) waitEvent(t *testing.T, what string, match func(api.Event) bool) eventAt {
	t.Helper()
	l, _ := f.wait(t, what+" event", 0, func(s string) bool {
		var e api.Event
		return json.Unmarshal([]byte(s), &e) == nil && match(e)
	})
	var e api.Event
	_ = json.Unmarshal([]byte(l.text), &e)
	return eventAt{e, l.at}
}

// latencies collects cause-to-event-line times for the figures.
type latencies struct {
	mu sync.Mutex
	by map[string][]time.Duration
}

func (l *latencies) add(kind string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = map[string][]time.Duration{}
	}
	l.by[kind] = append(l.by[kind], d)
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestEventsAndLogs is issue 19 on a real cluster (a master serving TLS, agents serving their
// logs over TLS, ZooKeeper): a crash-looping worker, an OOM-killed worker, an eviction under
// memory pressure, a link failover and a node SIGKILLed each show as their event on
// `stormdock events -f`, which a tenant sees only its own jobs' part of; `stormdock job logs`
// prints a worker's output, follows it as it writes and across a restart, and --previous
// shows the run before; for a docker worker too. Then every metric the alert rules and the
// dashboard use is exported by the cluster.
func TestEventsAndLogs(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	url := strings.Replace(h.StartMaster("m1", "--tls", "--reregister-grace", "1s"), "http://", "https://", 1)
	ca := filepath.Join(h.Dir, "data", "ca.crt")
	var cl *api.Client
	testenv.Eventually(t, "the master's CA and token", 20*time.Second, func() bool {
		pool, err := api.CAPool(ca)
		tok, terr := os.ReadFile(filepath.Join(h.Dir, "data", api.AdminTokenFile))
		if err != nil || terr != nil {
			return false
		}
		cl, _ = api.NewClient(url, strings.TrimSpace(string(tok)), api.WithRootCAs(pool))
		_, err = cl.Health(context.Background())
		return err == nil
	})
	ctx := context.Background()
	env := []string{"STORMDOCK_MASTER=" + url, "STORMDOCK_CA=" + ca, "STORMDOCK_DATA=" + filepath.Join(h.Dir, "data")}
	c := &cli{t: t, env: env}

	// Nodes: a1, a2 in dc-a; b1 in dc-b; p1 in dc-c, whose workers' cgroup parent has 256 MiB.
	metrics := map[string]string{}
	agent := func(id, dc, rack string, extra ...string) {
		metrics[id] = clustertest.FreeAddr(t)
		h.StartAgent(id, dc, rack, 4, append([]string{"--tls", "--metrics", metrics[id], "--restart-backoff", "100ms"}, extra...)...)
	}
	docker := dockerAvailable()
	isoA2 := "process"
	if docker {
		isoA2 = "process,docker"
	}
	agent("a1", "dc-a", "r1")
	agent("a2", "dc-a", "r2", "--isolation", isoA2)
	agent("b1", "dc-b", "r1")
	const limit = 256 << 20
	limitMemory(t, h.Cgroup+"/p1", limit)
	agent("p1", "dc-c", "r1", "--labels", "pool=hog", "--mem-high", "0.5", "--mem-low", "0.3", "--mem-critical", "0.8",
		"--throttle-hold", "2s", "--health-interval", "100ms")
	testenv.Eventually(t, "4 nodes", 30*time.Second, func() bool { return len(h.NodeRecords()) == 4 })
	for _, rec := range h.NodeRecords() {
		if rec.Logs == nil || !rec.Logs.TLS || rec.Logs.CertSHA256 == "" || rec.Logs.Port == 0 {
			t.Fatalf("node %s publishes no TLS log endpoint: %+v", rec.Node.ID, rec.Logs)
		}
	}

	events := follow(t, env, "events", "-f", "-o", "json")
	events.waitEvent(t, "a first", func(api.Event) bool { return true })
	c.ok("tenant", "create", "t1")
	c.ok("tenant", "create", "t2")
	t2 := strings.TrimSpace(lastLine(c.ok("tenant", "token", "t2")))
	t2events := follow(t, append(slices.Clone(env), "STORMDOCK_TOKEN="+t2), "events", "-f", "-o", "json")
	dir := t.TempDir()
	submit := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		c.ok("job", "submit", p)
	}
	var lat latencies
	noHang := testenv.Timeout(10 * time.Second)
	check := func(kind string, e eventAt, cause time.Time) {
		t.Helper()
		d := e.at.Sub(cause)
		if d > noHang {
			t.Errorf("%s: %s from cause to the event line (no-hang limit %s)", kind, d, noHang)
		}
		lat.add(kind, d)
	}

	// A crash loop: the worker exits with code 3 again and again.
	submit("crash", "name: crash\ntenant: t1\nworkers: 6\nresources: {memory: 64Mi, cpu: 0.1}\n"+
		"command: [sh, -c, 'echo \"run $$\"; sleep 0.2; exit 3']\nplacement: {nodeLabels: {isolation/process: 'true'}, dcs: [dc-a, dc-b]}\ngracePeriod: 1s\n")
	loop := events.waitEvent(t, "crash-looping", func(e api.Event) bool { return e.Kind == api.EventWorkerCrashLoop && e.Job == "crash" })
	if !strings.Contains(loop.Reason, "restarts within the crash-loop window") || !strings.Contains(loop.Reason, "exited with code 3") {
		t.Errorf("crash-loop event: %+v", loop.Event)
	}
	exits := func() (n int) {
		for _, e := range events.events() {
			if e.Kind == api.EventWorkerExited && e.Job == "crash" && e.Reason == "crashed: exited with code 3" {
				n++
			}
		}
		return n
	}
	testenv.EventuallyWith(t, "20 exits of the crashing workers", 60*time.Second, func() (bool, string) {
		return exits() >= 20, fmt.Sprint(exits())
	})
	for _, e := range events.events() {
		if e.Kind == api.EventWorkerExited && e.Job == "crash" && e.Reason == "crashed: exited with code 3" {
			check("worker exited (agent's exit time)", e, e.Time)
		}
	}
	c.ok("job", "kill", "crash", "--wait")

	// OOM: a worker that allocates past its 32 MiB limit.
	submit("oom", fmt.Sprintf("name: oom\ntenant: t1\nworkers: 1\nresources: {memory: 32Mi, cpu: 0.2}\ncommand: [%s, '8', 20ms, '200']\n"+
		"placement: {dcs: [dc-a, dc-b]}\ngracePeriod: 1s\n", allocBinary))
	oom := events.waitEvent(t, "OOM exit", func(e api.Event) bool {
		return e.Kind == api.EventWorkerExited && e.Job == "oom" && strings.Contains(e.Reason, "OOM-killed")
	})
	check("worker OOM-killed (agent's exit time)", oom, oom.Time)
	c.ok("job", "kill", "oom", "--wait")

	// Eviction under memory pressure on p1.
	submit("hog", fmt.Sprintf("name: hog\ntenant: t1\nworkers: 1\nresources: {memory: 512Mi, cpu: 0.2}\ncommand: [%s, '4', 100ms, '240']\n"+
		"placement: {nodeLabels: {pool: hog}}\ngracePeriod: 1s\n", allocBinary))
	throttled := events.waitEvent(t, "p1 throttled", func(e api.Event) bool { return e.Kind == api.EventNodeThrottled && e.Node == "p1" })
	if !strings.Contains(throttled.Reason, "slots withheld") {
		t.Errorf("throttle event: %+v", throttled.Event)
	}
	evicted := events.waitEvent(t, "hog evicted", func(e api.Event) bool { return e.Kind == api.EventWorkerEvicted && e.Job == "hog" })
	if !strings.Contains(evicted.Reason, "evicted under memory pressure") || evicted.Node != "p1" {
		t.Errorf("eviction event: %+v", evicted.Event)
	}
	check("worker evicted (agent's time)", evicted, evicted.Time)
	c.ok("job", "kill", "hog", "--wait")

	// Logs of a worker (on whichever node runs it), followed, across a restart, and the
	// run before it.
	submit("tick", "name: tick\ntenant: t1\nworkers: 2\nresources: {memory: 32Mi, cpu: 0.1}\n"+
		"command: [sh, -c, 'echo \"start $$\"; i=0; while :; do echo \"tick $i $(date +%s%N)\"; i=$((i+1)); sleep 0.2; done']\n"+
		"placement: {spread: [node], dcs: [dc-a, dc-b]}\ngracePeriod: 1s\n")
	var w1 api.WorkerView
	testenv.EventuallyWith(t, "tick's workers running", 30*time.Second, func() (bool, string) {
		st := c.status("tick")
		for _, w := range st.Workers {
			if w.Worker == 1 {
				w1 = w
			}
		}
		return st.Summary.Running == 2, fmt.Sprintf("%+v", st.Workers)
	})
	testenv.EventuallyWith(t, "job logs prints worker 1's last lines", 20*time.Second, func() (bool, string) {
		out, code := c.run("job", "logs", "tick", "--worker", "1", "--tail", "3")
		return code == 0 && strings.Count(out, "tick ") == 3, out
	})
	// The run's first line names its shell: the run before a restart is told by it.
	whole := c.ok("job", "logs", "tick", "--worker", "1", "--tail", "-1")
	oldStart, _, _ := strings.Cut(whole, "\n")
	if !strings.HasPrefix(oldStart, "start ") || !strings.Contains(whole, "\ntick 0 ") {
		t.Errorf("the whole log of worker 1 starts %q", clipOut(whole))
	}
	logs := follow(t, env, "job", "logs", "tick", "--worker", "1", "-f", "--tail", "0")
	var writeToLine []time.Duration
	_, i := logs.wait(t, "a first tick", 0, func(s string) bool { return strings.HasPrefix(s, "tick ") })
	for range 40 {
		var l stamped
		l, i = logs.wait(t, "the next tick", i+1, func(s string) bool { return strings.HasPrefix(s, "tick ") })
		f := strings.Fields(l.text)
		ns, err := strconv.ParseInt(f[len(f)-1], 10, 64)
		if err != nil {
			t.Fatalf("tick line %q", l.text)
		}
		writeToLine = append(writeToLine, l.at.Sub(time.Unix(0, ns)))
	}
	killed := time.Now()
	if err := syscall.Kill(w1.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ex := events.waitEvent(t, "tick/1 exited", func(e api.Event) bool {
		return e.Kind == api.EventWorkerExited && e.Object == "worker/tick/1" && strings.Contains(e.Reason, "signal 9")
	})
	check("worker SIGKILLed by the test", ex, killed)
	events.waitEvent(t, "tick/1 restarted", func(e api.Event) bool { return e.Kind == api.EventWorkerRestarted && e.Object == "worker/tick/1" })
	l, _ := logs.wait(t, "the new run's start in the followed log", i, func(s string) bool { return strings.HasPrefix(s, "start ") })
	if l.text == oldStart {
		t.Fatalf("the followed log shows no new run: %q", l.text)
	}
	prev := c.ok("job", "logs", "tick", "--worker", "1", "--previous", "--tail", "-1")
	if !strings.HasPrefix(prev, oldStart+"\n") || strings.Contains(prev, l.text) {
		t.Errorf("--previous of worker 1 (old run %q, new %q) = %q", oldStart, l.text, clipOut(prev))
	}
	if cur := c.ok("job", "logs", "tick", "--worker", "1", "--tail", "-1"); !strings.HasPrefix(cur, l.text+"\n") {
		t.Errorf("after the restart, worker 1's log starts %q; want the new run's %q", clipOut(cur), l.text)
	}
	c.refused("cannot be followed", "job", "logs", "tick", "--previous", "-f")
	if out, code := c.run("job", "logs", "tick", "--worker", "7"); code != 2 || !strings.Contains(out, "workers 0 to 1") {
		t.Errorf("logs of a worker the job lacks: exit %d, %q", code, out)
	}
	t.Logf("figure: job logs -f, worker writes a line -> the line printed (through master and agent, TLS both ways): p50 %s, p99 %s, max %s over %d lines",
		pct(writeToLine, 0.5).Round(time.Millisecond), pct(writeToLine, 0.99).Round(time.Millisecond), slices.Max(writeToLine).Round(time.Millisecond), len(writeToLine))

	// A tenant sees only its own jobs' events.
	submit("t2job", "name: t2job\ntenant: t2\nworkers: 1\nresources: {memory: 32Mi, cpu: 0.1}\ncommand: [sleep, '600']\nplacement: {dcs: [dc-a]}\ngracePeriod: 1s\n")
	t2events.waitEvent(t, "t2job started (seen by t2)", func(e api.Event) bool { return e.Kind == api.EventWorkerStarted && e.Job == "t2job" })
	if out, code := c.run("job", "logs", "tick", "--token", t2); code != 2 || !strings.Contains(out, "cannot act on tenant t1") {
		t.Errorf("tenant t2 read t1's logs: exit %d, %q", code, out)
	}

	// A mirrored job; a manual failover, then the SIGKILL of dc-b's only node.
	input := filepath.Join(sharedDir(t, filepath.Join(h.Dir, "io")), "input.txt")
	if err := os.MkdirAll(filepath.Dir(input), 0o777); err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for i := range 100000 {
		fmt.Fprintf(&text, "line %d of the input\n", i)
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	submit("mirror", fmt.Sprintf("name: mirror\ntenant: t1\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\n"+
		"command: [stormdock, worker, wordcount, --input, %s, --rate, '100']\nlinks: [dc-a, dc-b]\noutput: file://%s\n"+
		"placement: {dcs: [dc-a, dc-b]}\ngracePeriod: 1s\n", input, h.SinkPath("t1", "out.jsonl")))
	testenv.EventuallyWith(t, "the mirrored job's output flowing from a link", 60*time.Second, func() (bool, string) {
		st := c.status("mirror")
		return st.Sink != nil && st.Sink.Fed, fmt.Sprintf("%+v", st.Sink)
	})
	// The router refuses a failover to a link whose workers do not beat yet (as it should):
	// wait for both links alive, as an operator would read them in link status.
	testenv.EventuallyWith(t, "both links alive", 60*time.Second, func() (bool, string) {
		ls := h.linkStatus(t, "mirror")
		alive := 0
		for _, l := range ls.Links {
			if l.Alive {
				alive++
			}
		}
		return alive == 2, fmt.Sprintf("%+v", ls.Links)
	})
	active := c.status("mirror").Sink.Active
	other := map[string]string{"dc-a": "dc-b", "dc-b": "dc-a"}[active]
	// The leading router's log, followed from before the failover: its line must arrive live.
	rlogs := follow(t, env, "job", "logs", "mirror", "--router", "-f", "--tail", "-1")
	_, ri := rlogs.wait(t, "the leading router's log followed", 0, func(string) bool { return true })
	c.ok("link", "failover", "mirror", "--to", other, "--store", h.StoreURL())
	rlogs.wait(t, "the failover in the followed router log", ri+1, func(s string) bool {
		return strings.Contains(s, "failover") && strings.Contains(s, "manual") && strings.Contains(s, other)
	})
	fo := events.waitEvent(t, "manual failover", func(e api.Event) bool {
		return e.Kind == api.EventLinkFailover && e.Job == "mirror" && e.Link == other
	})
	if !strings.Contains(fo.Reason, fmt.Sprintf("from %s to %s (manual)", active, other)) || !strings.Contains(fo.Reason, "offset") {
		t.Errorf("failover event: %+v", fo.Event)
	}
	check("link failover (router's time)", fo, fo.Time)

	// SIGKILL dc-b's only node: the master learns it when its session expires.
	gone := make(chan time.Time, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := h.Store.Watch(wctx, cluster.NodesKey+"/b1")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range ch {
			if !ev.Exists {
				gone <- time.Now()
				return
			}
		}
	}()
	nodeKilled := time.Now()
	h.KillMachine("b1")
	lost := events.waitEvent(t, "b1 lost", func(e api.Event) bool { return e.Kind == api.EventNodeLost && e.Node == "b1" })
	t.Logf("figure: node SIGKILLed (agent, keeper, workers) -> node.lost line on events -f: %s (the store session timeout is %s)",
		lost.at.Sub(nodeKilled).Round(time.Millisecond), h.Session)
	select {
	case at := <-gone:
		check("node SIGKILLed: its entry gone from the store", lost, at)
	case <-time.After(testenv.Timeout(10 * time.Second)):
		t.Error("the store never reported b1's entry gone")
	}
	events.waitEvent(t, "dc-b lost", func(e api.Event) bool { return e.Kind == api.EventDCLost && e.DC == "dc-b" })
	if other == "dc-b" {
		back := events.waitEvent(t, "failover back to dc-a", func(e api.Event) bool {
			return e.Kind == api.EventLinkFailover && e.Job == "mirror" && e.Link == "dc-a" && e.ID > fo.ID
		})
		if !strings.Contains(back.Reason, "(heartbeat)") {
			t.Errorf("failover after the node loss: %+v", back.Event)
		}
		check("link failover (router's time)", back, back.Time)
	}
	events.waitEvent(t, "a worker moved off b1", func(e api.Event) bool { return e.Kind == api.EventWorkerMoved && e.Node == "b1" })

	if docker {
		t.Run("docker", func(t *testing.T) { dockerLogs(t, c, dir) })
	} else {
		testenv.Missing(t, "dockerd (the docker worker's logs)")
	}

	// Tenant t2 saw its own events alone, t1 none of them.
	for _, e := range t2events.events() {
		if e.Tenant != "t2" {
			t.Errorf("tenant t2 saw %+v", e.Event)
		}
	}
	// Every event in order, each with time, kind, object.
	evs := events.events()
	for i, e := range evs {
		if e.Time.IsZero() || e.Kind == "" || e.Object == "" || !api.IsEventKind(e.Kind) {
			t.Errorf("incomplete event %+v", e.Event)
		}
		if i > 0 && e.ID <= evs[i-1].ID {
			t.Errorf("event %d after %d", e.ID, evs[i-1].ID)
		}
	}
	var all []time.Duration
	for kind, ds := range lat.by {
		all = append(all, ds...)
		t.Logf("figure: cause -> event line on events -f, %s: p50 %s, max %s (%d)", kind, pct(ds, 0.5).Round(time.Millisecond), slices.Max(ds).Round(time.Millisecond), len(ds))
	}
	t.Logf("figure: cause -> event line on events -f, all causes: p50 %s, p99 %s, max %s over %d events (%d events seen in all)",
		pct(all, 0.5).Round(time.Millisecond), pct(all, 0.99).Round(time.Millisecond), slices.Max(all).Round(time.Millisecond), len(all), len(evs))

	// Every metric the alert rules and the dashboard use is exported by this cluster, to the
	// scrape token; an anonymous caller gets 401 and learns no job or tenant name.
	exported := map[string]bool{}
	scrapeToken := h.MetricsToken()
	named := regexp.MustCompile(`\b(crash|oom|hog|tick|t2job|mirror|dlogs|t1|t2)\b`)
	scrape := func(u string, client *http.Client) {
		get := func(token string) (int, []byte) {
			req, err := http.NewRequest(http.MethodGet, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("scrape %s: %v", u, err)
				return 0, nil
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		if status, b := get(""); status != http.StatusUnauthorized || named.Match(b) {
			t.Errorf("anonymous %s: %d %s", u, status, clipOut(string(b)))
		}
		status, b := get(scrapeToken)
		if status != http.StatusOK {
			t.Errorf("scrape %s with the scrape token: %d %s", u, status, clipOut(string(b)))
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
				exported[strings.Fields(name)[0]] = true
			}
		}
	}
	pool, _ := api.CAPool(ca)
	tlsClient := &http.Client{Transport: tlsTransport(pool)}
	scrape(url+"/metrics", tlsClient)
	for id, addr := range metrics {
		if id != "b1" {
			scrape("http://"+addr+"/metrics", http.DefaultClient)
		}
	}
	for _, rec := range h.NodeRecords() {
		for _, w := range rec.Workers {
			if w.Key.Job == "mirror.router" && w.State == cluster.WorkerRunning {
				scrape(fmt.Sprintf("https://%s:%d/metrics", rec.Node.Addr, w.Port), h.routerClient(t))
			}
		}
	}
	for _, name := range monitoring.MetricNames() {
		if !exported[name] {
			t.Errorf("the rules or the dashboard use %s, which the running cluster does not export", name)
		}
	}
}

func clipOut(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// dockerAvailable reports whether a docker engine answers on the local socket.
func dockerAvailable() bool {
	return exec.Command("docker", "version").Run() == nil
}

// dockerLogs: a docker worker's output through `job logs`, its previous run after a restart
// (the wordcount worker exits once its sample is done), and followed.
func dockerLogs(t *testing.T, c *cli, dir string) {
	testenv.DockerSocket(t)
	tag := fmt.Sprintf("stormdock-e2e/logs-%d:1", os.Getpid())
	out := c.ok("image", "build", "--tag", tag)
	id := builtID(out)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "--force", id).Run() })
	p := filepath.Join(dir, "dlogs.yaml")
	spec := fmt.Sprintf("name: dlogs\ntenant: t1\nworkers: 1\nisolation: docker\nimage: %s\nresources: {memory: 64Mi, cpu: 0.1}\n"+
		"command: [stormdock, worker, wordcount, --rate, '6']\ngracePeriod: 1s\n", tag)
	if err := os.WriteFile(p, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	c.ok("job", "submit", p, "--wait")
	t.Cleanup(func() { c.run("job", "kill", "dlogs", "--grace", "1s", "--wait") })
	f := follow(t, c.env, "job", "logs", "dlogs", "-f", "--tail", "-1")
	// The worker writes its embedded sample's 12 records, then waits; killed, it restarts
	// and writes them again.
	_, i := f.wait(t, "the last record in the followed docker log", 0, func(s string) bool { return strings.Contains(s, `"offset":11`) })
	st := c.status("dlogs")
	if err := syscall.Kill(st.Workers[0].PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the docker worker (pid %d): %v", st.Workers[0].PID, err)
	}
	f.wait(t, "the next run's first record, followed across the restart", i+1, func(s string) bool { return strings.Contains(s, `"offset":0`) })
	testenv.EventuallyWith(t, "the docker worker's previous run", 30*time.Second, func() (bool, string) {
		out, code := c.run("job", "logs", "dlogs", "--previous", "--tail", "-1")
		return code == 0 && strings.Contains(out, `"offset":0`) && strings.Contains(out, `"offset":11`), out
	})
	if out := c.ok("job", "logs", "dlogs", "--tail", "2"); strings.Count(out, "\n") > 2 || !strings.Contains(out, `"offset"`) {
		t.Errorf("docker worker's tail 2: %q", out)
	}
}

func tlsTransport(pool *x509.CertPool) *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
}
