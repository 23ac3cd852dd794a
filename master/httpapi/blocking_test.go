package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// blockFixture is a leading master with three nodes (one per data center), its API, and two
// tenants, demo and other, each running a job of two workers (demo-job, other-job).
type blockFixture struct {
	tc     *clustertest.Sim
	m      *master.Master
	srv    *httptest.Server
	api    *httpapi.API
	reg    prometheus.Gatherer
	admin  *api.Client
	tokens map[string]string // by viewer: "admin", "demo", "other"
	nodes  map[string]*coord.Embedded
}

func newBlockFixture(t *testing.T) *blockFixture {
	t.Helper()
	tc := clustertest.NewSim(t)
	// No periodic replan: a test that a read is answered for a change must not pass on
	// the resync's publish instead.
	m, _, _ := tc.Master("m1", func(c *master.Config) { c.Resync = time.Hour })
	f := &blockFixture{tc: tc, m: m, reg: tc.Registry(m), tokens: map[string]string{}, nodes: map[string]*coord.Embedded{}}
	for _, n := range clustertest.Nodes(3, 1, 1) {
		f.nodes[n.ID] = tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 3 nodes", 5*time.Second, func() bool { return len(m.NodeEntries()) == 3 })
	f.srv, f.api = tc.API(m, httpapi.Config{})
	f.tokens["admin"] = tc.AdminToken()
	f.admin, _ = api.NewClient(f.srv.URL, f.tokens["admin"])
	for _, tenant := range []string{"demo", "other"} {
		if err := f.admin.CreateTenant(tc.Ctx, cluster.Tenant{Name: tenant, MaxWorkers: 8}); err != nil {
			t.Fatal(err)
		}
		tok, err := f.admin.TenantToken(tc.Ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		f.tokens[tenant] = tok
		f.submit(t, tenant+"-job", tenant, 2)
	}
	testenv.Eventually(t, "both jobs run", 5*time.Second, func() bool {
		jobs, err := f.admin.Jobs(tc.Ctx)
		return err == nil && len(jobs) == 2 && jobs[0].Running == 2 && jobs[1].Running == 2
	})
	return f
}

func (f *blockFixture) submit(t *testing.T, name, tenant string, workers int) {
	t.Helper()
	spec := fmt.Sprintf("name: %s\ntenant: %s\nworkers: %d\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\nplacement: {spread: [dc]}\n", name, tenant, workers)
	if _, err := f.admin.SubmitJob(f.tc.Ctx, []byte(spec)); err != nil {
		t.Fatal(err)
	}
}

// answer is what one read got.
type answer struct {
	status int
	index  uint64
	body   string
	took   time.Duration
	err    error
}

// get reads path as viewer, as a blocking query when index is not 0 (wait "" leaves the
// master's default).
func (f *blockFixture) get(ctx context.Context, viewer, path string, index uint64, wait string) answer {
	q := []string{}
	if index > 0 {
		q = append(q, "index="+strconv.FormatUint(index, 10))
	}
	if wait != "" {
		q = append(q, "wait="+wait)
	}
	url := f.srv.URL + path
	if len(q) > 0 {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		url += sep + strings.Join(q, "&")
	}
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+f.tokens[viewer])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: string(body), took: time.Since(start), err: err}
	a.index, _ = strconv.ParseUint(resp.Header.Get(api.IndexHeader), 10, 64)
	return a
}

// first reads path as viewer without an index and checks that it has one.
func (f *blockFixture) first(t *testing.T, viewer, path string) answer {
	t.Helper()
	a := f.get(f.tc.Ctx, viewer, path, 0, "")
	if a.err != nil || a.status != http.StatusOK || a.index == 0 {
		t.Fatalf("GET %s as %s: status %d, index %d, err %v: %s", path, viewer, a.status, a.index, a.err, a.body)
	}
	return a
}

// start sends a blocking query in the background; the answer comes on the channel. The
// request ends with the test.
func (f *blockFixture) start(t *testing.T, viewer, path string, index uint64, wait string) <-chan answer {
	ctx, cancel := context.WithCancel(f.tc.Ctx)
	ch := make(chan answer, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ch <- f.get(ctx, viewer, path, index, wait)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ch
}

// waiting waits until n reads wait on the master.
func (f *blockFixture) waiting(t *testing.T, n int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%d blocking queries waiting", n), 5*time.Second, func() bool {
		return testenv.Metric(t, f.reg, "stormdock_master_blocking_queries", nil) == float64(n)
	})
}

