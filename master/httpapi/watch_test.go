package httpapi_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
	"github.com/stormdock/stormdock/placement/synth"
)

// watcher follows a watch stream in the background and keeps the latest map.
type watcher struct {
	mu   sync.Mutex
	m    api.ClusterMap
	n    int // events seen
	err  error
	done chan struct{}
}

func watch(t *testing.T, ctx context.Context, cl *api.Client) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	w := &watcher{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		err := cl.Watch(ctx, func(m *api.ClusterMap) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.m = *m
			w.m.Nodes = slices.Clone(m.Nodes)
			w.m.Jobs = slices.Clone(m.Jobs)
			w.n++
			return nil
		})
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

func (w *watcher) latest() (api.ClusterMap, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m, w.n, w.err
}

// cells counts the map's cells of job by node.
func cells(m api.ClusterMap, job string) map[string]int {
	out := map[string]int{}
	for _, n := range m.Nodes {
		for _, c := range n.Cells {
			if c.Job == job && c.State == cluster.WorkerRunning {
				out[n.ID]++
			}
		}
	}
	return out
}

func total(per map[string]int) int {
	n := 0
	for _, c := range per {
		n += c
	}
	return n
}

// watchCluster is a leader and a standby on 8 simulated nodes in 2 data centers, with an
// admin token, tenants search and ads, a job of each, and an HTTP server on the standby.
func watchCluster(t *testing.T) (tc *clustertest.Sim, standby *master.Master, srv *httptest.Server, admin *api.Client, token string) {
	t.Helper()
	tc = clustertest.NewSim(t)
	leader, _, _ := tc.Master("m1")
	testenv.Eventually(t, "m1 leads", 5*time.Second, leader.Leader)
	standby, _, _ = tc.Master("m2")
	for _, n := range clustertest.Nodes(2, 2, 2) {
		tc.Node(n)
	}
	testenv.Eventually(t, "the masters see 8 nodes", 5*time.Second, func() bool {
		return len(leader.NodeEntries()) == 8 && len(standby.NodeEntries()) == 8
	})
	srv = httptest.NewServer(httpapi.New(standby, httpapi.Config{}))
	t.Cleanup(srv.Close)
	token = api.NewToken()
	if _, err := tc.Admin.Create(tc.Ctx, cluster.AdminTokenKey, []byte(api.HashToken(token)), coord.Persistent); err != nil {
		t.Fatal(err)
	}
	admin, _ = api.NewClient(srv.URL, token)
	for _, name := range []string{"search", "ads"} {
		if err := admin.CreateTenant(tc.Ctx, cluster.Tenant{Name: name, MaxWorkers: 20}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("wc", 4)); err != nil {
		t.Fatal(err)
	}
	ads := clustertest.Spec("clicks", 2)
	ads.Tenant = "ads"
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, ads); err != nil {
		t.Fatal(err)
	}
	return tc, leader, srv, admin, token
}

// TestWatchStreamsTheMap: a standby master's stream shows every node with the workers the
// leader placed, and then a scale-out and a drain as they happen.
func TestWatchStreamsTheMap(t *testing.T) {
	tc, _, _, admin, _ := watchCluster(t)
	w := watch(t, tc.Ctx, admin)
	testenv.EventuallyWith(t, "the map shows 8 nodes and wc's 4 running workers", 10*time.Second, func() (bool, string) {
		m, _, err := w.latest()
		if err != nil {
			t.Fatal(err)
		}
		return len(m.Nodes) == 8 && total(cells(m, "wc")) == 4 && total(cells(m, "clicks")) == 2, summary(m)
	})
	m, _, _ := w.latest()
	if !m.Viewer.Admin || m.Master.ID != "m2" || m.Master.Leader {
		t.Errorf("viewer %+v, master %+v; want the admin on standby m2", m.Viewer, m.Master)
	}
	if len(m.DCs) != 2 || len(m.Tenants) != 2 || len(m.Jobs) != 2 {
		t.Fatalf("map has %d dcs, %d tenants, %d jobs; want 2, 2, 2", len(m.DCs), len(m.Tenants), len(m.Jobs))
	}
	for _, n := range m.Nodes {
		if n.State != api.NodeUp || n.Slots != 4 || n.Health != cluster.HealthHealthy || n.Memory != 4<<30 {
			t.Errorf("node %+v", n)
		}
	}
	if _, err := admin.ScaleJob(tc.Ctx, "wc", 7); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the map shows wc's 7 workers", 10*time.Second, func() (bool, string) {
		m, _, _ := w.latest()
		return total(cells(m, "wc")) == 7, summary(m)
	})
	m, _, _ = w.latest()
	var busy string
	for id, c := range cells(m, "wc") {
		if c > 0 {
			busy = id
			break
		}
	}
	if err := admin.DrainNode(tc.Ctx, busy, true); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the drained node's cells move", 10*time.Second, func() (bool, string) {
		m, _, _ := w.latest()
		per := cells(m, "wc")
		for _, n := range m.Nodes {
			if n.ID == busy && (!n.Draining || len(n.Cells) != 0) {
				return false, summary(m)
			}
		}
		return total(per) == 7, summary(m)
	})
}

