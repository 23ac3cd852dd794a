package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// TestDataCenterLoss kills every agent of one data center: the job that may use the other
// data centers runs again there, and the job pinned to the lost one waits with a reason.
func TestDataCenterLoss(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	cl := h.AdminClient(h.StartMaster("m1"))
	ctx := context.Background()
	for _, dc := range []string{"dc-a", "dc-b", "dc-c"} {
		for _, r := range []string{"r1", "r2"} {
			h.StartAgent(dc+"-"+r, dc, r, 4)
		}
	}
	testenv.Eventually(t, "6 nodes", 20*time.Second, func() bool { return len(h.NodeRecords()) == 6 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec("wide", 9)); err != nil {
		t.Fatal(err)
	}
	pinned := strings.Replace(string(jobSpec("pinned", 2)), "placement: {spread: [dc, rack]}", "placement: {dcs: [dc-a]}", 1)
	if _, err := cl.SubmitJob(ctx, []byte(pinned)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "11 workers running", 30*time.Second, func() bool {
		return len(h.Running("wide")) == 9 && len(h.Running("pinned")) == 2
	})
	t0 := time.Now()
	for _, id := range []string{"dc-a-r1", "dc-a-r2"} {
		h.KillNode(id)
	}
	killed := time.Since(t0)
	testenv.Eventually(t, "wide running outside dc-a", 30*time.Second, func() bool {
		run := h.Running("wide")
		if len(run) != 9 {
			return false
		}
		for _, w := range run {
			if strings.HasPrefix(w.Node, "dc-a") {
				return false
			}
		}
		return true
	})
	t.Logf("figure: last agent of dc-a killed -> all movable workers running: %s", (time.Since(t0) - killed).Round(time.Millisecond))
	var st struct{ reason string }
	testenv.Eventually(t, "pinned job reported waiting", 15*time.Second, func() bool {
		js, err := cl.Job(ctx, "pinned")
		if err != nil || len(js.Workers) != 2 {
			return false
		}
		st.reason = js.Workers[0].Reason
		return js.Workers[0].State == "unplaced" && strings.Contains(js.Workers[0].Reason, "data center dc-a is lost")
	})
	dcs, err := cl.DCs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dcs {
		if d.Name == "dc-a" && d.State != cluster.DCLost {
			t.Errorf("dc-a state %q, want lost", d.State)
		}
	}
	t.Logf("pinned job: %s", st.reason)
}

// TestMirroredJob runs a job in two links with its routers placed by the scheduler (a
// leader and a standby, in two data centers); the active link's data center is lost
// mid-stream, then the leading router's node, and the sink still holds every offset once.
func TestMirroredJob(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	url := h.StartMaster("m1", "--reregister-grace", "1s")
	cl := h.AdminClient(url)
	ctx := context.Background()
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1", "dc-c-r2"} {
		h.StartAgent(n, n[:4], n[5:], 4)
	}
	testenv.Eventually(t, "4 nodes", 20*time.Second, func() bool { return len(h.NodeRecords()) == 4 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	// The link workers read their input here, the routers (their tenant's router uid)
	// write the output.
	dir := sharedDir(t, filepath.Join(h.Dir, "io"))
	const lines = 3000
	input := filepath.Join(dir, "input.txt")
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, "line %d of the replayable input\n", i)
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := h.SinkPath("e2e", "out.jsonl") // below the cluster's --sink-dir
	spec := fmt.Sprintf(`name: mirror
tenant: e2e
workers: 2
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s, --rate, '200']
links: [dc-a, dc-b]
output: file://%s
gracePeriod: 2s
`, input, out)
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "4 link workers and 2 routers running", 30*time.Second, func() bool {
		return len(h.Running("mirror")) == 4 && len(h.Running("mirror.router")) == 2
	})
	for k, w := range h.Running("mirror") {
		if !strings.HasPrefix(w.Node, k.Link) {
			t.Errorf("worker %s runs on %s, outside its link's data center", k, w.Node)
		}
	}
	routerDCs := map[string]bool{}
	for _, r := range h.Running("mirror.router") {
		routerDCs[r.Node[:4]] = true
	}
	if len(routerDCs) != 2 {
		t.Errorf("routers run in data centers %v; want two, so that the output survives the loss of either", routerDCs)
	}
	// Let output flow, then lose the active link's data center.
	testenv.Eventually(t, "output flowing", 30*time.Second, func() bool { return len(sinkOffsets(t, out)) > 300 })
	ls := h.linkStatus(t, "mirror")
	cut := time.Now()
	before := len(sinkOffsets(t, out))
	h.KillMachine(ls.Active + "-r1")
	testenv.Eventually(t, "output flowing after the link failover", 60*time.Second, func() bool { return len(sinkOffsets(t, out)) > before+50 })
	t.Logf("figure: active link's data center lost -> the sink receiving again: %s", time.Since(cut).Round(time.Millisecond))
	testenv.Eventually(t, "output flowing after the link failover", 60*time.Second, func() bool { return len(sinkOffsets(t, out)) > 1200 })

	// Lose the node of the leading router, unless it is the last link's.
	ls = h.linkStatus(t, "mirror")
	var leaderNode string
	for node, rec := range h.NodeRecords() {
		for _, w := range rec.Workers {
			if w.Key.Job == "mirror.router" && w.State == cluster.WorkerRunning && strings.HasSuffix(ls.Router, fmt.Sprintf(":%d", w.Port)) &&
				strings.Contains(ls.Router, rec.Node.Addr) {
				leaderNode = node
			}
		}
	}
	if leaderNode == "" {
		t.Fatalf("no running router serves at %s", ls.Router)
	}
	if !strings.HasPrefix(leaderNode, ls.Active) {
		before := len(sinkOffsets(t, out))
		cut := time.Now()
		h.KillMachine(leaderNode)
		testenv.Eventually(t, "the sink receiving again after the leading router's node was lost", 60*time.Second, func() bool {
			return len(sinkOffsets(t, out)) > before+50
		})
		t.Logf("figure: leading router's node (%s) killed -> the sink receiving again: %s", leaderNode, time.Since(cut).Round(time.Millisecond))
	} else {
		t.Logf("the leading router runs beside the last link (%s): not killed", leaderNode)
	}
	testenv.Eventually(t, "every line delivered", 90*time.Second, func() bool { return len(sinkOffsets(t, out)) >= lines })
	offs := sinkOffsets(t, out)
	if len(offs) != lines {
		t.Fatalf("sink holds %d records, want %d", len(offs), lines)
	}
	for i, o := range offs {
		if o != int64(i) {
			t.Fatalf("sink record %d has offset %d: lost or repeated output across the failovers", i, o)
		}
	}
	st, err := cl.Job(ctx, "mirror")
	if err != nil || st.Sink == nil || !st.Sink.Fed {
		t.Errorf("job status says the sink is not fed after recovery: %+v, %v", st.Sink, err)
	}

	// The routers' logs, read like workers': the leader's by default, the other by index.
	c := &cli{t: t, env: []string{"STORMDOCK_MASTER=" + url, "STORMDOCK_DATA=" + filepath.Join(h.Dir, "data")}}
	var lead string
	testenv.EventuallyWith(t, "the leading router's log", 30*time.Second, func() (bool, string) {
		out, code := c.run("job", "logs", "mirror", "--router", "--tail", "-1")
		lead = out
		return code == 0 && strings.Contains(out, "router recovered"), out
	})
	ls = h.linkStatus(t, "mirror")
	if !strings.Contains(lead, ls.Router) {
		t.Errorf("job logs --router is not the leading router's (%s) log:\n%s", ls.Router, lead)
	}
	var standby string
	for _, w := range []string{"0", "1"} {
		if out := c.ok("job", "logs", "mirror", "--router", "--worker", w, "--tail", "-1"); !strings.Contains(out, ls.Router) {
			standby = out
		}
	}
	if !strings.Contains(standby, "waiting to lead") {
		t.Errorf("no router's log (--worker 0 or 1) is the standby's:\n%s", standby)
	}
	c.refused("a router serves every link", "job", "logs", "mirror", "--router", "--link", "dc-a")
	c.refused("has routers 0 to 1", "job", "logs", "mirror", "--router", "--worker", "2")
}