// quiet waits until the master's state has not changed, nor its read state been rebuilt,
// for longer than the loop of waited reads takes to look at a change and look again once
// a state built since may be (master.ReadRefresh and two api.WatchInterval).
func (f *blockFixture) quiet(t *testing.T) {
	t.Helper()
	window := master.ReadRefresh + 2*api.WatchInterval
	testenv.Eventually(t, fmt.Sprintf("the master's state quiet for %s", window), 20*time.Second, func() bool {
		snap := f.m.Snapshot()
		ctx, cancel := context.WithTimeout(f.tc.Ctx, window)
		defer cancel()
		_, err := f.m.WaitChange(ctx, f.m.ChangeIndex())
		return err != nil && f.m.Snapshot() == snap
	})
}

func (f *blockFixture) renders(t *testing.T) float64 {
	return testenv.Metric(t, f.reg, "stormdock_master_blocking_renders_total", nil)
}

// receive waits for a blocking query's answer.
func receive(t *testing.T, ch <-chan answer, what string) answer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		return a
	case <-time.After(testenv.Timeout(10 * time.Second)):
		t.Fatalf("%s: no answer after %s", what, testenv.Timeout(10*time.Second))
	}
	return answer{}
}

// notYet fails the test when the blocking query answered.
func notYet(t *testing.T, ch <-chan answer, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s answered before anything it reads changed: status %d, index %d, after %s: %s", what, a.status, a.index, a.took, a.body)
	default:
	}
}

func decode[T any](t *testing.T, body string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, body)
	}
	return v
}

// TestBlockingQueryAnswersAChange: a read waiting on its index is answered soon after what
// it reads changes (a job's record, a worker's state, the job list, a node's settings, a
// data center, a tenant), with a greater index and the change in it; and not before.
func TestBlockingQueryAnswersAChange(t *testing.T) {
	f := newBlockFixture(t)
	ctx := f.tc.Ctx
	var lostNode string
	for _, c := range []struct {
		name, viewer, path string
		change             func(t *testing.T, before answer)
		changed            func(t *testing.T, after answer) bool
	}{
		{
			name: "a job's record, in its summary", viewer: "demo", path: "/v1/jobs/demo-job?workers=false",
			change: func(t *testing.T, _ answer) {
				if _, err := f.admin.ScaleJob(ctx, "demo-job", 3); err != nil {
					t.Fatal(err)
				}
			},
			changed: func(t *testing.T, a answer) bool { return decode[api.JobStatus](t, a.body).Summary.Workers == 3 },
		},
		{
			name: "the job list", viewer: "demo", path: "/v1/jobs",
			change: func(t *testing.T, _ answer) { f.submit(t, "demo-two", "demo", 1) },
			changed: func(t *testing.T, a answer) bool {
				return strings.Contains(a.body, `"name": "demo-two"`)
			},
		},
		{
			name: "a node's settings", viewer: "admin", path: "/v1/nodes",
			change: func(t *testing.T, _ answer) {
				if err := f.admin.DrainNode(ctx, "n-0-0-0", true); err != nil {
					t.Fatal(err)
				}
			},
			changed: func(t *testing.T, a answer) bool {
				for _, n := range decode[[]api.NodeView](t, a.body) {
					if n.ID == "n-0-0-0" {
						return n.Draining
					}
				}
				return false
			},
		},
		{
			name: "a data center", viewer: "admin", path: "/v1/dcs",
			change: func(t *testing.T, _ answer) {
				if _, err := f.admin.FailDC(ctx, "dc-0"); err != nil {
					t.Fatal(err)
				}
			},
			changed: func(t *testing.T, a answer) bool {
				for _, d := range decode[[]api.DCView](t, a.body) {
					if d.Name == "dc-0" {
						return d.State == cluster.DCFailed
					}
				}
				return false
			},
		},
		{
			name: "a tenant", viewer: "admin", path: "/v1/tenants",
			change: func(t *testing.T, _ answer) {
				caps := 5
				if _, err := f.admin.UpdateTenant(ctx, "other", api.TenantChange{MaxWorkers: &caps}); err != nil {
					t.Fatal(err)
				}
			},
			changed: func(t *testing.T, a answer) bool {
				for _, tv := range decode[[]api.TenantView](t, a.body) {
					if tv.Name == "other" {
						return tv.MaxWorkers == 5
					}
				}
				return false
			},
		},
		{
			// Only the nodes and the assignments change: the job's record does not.
			name: "a worker's state, in its job's status", viewer: "other", path: "/v1/jobs/other-job",
			change: func(t *testing.T, before answer) {
				st := decode[api.JobStatus](t, before.body)
				for _, w := range st.Workers {
					if w.Node != "n-0-0-0" { // not the drained one: its loss would move nothing
						lostNode = w.Node
					}
				}
				if err := f.nodes[lostNode].Close(); err != nil {
					t.Fatal(err)
				}
			},
			changed: func(t *testing.T, a answer) bool {
				for _, w := range decode[api.JobStatus](t, a.body).Workers {
					if w.Node == lostNode && w.State == cluster.WorkerRunning {
						return false
					}
				}
				return true
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := f.first(t, c.viewer, c.path)
			ch := f.start(t, c.viewer, c.path, before.index, "1m")
			f.waiting(t, 1)
			notYet(t, ch, "GET "+c.path)
			c.change(t, before)
			// Each answer is a change past the index sent; the client follows them with
			// the index of each, as a CLI does, until it sees the one made.
			for a := receive(t, ch, "GET "+c.path); ; a = receive(t, ch, "GET "+c.path) {
				if a.status != http.StatusOK || a.index <= before.index {
					t.Fatalf("after the change: status %d, index %d (was %d): %s", a.status, a.index, before.index, a.body)
				}
				if a.body == before.body {
					t.Fatalf("answered with index %d (was %d) and the same content: no change", a.index, before.index)
				}
				if c.changed(t, a) {
					break
				}
				before = a
				ch = f.start(t, c.viewer, c.path, a.index, "1m")
			}
			f.waiting(t, 0)
		})
	}
}