func summary(m api.ClusterMap) string {
	var b strings.Builder
	for _, n := range m.Nodes {
		b.WriteString(n.ID + ":")
		for _, c := range n.Cells {
			b.WriteString(" " + c.Job + "/" + c.State)
		}
		b.WriteString("; ")
	}
	return b.String()
}

// TestWatchScopesTenants: a tenant's stream holds its own jobs and tenant only; other
// tenants' workers are anonymous cells and their names appear nowhere in the stream. A
// wrong token is refused, and a stream ends once its token is replaced.
func TestWatchScopesTenants(t *testing.T) {
	tc, standby, srv, admin, _ := watchCluster(t)
	testenv.Eventually(t, "6 workers assigned", 10*time.Second, func() bool { return len(tc.Assignments()) == 6 })
	adsToken, err := admin.TenantToken(tc.Ctx, "ads")
	if err != nil {
		t.Fatal(err)
	}
	// Read the raw stream: nothing of tenant search may be in it.
	ctx, cancel := context.WithTimeout(tc.Ctx, testenv.Timeout(20*time.Second))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/watch", nil)
	req.Header.Set("Authorization", "Bearer "+adsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var snap api.ClusterMap
	err = api.ReadEvents(resp.Body, func(event string, data []byte) error {
		if strings.Contains(string(data), `"wc"`) || strings.Contains(string(data), "search") {
			t.Errorf("tenant ads's stream names tenant search's job or tenant: %s", data)
		}
		switch event {
		case api.EventSnapshot:
			if err := json.Unmarshal(data, &snap); err != nil {
				return err
			}
		case api.EventDelta:
			var d api.ClusterDelta
			if err := json.Unmarshal(data, &d); err != nil {
				return err
			}
			snap.Apply(d)
		}
		if total(cells(snap, "clicks")) == 2 {
			return io.EOF // every worker of ads runs: the map is complete
		}
		return nil
	})
	if !errors.Is(err, io.EOF) {
		t.Fatalf("the ads stream ended before it showed both of ads's workers: %v", err)
	}
	if snap.Viewer.Admin || snap.Viewer.Tenant != "ads" {
		t.Errorf("viewer = %+v", snap.Viewer)
	}
	if len(snap.Jobs) != 1 || snap.Jobs[0].Name != "clicks" || len(snap.Tenants) != 1 || snap.Tenants[0].Name != "ads" {
		t.Errorf("tenant ads sees jobs %+v and tenants %+v", snap.Jobs, snap.Tenants)
	}
	anon := 0
	for _, n := range snap.Nodes {
		for _, c := range n.Cells {
			if c.Job == "" {
				anon++
				if c.Link != "" || c.Worker != 0 {
					t.Errorf("anonymous cell %+v says more than its state", c)
				}
			}
		}
	}
	if anon != 4 {
		t.Errorf("%d anonymous cells; want wc's 4", anon)
	}

	forged, _ := api.NewClient(srv.URL, "sdt_forged")
	if err := forged.Watch(tc.Ctx, func(*api.ClusterMap) error { return nil }); !errors.Is(err, api.ErrUnauthorized) {
		t.Fatalf("watch with a wrong token: %v", err)
	}

	// A server of the standby's whose streams check their token every 100ms.
	reauth, _ := tc.API(standby, httpapi.Config{WatchReauth: 100 * time.Millisecond})
	ads, _ := api.NewClient(reauth.URL, adsToken)
	w := watch(t, tc.Ctx, ads)
	testenv.Eventually(t, "the ads stream's snapshot", 10*time.Second, func() bool { _, n, _ := w.latest(); return n > 0 })
	if _, err := admin.TenantToken(tc.Ctx, "ads"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(testenv.Timeout(10 * time.Second)):
		t.Fatal("the stream of a replaced token did not end")
	}
	if _, _, err := w.latest(); !errors.Is(err, api.ErrUnauthorized) {
		t.Fatalf("stream of a replaced token ended with %v", err)
	}
}

// TestWatchDeltasHoldWhatChanged: after the snapshot, a drain sends the nodes whose cells
// changed, not the map; the figures are the bytes of each, uncompressed and on the wire.
func TestWatchDeltasHoldWhatChanged(t *testing.T) {
	tc, _, srv, admin, token := watchCluster(t)
	testenv.Eventually(t, "6 workers assigned", 10*time.Second, func() bool { return len(tc.Assignments()) == 6 })
	for _, gz := range []bool{false, true} {
		deltaPass(t, tc, srv.URL, token, admin, gz)
	}
}

// deltaPass drains a busy node and reads the stream's snapshot and deltas, gzip-encoded or not.
func deltaPass(t *testing.T, tc *clustertest.Sim, url, token string, admin *api.Client, gz bool) {
	ctx, cancel := context.WithCancel(tc.Ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/watch", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if gz {
		req.Header.Set("Accept-Encoding", "gzip")
	} else {
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("Content-Encoding"); (got == "gzip") != gz {
		t.Fatalf("Content-Encoding %q with gzip=%v", got, gz)
	}
	wire := &countingReader{r: resp.Body}
	var body io.Reader = wire
	if gz {
		zr, err := gzip.NewReader(wire)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	events := make(chan [2]any, 16)
	go func() {
		defer close(events)
		_ = api.ReadEvents(bufio.NewReader(body), func(event string, data []byte) error {
			events <- [2]any{event, append([]byte(nil), data...)}
			return nil
		})
	}()
	next := func() (string, []byte, int64) {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			return ev[0].(string), ev[1].([]byte), wire.count()
		case <-time.After(testenv.Timeout(10 * time.Second)):
			t.Fatal("no event")
		}
		return "", nil, 0
	}
	ev, snap, snapWire := next()
	if ev != api.EventSnapshot {
		t.Fatalf("first event %s", ev)
	}
	var m api.ClusterMap
	if err := json.Unmarshal(snap, &m); err != nil {
		t.Fatal(err)
	}
	// The standby's mirrors may be a moment behind the store: follow the stream until its
	// map holds every worker running.
	for total(cells(m, "wc"))+total(cells(m, "clicks")) < 6 {
		ev, data, _ := next()
		var d api.ClusterDelta
		if ev != api.EventDelta || json.Unmarshal(data, &d) != nil {
			t.Fatalf("event %s: %s", ev, data)
		}
		m.Apply(d)
		snapWire = wire.count()
	}
	// Drain a node with workers.
	node := ""
	for _, n := range m.Nodes {
		if len(n.Cells) > 0 && !n.Draining {
			node = n.ID
			break
		}
	}
	before := wire.count()
	if err := admin.DrainNode(tc.Ctx, node, true); err != nil {
		t.Fatal(err)
	}
	var deltas, deltaBytes int
	for {
		ev, data, _ := next()
		if ev != api.EventDelta {
			t.Fatalf("event %s after the snapshot", ev)
		}
		var d api.ClusterDelta
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatal(err)
		}
		deltas++
		deltaBytes += len(data)
		if len(d.Nodes) >= len(m.Nodes) {
			t.Errorf("a delta of a drain holds %d of %d nodes", len(d.Nodes), len(m.Nodes))
		}
		m.Apply(d)
		settled := true
		for _, n := range m.Nodes {
			if n.ID == node && (!n.Draining || len(n.Cells) > 0) {
				settled = false
			}
		}
		if settled && total(cells(m, "wc"))+total(cells(m, "clicks")) == 6 {
			break
		}
	}
	t.Logf("figure: 8-node map, gzip=%v: snapshot %d bytes (%d on the wire); the drain took %d deltas, %d bytes in all (%d on the wire)",
		gz, len(snap), snapWire, deltas, deltaBytes, wire.count()-before)
	cancel()
	resp.Body.Close()
	for range events {
	}
}

// TestDCImpact: the data-center check predicts what the leader then does. With room to
// spare a data center's workers all move when it fails; in a full cluster its job moves
// only whole, finds no room, and stays.
func TestDCImpact(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(3, 1, 2) { // 3 dcs x 2 nodes x 4 slots
		tc.Node(n)
	}
	testenv.Eventually(t, "6 nodes", 5*time.Second, func() bool { return len(m.NodeEntries()) == 6 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("wc", 6)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "6 workers assigned", 5*time.Second, func() bool { return len(tc.Assignments()) == 6 })
	// impact waits until the leader's mirrors hold every assigned worker (they follow the
	// store by watches), then checks each data center's failure.
	impact := func() map[string]api.DCFailover {
		tc.Reconciled(m)
		want := len(tc.Assignments())
		out := map[string]api.DCFailover{}
		testenv.EventuallyWith(t, "the leader's mirrors up to date", 5*time.Second, func() (bool, string) {
			clear(out)
			n := 0
			for _, d := range httpapi.NewMapCache().Build(m).DCs() {
				n += d.Workers
				if d.IfFailed != nil {
					out[d.Name] = *d.IfFailed
				}
			}
			return n == want, fmt.Sprintf("%d of %d workers", n, want)
		})
		return out
	}
	inDC := func(dc string) int {
		n := 0
		for _, node := range tc.Assignments() {
			if strings.HasPrefix(node, "n-"+strings.TrimPrefix(dc, "dc-")+"-") {
				n++
			}
		}
		return n
	}
	// 24 slots, 6 workers (2 per dc): any data center's 2 find room.
	imp := impact()
	if len(imp) != 3 {
		t.Fatalf("checks for %d data centers; want 3", len(imp))
	}
	for dc, f := range imp {
		if !f.Fits || f.Workers != 2 || f.Moving != 2 || f.Waiting != 0 || f.Preempted != 0 {
			t.Errorf("%s: %+v; want its 2 workers to fit elsewhere", dc, f)
		}
	}
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCFailed, false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "dc-0's workers moved, as predicted", 5*time.Second, func() bool {
		return len(tc.Assignments()) == 6 && inDC("dc-0") == 0
	})
	if _, ok := impact()["dc-0"]; ok {
		t.Error("a failed data center still gets a failure check")
	}
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCActive, false); err != nil {
		t.Fatal(err)
	}
	// 18 workers fill 6 of every data center's 8 slots: the 4 slots free elsewhere cannot
	// take a data center's 6, and the job moves only whole.
	if _, err := desired.ScaleJob(tc.Ctx, tc.Admin, "wc", 18); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "18 workers assigned, 6 in dc-0", 5*time.Second, func() bool {
		return len(tc.Assignments()) == 18 && inDC("dc-0") == 6
	})
	f := impact()["dc-0"]
	if f.Fits || f.Workers != 6 || f.Waiting != 6 || f.Moving != 0 || len(f.Jobs) != 1 || f.Jobs[0] != (api.DCFailoverJob{Job: "wc", Waiting: 6}) {
		t.Fatalf("dc-0: %+v; want its 6 workers waiting", f)
	}
	before := tc.Assignments()
	if _, err := desired.SetDCState(tc.Ctx, tc.Admin, "dc-0", cluster.DCFailed, false); err != nil {
		t.Fatal(err)
	}
	tc.Reconciled(m)
	if after := tc.Assignments(); !maps.Equal(before, after) {
		t.Errorf("the leader moved workers the check said would wait:\nbefore %v\nafter  %v", before, after)
	}
}