// linkStatus runs `stormdock link status -o json` against the store.
func (h *harness) linkStatus(t *testing.T, job string) multidc.Status {
	t.Helper()
	name := fmt.Sprintf("link-status-%d", time.Now().UnixNano())
	args := []string{"link", "status", job, "-o", "json", "--store", h.StoreURL()}
	if ca := h.StoreCA(); ca != "" {
		args = append(args, "--store-ca", ca)
	}
	p := h.Start(name, args...)
	<-p.Done
	b, _ := os.ReadFile(filepath.Join(h.Dir, name+".log"))
	var ls multidc.Status
	if err := json.Unmarshal(b, &ls); err != nil || ls.Active == "" {
		t.Fatalf("link status: %v\n%s", err, b)
	}
	return ls
}

func sinkOffsets(t testing.TB, path string) []int64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []int64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			Offset int64 `json:"offset"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			break // a line being written
		}
		out = append(out, rec.Offset)
	}
	return out
}

// TestFileSinkConfined is the attack of issue 27 on a real cluster: a tenant names, as its
// mirrored job's file sink, a root-owned file outside the sink dir (refused at submit), a
// symlink to it inside its own sink dir, and a file there it did not make. Each router
// refuses to open its file and exits (its agent restarts it, and it refuses again), and,
// seen from the host, the files are byte for byte and mode as they were.
func TestFileSinkConfined(t *testing.T) {
	h := newHarness(t, 2*time.Second)
	cl := h.AdminClient(h.StartMaster("m1"))
	ctx := context.Background()
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1"} {
		h.StartAgent(n, n[:4], n[5:], 4)
	}
	testenv.Eventually(t, "3 nodes", 20*time.Second, func() bool { return len(h.NodeRecords()) == 3 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.Dir, "io")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	input := filepath.Join(dir, "input.txt")
	if err := os.WriteFile(input, []byte("one line\nanother line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Root's file, without a trailing newline (the old recovery cut after the last one).
	victim := filepath.Join(h.Dir, "root-victim")
	victimData := []byte("root-only data\nno newline at the end")
	if err := os.WriteFile(victim, victimData, 0o600); err != nil {
		t.Fatal(err)
	}
	// The tenant's sink dir, as the agent makes it, with the traps in it.
	tenantDir := filepath.Join(h.SinkDir, "e2e")
	if err := os.MkdirAll(h.SinkDir, 0o755); err != nil { // the routers' uids pass through it
		t.Fatal(err)
	}
	if err := os.Mkdir(tenantDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, h.SinkPath("e2e", "via-symlink.jsonl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(victim), h.SinkPath("e2e", "dir")); err != nil {
		t.Fatal(err)
	}
	foreign := h.SinkPath("e2e", "foreign.jsonl")
	foreignData := []byte("{\"offset\":0,\"link\":\"dc-a\",\"record\":{}}\n{\"offset\":1,\"link\":\"dc-a\",\"rec")
	if err := os.WriteFile(foreign, foreignData, 0o600); err != nil {
		t.Fatal(err)
	}
	// The router's own uid's file, which it may write (root's it may not even open): only
	// the router's evidence tells that it did not write it.
	ts, err := cl.Tenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].UID == 0 {
		t.Fatalf("tenants %+v: %v", ts, err)
	}
	if err := os.Chown(foreign, ts[0].UID+1, ts[0].UID+1); err != nil {
		t.Fatal(err)
	}
	spec := func(name, out string) []byte {
		return fmt.Appendf(nil, "name: %s\ntenant: e2e\nworkers: 1\nresources: {memory: 64Mi, cpu: 0.1}\n"+
			"command: [stormdock, worker, wordcount, --input, %s, --rate, '10']\nlinks: [dc-a, dc-b]\noutput: file://%s\ngracePeriod: 1s\n", name, input, out)
	}
	if _, err := cl.SubmitJob(ctx, spec("outside", victim)); !errors.Is(err, api.ErrBadInput) || !strings.Contains(err.Error(), "name a file below "+tenantDir+"/") {
		t.Fatalf("a sink outside the sink dir: %v", err)
	}
	jobs := map[string]string{
		"symlinked": h.SinkPath("e2e", "via-symlink.jsonl"),
		"dirlinked": h.SinkPath("e2e", "dir/root-victim"),
		"foreign":   foreign,
	}
	for name, out := range jobs {
		if _, err := cl.SubmitJob(ctx, spec(name, out)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Evidence that each router tried: its worker exited, and was restarted, at least once.
	testenv.EventuallyWith(t, "every router refusing its sink and restarted", 60*time.Second, func() (bool, string) {
		tried := map[string]string{}
		for _, rec := range h.NodeRecords() {
			for _, w := range rec.Workers {
				if strings.HasSuffix(w.Key.Job, ".router") && w.Restarts > 0 {
					tried[strings.TrimSuffix(w.Key.Job, ".router")] = w.LastExit
				}
			}
		}
		if len(tried) == len(jobs) {
			t.Logf("routers restarted, last exits: %v", tried)
		}
		return len(tried) == len(jobs), fmt.Sprintf("routers restarted: %v", tried)
	})
	// What they said: each router refused its sink for the reason of its trap (not, say, a
	// directory it could not enter), in its log in its agent's state directory.
	wantWhy := map[string]string{"symlinked": "a symlink on the way", "dirlinked": "a symlink on the way", "foreign": "was not written by this router"}
	said := map[string]bool{}
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1"} {
		logs, _ := filepath.Glob(filepath.Join(h.StateDir(n), "*", "*", "*.router*.log*"))
		for _, l := range logs {
			if b, err := os.ReadFile(l); err == nil && bytes.Contains(b, []byte("stormdock router:")) {
				i := bytes.Index(b, []byte("stormdock router:"))
				line := bytes.SplitN(b[i:], []byte("\n"), 2)[0]
				t.Logf("%s: %s", filepath.Base(l), line)
				for job, why := range wantWhy {
					if strings.Contains(filepath.Base(l), "."+job+".router") && bytes.Contains(line, []byte(why)) {
						said[job] = true
					}
				}
			}
		}
	}
	for job, why := range wantWhy {
		if !said[job] {
			t.Errorf("no router of job %s refused its sink saying %q", job, why)
		}
	}
	for path, want := range map[string][]byte{victim: victimData, foreign: foreignData} {
		got, err := os.ReadFile(path)
		fi, serr := os.Lstat(path)
		if err != nil || serr != nil || !bytes.Equal(got, want) || fi.Mode() != 0o600 {
			t.Errorf("%s changed: %q mode %v (%v %v), was %q mode 0600", path, got, fi.Mode(), err, serr, want)
		}
	}
	// Nothing was made beside the victim, nor any sidecar for the refused files.
	if ents, _ := os.ReadDir(filepath.Dir(victim)); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".root-victim") {
				t.Errorf("a router wrote %s beside the victim", e.Name())
			}
		}
	}
	for _, name := range []string{".foreign.jsonl.router", ".via-symlink.jsonl.router"} {
		if _, err := os.Lstat(filepath.Join(tenantDir, name)); err == nil {
			t.Errorf("a router wrote the evidence %s of a file it refused", name)
		}
	}
}

// TestPostgresSink runs a mirrored job into PostgreSQL on a local cluster. Bad input says
// why the sink is not fed, in `job status`, in one line: a database that does not answer,
// a table of another shape (with what it must look like). Once the table is right the sink
// is fed, and the database killed and restarted mid-stream twice loses and doubles nothing:
// the table, read with SQL, holds every offset once, in order.
func TestPostgresSink(t *testing.T) {
	pg := pgtest.Start(t, pgtest.Options{})
	h := newHarness(t, 2*time.Second)
	url := h.StartMaster("m1", "--reregister-grace", "1s")
	cl := h.AdminClient(url)
	ctx := context.Background()
	for _, n := range []string{"dc-a-r1", "dc-b-r1", "dc-c-r1"} {
		h.StartAgent(n, n[:4], n[5:], 4)
	}
	testenv.Eventually(t, "3 nodes", 20*time.Second, func() bool { return len(h.NodeRecords()) == 3 })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		t.Fatal(err)
	}
	dir := sharedDir(t, filepath.Join(h.Dir, "io"))
	const lines = 2000
	input := filepath.Join(dir, "input.txt")
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, "line %d of the replayable input\n", i)
	}
	if err := os.WriteFile(input, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	submit := func(name, output string) {
		spec := fmt.Sprintf("name: %s\ntenant: e2e\nworkers: 2\nresources: {memory: 64Mi, cpu: 0.1}\n"+
			"command: [stormdock, worker, wordcount, --input, %s, --rate, '150']\nlinks: [dc-a, dc-b]\noutput: %s\ngracePeriod: 2s\n", name, input, output)
		if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
			t.Fatal(err)
		}
	}
	c := &cli{t: t, env: []string{"STORMDOCK_MASTER=" + url, "STORMDOCK_DATA=" + filepath.Join(h.Dir, "data")}}
	notFed := func(job, want string) {
		t.Helper()
		testenv.EventuallyWith(t, job+": job status saying "+want, 60*time.Second, func() (bool, string) {
			st, err := cl.Job(ctx, job)
			if err != nil || st.Sink == nil {
				return false, fmt.Sprint(err)
			}
			return !st.Sink.Fed && strings.Contains(st.Sink.Problem, want), st.Sink.Problem
		})
		out := c.ok("job", "status", job)
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "sink NOT FED: ") {
				line = l
			}
		}
		if !strings.Contains(line, want) {
			t.Errorf("%s: job status says no line 'sink NOT FED: ...%s...':\n%s", job, want, out)
		}
	}

	// A database that does not answer.
	submit("pgdown", fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?table=out&sslmode=disable", pgtest.Superuser, testenv.FreePort(t)))
	notFed("pgdown", "cannot connect")
	if _, err := cl.KillJob(ctx, "pgdown", 0); err != nil {
		t.Fatal(err)
	}

	// A table of another shape, then one the router makes.
	pg.Exec(t, "postgres", `CREATE TABLE pgout ("offset" int PRIMARY KEY, link text, epoch bigint, record jsonb)`)
	submit("pgjob", fmt.Sprintf("postgres://%s@%s/postgres?table=pgout&sslmode=disable", pgtest.Superuser, pg.Addr()))
	notFed("pgjob", `table pgout is not a sink table: column "offset" is integer, not bigint; it must look like CREATE TABLE "pgout" ("offset" bigint PRIMARY KEY`)
	pg.Exec(t, "postgres", `DROP TABLE pgout`)
	rows := func() int64 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pg.Admin(cctx, "postgres")
		if err != nil {
			return -1
		}
		defer conn.Close(cctx)
		var n int64
		if conn.QueryRow(cctx, `SELECT count(*) FROM pgout`).Scan(&n) != nil {
			return -1
		}
		return n
	}
	testenv.Eventually(t, "rows in the table", 60*time.Second, func() bool { return rows() > 200 })
	st, err := cl.Job(ctx, "pgjob")
	if err != nil || st.Sink == nil || !st.Sink.Fed || st.Sink.Epoch < 1 {
		t.Errorf("job status once the table is right: %+v, %v", st.Sink, err)
	}

	// The database killed and restarted mid-stream, twice.
	for range 2 {
		at := rows()
		pg.Restart()
		testenv.Eventually(t, "rows written after the restart", 60*time.Second, func() bool { return rows() > at+200 })
	}
	testenv.Eventually(t, "every line in the table", 90*time.Second, func() bool { return rows() >= lines })
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pg.Admin(cctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(cctx)
	var n, distinct, first, last, backwards int64
	err = conn.QueryRow(cctx, `SELECT count(*), count(DISTINCT "offset"), min("offset"), max("offset"),
		count(*) FILTER (WHERE epoch < prev) FROM (SELECT "offset", epoch, max(epoch) OVER (ORDER BY "offset") AS prev FROM pgout) r`).
		Scan(&n, &distinct, &first, &last, &backwards)
	if err != nil {
		t.Fatal(err)
	}
	if n != lines || distinct != lines || first != 0 || last != lines-1 || backwards != 0 {
		t.Errorf("table: %d rows, %d offsets, %d..%d, %d written at an epoch older than an earlier offset's; want %d once each, 0..%d, none",
			n, distinct, first, last, backwards, lines, lines-1)
	}
}