// TestBlockingQueryHoldsUntilItsWait: a read whose answer does not change is held for its
// whole wait, then answered with the same content and index (Nomad's semantics). A master
// that ignored the index would answer at once.
func TestBlockingQueryHoldsUntilItsWait(t *testing.T) {
	f := newBlockFixture(t)
	const wait = 500 * time.Millisecond
	paths := []string{"/v1/jobs", "/v1/jobs/demo-job", "/v1/jobs/demo-job?workers=false", "/v1/nodes", "/v1/dcs", "/v1/tenants"}
	firsts := map[string]answer{}
	chans := map[string]<-chan answer{}
	for _, p := range paths {
		firsts[p] = f.first(t, "demo", p)
		chans[p] = f.start(t, "demo", p, firsts[p].index, wait.String())
	}
	for _, p := range paths {
		a := receive(t, chans[p], "GET "+p)
		if a.took < wait {
			t.Errorf("GET %s answered after %s, before its wait of %s, though nothing changed", p, a.took, wait)
		}
		if a.status != http.StatusOK || a.index != firsts[p].index || a.body != firsts[p].body {
			t.Errorf("GET %s after its wait: status %d, index %d (was %d), same content %v", p, a.status, a.index, firsts[p].index, a.body == firsts[p].body)
		}
	}
}

// TestBlockingQueryIgnoresOtherChanges: a read is not answered for changes it does not show:
// another tenant's job (to a tenant, and to the admin reading one job), however often the
// master's state changes meanwhile; it is, once its own job changes.
func TestBlockingQueryIgnoresOtherChanges(t *testing.T) {
	f := newBlockFixture(t)
	ctx := f.tc.Ctx
	reads := []struct{ viewer, path string }{
		{"demo", "/v1/jobs/demo-job?workers=false"},
		{"demo", "/v1/jobs/demo-job"},
		{"demo", "/v1/jobs"},
		{"admin", "/v1/jobs/demo-job?workers=false"},
	}
	var chans []<-chan answer
	for _, r := range reads {
		chans = append(chans, f.start(t, r.viewer, r.path, f.first(t, r.viewer, r.path).index, "1m"))
	}
	f.waiting(t, len(reads))
	renders := f.renders(t)
	for i, n := range []int{1, 3, 2} {
		if _, err := f.admin.ScaleJob(ctx, "other-job", n); err != nil {
			t.Fatalf("scale %d: %v", i, err)
		}
	}
	testenv.Eventually(t, "other-job settled on 2 workers", 5*time.Second, func() bool {
		st, err := f.admin.JobSummary(ctx, "other-job")
		return err == nil && st.Summary.Workers == 2 && st.Summary.Running == 2 && st.Summary.Stopping == 0
	})
	// Evidence that the master looked: each waited read was rendered again after the
	// changes (at least once, in one look).
	testenv.Eventually(t, "the waited reads rendered again", 5*time.Second, func() bool {
		return f.renders(t) >= renders+float64(len(reads))
	})
	testenv.AssertUntil(t, "no waited read answered", 300*time.Millisecond, func() (bool, string) {
		for i, ch := range chans {
			select {
			case a := <-ch:
				return false, fmt.Sprintf("GET %s as %s answered: status %d index %d", reads[i].path, reads[i].viewer, a.status, a.index)
			default:
			}
		}
		return true, ""
	})
	if _, err := f.admin.ScaleJob(ctx, "demo-job", 1); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chans {
		if a := receive(t, ch, "GET "+reads[i].path); a.status != http.StatusOK {
			t.Errorf("GET %s as %s after demo-job's change: status %d", reads[i].path, reads[i].viewer, a.status)
		}
	}
}