type countingReader struct {
	mu sync.Mutex
	r  io.Reader
	n  int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.n += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *countingReader) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// BenchmarkWatchMap builds the console's map of 1,000 simulated nodes and 10,000 workers of
// 100 jobs (the base once per change, then one viewer's encoding).
func BenchmarkWatchMap(b *testing.B) {
	cfg := synth.Config{DCs: 4, RacksPerDC: 5, NodesPerRack: 50, Slots: 16, Memory: 64 << 30, CPU: 32000,
		Jobs: 100, Workers: 10000, Spread: []string{cluster.DomainDC, cluster.DomainRack}, Seed: 1}
	tc := clustertest.NewSim(b)
	tc.Beat = time.Second // a thousand agents beating every few milliseconds would load the loops measured
	m, _, _ := tc.Master("m1")
	for _, n := range cfg.Nodes() {
		tc.Node(n)
	}
	tenants := map[string]bool{}
	for _, spec := range cfg.JobSpecs() {
		if !tenants[spec.Tenant] {
			tenants[spec.Tenant] = true
			if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: spec.Tenant, MaxPriority: cluster.MaxPriority}}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, &spec); err != nil {
			b.Fatal(err)
		}
	}
	reported := func() int {
		n := 0
		for _, e := range m.NodeRecords() {
			n += len(e.Record.Workers)
		}
		return n
	}
	testenv.Eventually(b, "10,000 workers reported", time.Minute, func() bool { return reported() == cfg.Workers })
	b.Run("base-from-scratch", func(b *testing.B) {
		for b.Loop() {
			httpapi.NewMapCache().Build(m)
		}
	})
	// A change on one node: the cache decodes and draws that node alone.
	c := httpapi.NewMapCache()
	c.Build(m)
	node := cfg.Nodes()[0].ID
	key, _ := cluster.NodeKey(node)
	e, err := tc.Admin.Get(tc.Ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("base-one-node-changed", func(b *testing.B) {
		for b.Loop() {
			c.Touch(node) // as if its record changed
			c.Build(m)
		}
	})
	_ = e
	base := c.Build(m)
	b.Run("encode-admin", func(b *testing.B) {
		for b.Loop() {
			base.Encode(true, "", nil)
		}
	})
	b.Run("encode-tenant", func(b *testing.B) {
		for b.Loop() {
			base.Encode(false, "team-1", nil)
		}
	})
	prev := base.Encode(true, "", nil)
	b.Run("encode-admin-one-node-changed", func(b *testing.B) {
		for b.Loop() {
			prev.Forget(node)
			base.Encode(true, "", prev)
		}
	})
	b.Run("stamp", func(b *testing.B) {
		for b.Loop() {
			m.Stamp()
		}
	})
}