// TestBlockingQueryIndexNotGivenHere: an index this master did not give (greater than any it
// gave: another master's; or an earlier run's, below this run's) is answered at once, with
// the read's own index, on which a read then waits.
func TestBlockingQueryIndexNotGivenHere(t *testing.T) {
	f := newBlockFixture(t)
	const path = "/v1/jobs/demo-job?workers=false"
	first := f.first(t, "demo", path)
	for _, c := range []struct {
		name  string
		index uint64
	}{
		{"from the future", first.index + 1<<40},
		{"from an earlier run", 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := receive(t, f.start(t, "demo", path, c.index, "1m"), "GET "+path)
			if a.status != http.StatusOK || a.index != first.index || a.body != first.body {
				t.Fatalf("status %d, index %d (the read's is %d), same content %v", a.status, a.index, first.index, a.body == first.body)
			}
			ch := f.start(t, "demo", path, a.index, "1m")
			f.waiting(t, 1)
			notYet(t, ch, "GET "+path+" with the index answered")
		})
	}
}

// TestBlockingQueryBadParameters: a bad index or wait is a 400 with a one-line error; a wait
// over the cap is taken as the cap.
func TestBlockingQueryBadParameters(t *testing.T) {
	f := newBlockFixture(t)
	for _, q := range []string{"index=abc", "index=-1", "index=1.5", "index=18446744073709551616", "index=1&index=2",
		"wait=abc", "wait=5", "wait=-1s", "wait=0s", "index=1&wait=1m&wait=2m"} {
		for _, path := range []string{"/v1/jobs", "/v1/jobs/demo-job", "/v1/nodes", "/v1/dcs", "/v1/tenants"} {
			req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path+"?"+q, nil)
			req.Header.Set("Authorization", "Bearer "+f.tokens["admin"])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb api.ErrorBody
			if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &eb) != nil || eb.Code != "bad_input" ||
				strings.Contains(eb.Error, "\n") || eb.Error == "" {
				t.Errorf("GET %s?%s: %d %s, want 400 bad_input with a one-line error", path, q, resp.StatusCode, body)
			}
		}
	}
	if a := f.get(f.tc.Ctx, "admin", "/v1/jobs", 0, "1h"); a.status != http.StatusOK {
		t.Errorf("wait=1h without an index: status %d, want 200 at once: %s", a.status, a.body)
	}
	cl, _ := api.NewClient(f.srv.URL, f.tokens["admin"])
	if _, _, err := cl.JobsWith(f.tc.Ctx, api.QueryOptions{WaitIndex: 1, WaitTime: time.Hour}); err != nil {
		t.Errorf("the client's wait of 1h, capped: %v", err)
	}
}

// TestBlockingIndexesAreEachViewers: a tenant's indexes move with what its token shows alone:
// however many changes other tenants make, a tenant's read keeps its index, and its next
// change moves its index by one. An index is no count of the cluster's changes.
func TestBlockingIndexesAreEachViewers(t *testing.T) {
	f := newBlockFixture(t)
	ctx := f.tc.Ctx
	demo := f.first(t, "demo", "/v1/jobs")
	admin := f.first(t, "admin", "/v1/jobs")
	waiting := f.start(t, "demo", "/v1/jobs", demo.index, "1m")
	for i := range 5 {
		name := fmt.Sprintf("other-%d", i)
		f.submit(t, name, "other", 1)
		if _, err := f.admin.KillJob(ctx, name, 0); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "the admin's job list changed", 5*time.Second, func() bool {
		return f.get(ctx, "admin", "/v1/jobs", 0, "").index > admin.index
	})
	if a := f.first(t, "demo", "/v1/jobs"); a.index != demo.index || a.body != demo.body {
		t.Fatalf("demo's job list after other's changes: index %d (was %d), same content %v", a.index, demo.index, a.body == demo.body)
	}
	notYet(t, waiting, "demo's job list")
	if _, err := f.admin.ScaleJob(ctx, "demo-job", 1); err != nil {
		t.Fatal(err)
	}
	a := receive(t, waiting, "demo's job list")
	if a.index != demo.index+1 {
		t.Fatalf("demo's job list after its own change: index %d, want %d (one change of what demo sees since %d)", a.index, demo.index+1, demo.index)
	}
	// Another tenant's job is refused as before, and waiting on it tells nothing either.
	if a := f.get(ctx, "demo", "/v1/jobs/other-job", 0, ""); a.status != http.StatusForbidden {
		t.Fatalf("demo reads other-job: status %d, want 403", a.status)
	}
}

// TestBlockingQueryOutlastsTheWriteTimeout: a wait longer than the server's write timeout
// (api.WriteTimeout, 60s on every stormdock server; here 300ms) is answered: the wait moves
// the deadline.
func TestBlockingQueryOutlastsTheWriteTimeout(t *testing.T) {
	f := newBlockFixture(t)
	srv := &http.Server{Handler: f.api, ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond}
	cl, _ := api.NewClient(serveOn(t, srv), f.tokens["demo"])
	_, meta, err := cl.JobsWith(f.tc.Ctx, api.QueryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	jobs, again, err := cl.JobsWith(f.tc.Ctx, api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Second})
	if err != nil || len(jobs) != 1 || again.LastIndex != meta.LastIndex || time.Since(start) < time.Second {
		t.Fatalf("a wait of 1s behind a write timeout of 300ms: %d jobs, index %d (was %d), after %s: %v",
			len(jobs), again.LastIndex, meta.LastIndex, time.Since(start), err)
	}
}

// TestBlockingQueryEndsAtShutdown: a server shutting down answers its waiting reads at once
// (the same content and index) instead of waiting out their waits, and its Shutdown returns.
func TestBlockingQueryEndsAtShutdown(t *testing.T) {
	f := newBlockFixture(t)
	srv := &http.Server{Handler: f.api}
	cl, _ := api.NewClient(serveOn(t, srv), f.tokens["demo"])
	_, meta, err := cl.JobsWith(f.tc.Ctx, api.QueryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var again api.QueryMeta
	go func() {
		var err error
		_, again, err = cl.JobsWith(f.tc.Ctx, api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: time.Minute})
		done <- err
	}()
	f.waiting(t, 1)
	ctx, cancel := context.WithTimeout(f.tc.Ctx, testenv.Timeout(5*time.Second))
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with a read waiting: %v", err)
	}
	if err := <-done; err != nil || again.LastIndex != meta.LastIndex {
		t.Fatalf("the waiting read at shutdown: index %d (was %d): %v", again.LastIndex, meta.LastIndex, err)
	}
}

// TestBlockingQueryManyClientsMissNothing: clients that follow a read by its indexes while
// it changes quickly all end on its last answer, within moments of it, not at the end of
// their waits: no change is lost between the clients' renders, the loop's and the joins.
func TestBlockingQueryManyClientsMissNothing(t *testing.T) {
	f := newBlockFixture(t)
	ctx, cancel := context.WithCancel(f.tc.Ctx)
	const clients = 40
	paths := []string{"/v1/jobs/demo-job?workers=false", "/v1/jobs"}
	type latest struct {
		mu   sync.Mutex
		body string
	}
	seen := make([]latest, clients)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var index uint64
			for ctx.Err() == nil {
				a := f.get(ctx, "demo", paths[i%len(paths)], index, "1m")
				if a.err != nil || a.status != http.StatusOK {
					continue
				}
				index = a.index
				seen[i].mu.Lock()
				seen[i].body = a.body
				seen[i].mu.Unlock()
			}
		}()
	}
	f.waiting(t, clients)
	final := 0
	for i := range 12 {
		final = 1 + i%4
		if _, err := f.admin.ScaleJob(f.tc.Ctx, "demo-job", final); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond) // some changes apart, some together
		}
	}
	want := fmt.Sprintf(`"running": %d,`, final)
	testenv.EventuallyWith(t, "every client on demo-job's last state", 10*time.Second, func() (bool, string) {
		settled, err := f.admin.JobSummary(f.tc.Ctx, "demo-job")
		if err != nil || settled.Summary.Running != final || settled.Summary.Stopping != 0 {
			return false, fmt.Sprintf("demo-job not settled: %+v %v", settled.Summary, err)
		}
		for i := range seen {
			seen[i].mu.Lock()
			body := seen[i].body
			seen[i].mu.Unlock()
			if !strings.Contains(body, want) || !strings.Contains(body, `"stopping": 0,`) {
				return false, fmt.Sprintf("client %d (%s) last got: %s", i, paths[i%len(paths)], body)
			}
		}
		return true, ""
	})
}

// TestBlockingQueryChangeBeforeItWaits: a change that comes after a blocking read rendered
// its answer, but before it waits, is not lost: whether no read waited yet (the goroutine that
// renders waited reads starts with this one) or the goroutine already rendered the waited
// reads at the new state (without this one).
func TestBlockingQueryChangeBeforeItWaits(t *testing.T) {
	for _, loopLooked := range []bool{false, true} {
		t.Run(fmt.Sprintf("loop looked meanwhile %v", loopLooked), func(t *testing.T) {
			f := newBlockFixture(t)
			ctx := f.tc.Ctx
			const path = "/v1/jobs/demo-job?workers=false"
			before := f.first(t, "demo", path)
			if loopLooked {
				// Another read waiting, which the change does not change, keeps the
				// goroutine looking.
				other := f.first(t, "other", "/v1/jobs")
				f.start(t, "other", "/v1/jobs", other.index, "1m")
				f.waiting(t, 1)
			}
			var once sync.Once
			f.api.AfterLook(func(r *http.Request) {
				if r.URL.Query().Get("index") == "" || r.URL.Path != "/v1/jobs/demo-job" {
					return
				}
				once.Do(func() {
					renders := f.renders(t)
					if _, err := f.admin.ScaleJob(ctx, "demo-job", 3); err != nil {
						t.Error(err)
						return
					}
					testenv.Eventually(t, "the change done", 5*time.Second, func() bool {
						st, err := f.admin.JobSummary(ctx, "demo-job")
						return err == nil && st.Summary.Running == 3 && st.Summary.Stopping == 0
					})
					f.quiet(t)
					if loopLooked && f.renders(t) == renders {
						t.Error("the waited read was not rendered at the new state")
					}
				})
			})
			a := receive(t, f.start(t, "demo", path, before.index, "1m"), "GET "+path)
			if a.status != http.StatusOK || a.index <= before.index || decode[api.JobStatus](t, a.body).Summary.Workers != 3 {
				t.Fatalf("status %d, index %d (was %d): %s", a.status, a.index, before.index, a.body)
			}
		})
	}
}

// TestBlockingQueryOnAStandby: a master that does not lead answers blocking queries from the
// state it builds at most once per master.ReadRefresh: a client that follows a job through
// its changes there sees its last state, though nothing changes after it.
func TestBlockingQueryOnAStandby(t *testing.T) {
	f := newBlockFixture(t)
	m2, _, _ := f.tc.Master("m2", func(c *master.Config) { c.Resync = time.Hour })
	testenv.Eventually(t, "m2 sees the jobs", 5*time.Second, func() bool { return len(m2.CurrentJobs()) == 2 })
	if m2.Leader() {
		t.Fatal("m2 leads")
	}
	srv, _ := f.tc.API(m2, httpapi.Config{})
	standby := &blockFixture{tc: f.tc, m: m2, srv: srv, tokens: f.tokens}
	const path = "/v1/jobs/demo-job?workers=false"
	a := standby.first(t, "demo", path)
	ch := standby.start(t, "demo", path, a.index, "1m")
	if _, err := f.admin.ScaleJob(f.tc.Ctx, "demo-job", 3); err != nil {
		t.Fatal(err)
	}
	for {
		a = receive(t, ch, "GET "+path+" from the standby")
		st := decode[api.JobStatus](t, a.body)
		if a.status != http.StatusOK {
			t.Fatalf("status %d: %s", a.status, a.body)
		}
		if st.Summary.Running == 3 && st.Summary.Stopping == 0 {
			return
		}
		ch = standby.start(t, "demo", path, a.index, "1m")
	}
}

// serveOn serves srv on a loopback port until the test ends, and returns its base URL.
func serveOn(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
