package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/multidc"
)

// mirrorJob is a mirrored job of the lab's tests: links in dc-a and dc-b (the router outside
// them, in dc-c), reading an input file that grows, writing a file sink; or (submitMirror)
// reading a JetStream stream, writing a sink of another kind.
type mirrorJob struct {
	name    string
	input   string
	sink    string
	workers int
	watch   *sinkWatch // the sink as the test sees it
	written inputLog   // when its input file's lines were written (startMirror's)

	mu      sync.Mutex
	lines   int64 // written to the input so far
	stopped chan struct{}
	done    chan struct{}
}

// inputEvery is how often the tests add to a mirrored job's input: often, so that a sink's
// figures (output back after a cut, the longest gap) are not dominated by the input's pauses.
const inputEvery = 100 * time.Millisecond

// startMirror writes the first lines of its input, submits the job and keeps appending lines
// at rate per second until stopped (Close).
func startMirror(t *testing.T, lc *labCluster, name string, rate int) *mirrorJob {
	t.Helper()
	dir := sharedDir(t, t.TempDir()) // the workers, as their tenant's uid, read the input
	// The sink below the cluster's sink dir, in the tenant's part of it.
	m := &mirrorJob{name: name, input: filepath.Join(dir, "input.txt"), sink: lc.SinkPath("e2e", name+".jsonl"), workers: 2,
		stopped: make(chan struct{}), done: make(chan struct{})}
	m.append(t, rate)
	spec := fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s]
links: [dc-a, dc-b]
output: file://%s
gracePeriod: 2s
`, name, m.workers, m.input, m.sink)
	lc.submit(t, []byte(spec))
	go func() {
		defer close(m.done)
		tick := time.NewTicker(inputEvery)
		defer tick.Stop()
		for {
			select {
			case <-m.stopped:
				return
			case <-tick.C:
				m.append(t, rate*int(inputEvery)/int(time.Second))
			}
		}
	}()
	t.Cleanup(func() { m.stop() })
	return m
}

// submitMirror submits a mirrored job reading input (a JetStream stream the test feeds,
// jsInput) and writing output, whose sink the test follows with watch.
func submitMirror(t *testing.T, lc *labCluster, name, input, output string) *mirrorJob {
	m := &mirrorJob{name: name, input: input, workers: 2, stopped: make(chan struct{}), done: make(chan struct{})}
	close(m.stopped)
	close(m.done)
	spec := fmt.Sprintf(`name: %s
tenant: e2e
workers: %d
resources: {memory: 64Mi, cpu: 0.1}
command: [stormdock, worker, wordcount, --input, %s]
links: [dc-a, dc-b]
output: %s
gracePeriod: 2s
`, name, m.workers, input, output)
	lc.submit(t, []byte(spec))
	return m
}

// jsInput feeds a JetStream stream, the input of mirrored jobs (stream sequence N is the
// line of offset N-1), at a rate per second until stopped.
type jsInput struct {
	js      jetstream.JetStream
	subject string
	written inputLog
	mu      sync.Mutex
	lines   int64
	stopped chan struct{}
	done    chan struct{}
}

func startJSInput(t *testing.T, srv *natstest.Server, stream string, rate int) *jsInput {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	in := &jsInput{js: js, subject: strings.ToLower(stream), stopped: make(chan struct{}), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{in.subject}}); err != nil {
		t.Fatal(err)
	}
	in.publish(t, rate)
	go func() {
		defer close(in.done)
		tick := time.NewTicker(inputEvery)
		defer tick.Stop()
		for {
			select {
			case <-in.stopped:
				return
			case <-tick.C:
				in.publish(t, rate*int(inputEvery)/int(time.Second))
			}
		}
	}()
	t.Cleanup(func() { in.stop() })
	return in
}

// publish adds n lines, all acknowledged by the server before it returns: the control host
// is never cut, and neither is the server's host.
func (in *jsInput) publish(t testing.TB, n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	var acks []jetstream.PubAckFuture
	in.written.wrote(in.lines, time.Now())
	for i := range n {
		f, err := in.js.PublishAsync(in.subject, fmt.Appendf(nil, "line %d of the replayable input", in.lines+int64(i)))
		if err != nil {
			t.Errorf("input: %v", err)
			return
		}
		acks = append(acks, f)
	}
	timeout := time.After(testenv.Timeout(30 * time.Second))
	for _, f := range acks {
		select {
		case <-f.Ok():
			in.lines++
		case err := <-f.Err():
			t.Errorf("input: %v", err)
			return
		case <-timeout:
			t.Errorf("input: no acknowledgement in 30s")
			return
		}
	}
}

// stop stops publishing and returns how many lines the stream holds.
func (in *jsInput) stop() int64 {
	select {
	case <-in.stopped:
	default:
		close(in.stopped)
	}
	<-in.done
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.lines
}

// append adds n lines to the input, which the link workers follow.
func (m *mirrorJob) append(t testing.TB, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := os.OpenFile(m.input, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("input: %v", err)
		return
	}
	defer f.Close()
	var b strings.Builder
	m.written.wrote(m.lines, time.Now())
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "line %d of the replayable input\n", m.lines)
		m.lines++
	}
	if _, err := f.WriteString(b.String()); err != nil {
		t.Errorf("input: %v", err)
	}
}

// stop stops appending and returns how many lines the input holds.
func (m *mirrorJob) stop() int64 {
	select {
	case <-m.stopped:
	default:
		close(m.stopped)
	}
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lines
}

// router returns the node the job's router runs on (from /proc), or "".
// leadingRouter is the node of the router that writes the sink, as the masters report it
// (job status, sink.leader): the routers elect it among themselves.
func (m *mirrorJob) leadingRouter(t testing.TB, lc *labCluster) string {
	return leadingRouter(t, lc, m.name)
}

func leadingRouter(t testing.TB, lc *labCluster, job string) string {
	t.Helper()
	var node string
	lc.anyMaster(t, job+": the leading router", func(ctx context.Context, cl *api.Client) error {
		st, err := cl.Job(ctx, job)
		if err != nil {
			return err
		}
		if st.Sink == nil || st.Sink.Leader == "" || !st.Sink.Fed {
			return fmt.Errorf("sink %+v", st.Sink)
		}
		u, err := url.Parse(st.Sink.Leader)
		if err != nil {
			return err
		}
		for _, n := range lc.nodes {
			if n.host.IP() == u.Hostname() {
				node = n.id
				return nil
			}
		}
		return fmt.Errorf("leading router %s: on no node of the lab", st.Sink.Leader)
	})
	return node
}

// routersRunning reports whether the mirrored job's routers (a leader and a standby) run,
// once each. Where they run is the test's to check: after a data center's loss both may
// run in one until another data center has room (routersApart).
func routersRunning(m *mirrorJob) (bool, string) {
	rs := workerProcs(m.name + routerJobSuffix)
	if len(rs) != 2 || len(rs["0"]) != 1 || len(rs["1"]) != 1 {
		return false, fmt.Sprintf("routers %v", rs)
	}
	return true, fmt.Sprintf("routers on %s and %s", rs["0"][0].node, rs["1"][0].node)
}

const routerJobSuffix = ".router"

// routersApart reports whether the job's two routers run in two data centers (a node's id
// starts with its data center's letter).
func routersApart(m *mirrorJob) (bool, string) {
	if ok, why := routersRunning(m); !ok {
		return false, why
	}
	rs := workerProcs(m.name + routerJobSuffix)
	a, b := rs["0"][0].node, rs["1"][0].node
	return a[:1] != b[:1], fmt.Sprintf("%s: routers on %s and %s", m.name, a, b)
}

// waitMirrorRunning waits until every link worker and both routers run, once each, each
// link's workers in their link's data center and the routers in two data centers.
func waitMirrorRunning(t testing.TB, m *mirrorJob) {
	t.Helper()
	testenv.EventuallyWith(t, m.name+": link workers and router running", 90*time.Second, func() (bool, string) {
		ps, all := procsOf(m.name), workerProcs(m.name)
		if len(ps) != 2*m.workers || len(all) != 2*m.workers {
			return false, fmt.Sprintf("%d link workers (%d with a process)", len(ps), len(all))
		}
		if ok, why := routersRunning(m); !ok {
			return false, why
		}
		for k, p := range ps {
			link, _, _ := strings.Cut(k, "/")
			if !strings.HasPrefix(p.node, strings.TrimPrefix(link, "dc-")) {
				return false, fmt.Sprintf("worker %s runs on %s, outside its link's data center", k, p.node)
			}
		}
		return true, ""
	})
}

// TestAcrossHostsMirroredJob runs three mirrored jobs across the lab's hosts: one reading a
// growing file into a file sink; two reading a JetStream stream on a host of its own, one
// into PostgreSQL on a host of its own, one into a JetStream subject. Through cuts of the
// active link's data center, a standby link worker's host, a leading router's host and a
// leading router's data center, the leading master's host and the ZooKeeper leader's host,
// each healed, every sink holds every offset exactly once and in order all the time (the
// table and the subject read from their servers, not through stormdock), no write of a
// fenced router is kept (the epochs show it), and the routers end in different data
// centers.
func TestAcrossHostsMirroredJob(t *testing.T) {
	spec := plainLabSpec()
	// Three mirrored jobs: 12 link workers (6 a data center, which they cannot leave) and 6
	// routers, which must find room in two data centers when the third is cut.
	spec.slots = 6
	lc := newLabCluster(t, spec)
	pg := pgtest.Start(t, pgtest.Options{Host: lc.lab.AddHosts(t, "pg")[0], Dial: lc.lab.DialContext})
	ns := natstest.Start(t, natstest.Options{Host: lc.lab.AddHosts(t, "nats")[0], Dial: lc.lab.DialContext})
	in := startJSInput(t, ns, "IN", 100)
	m := startMirror(t, lc, "mirror", 100)
	mpg := submitMirror(t, lc, "mirrorpg", ns.URL()+"/IN", fmt.Sprintf("postgres://%s@%s/postgres?table=mirrorpg&sslmode=disable", pgtest.Superuser, pg.Addr()))
	mjs := submitMirror(t, lc, "mirrorjs", ns.URL()+"/IN", ns.URL()+"/mirrorjs.out")
	jobs := []*mirrorJob{m, mpg, mjs}
	kinds := map[*mirrorJob]string{m: "file", mpg: "postgres", mjs: "jetstream"}
	for _, j := range jobs {
		waitMirrorRunning(t, j)
		if ok, why := routersApart(j); !ok || !strings.Contains(why, " c") {
			t.Errorf("%s; want them in two data centers, one of them dc-c, outside both links", why)
		}
	}
	m.watch = watchSink(t, m.sink)
	mpg.watch = watchPG(t, pg, "postgres", "mirrorpg")
	mjs.watch = watchJetStream(t, ns, "mirrorjs.out")
	var fences []*fenceWatch
	for _, j := range jobs {
		fences = append(fences, watchFence(t, j.name, fencingBound(lc.Session, labJobGrace)), watchFence(t, j.name+routerJobSuffix, fencingBound(lc.Session, labJobGrace)))
	}
	testenv.EventuallyWith(t, "output flowing", 90*time.Second, func() (bool, string) {
		var why []string
		for _, j := range jobs {
			if n, _, _ := j.watch.delivered(); n <= 300 {
				why = append(why, fmt.Sprintf("%s: %d delivered", j.name, n))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})

	// Each case cuts hosts and waits until every sink receives records made after the cut
	// (from another link for a job whose active link's data center is cut), then heals.
	cutUntilFed := func(t *testing.T, what string, hosts []*netlab.Host) {
		t.Helper()
		ctx := context.Background()
		cutDCs := map[string]bool{}
		for _, n := range lc.nodes {
			if slices.Contains(hosts, n.host) && len(hostsOfDC(lc, n.dc, hosts...)) == 0 {
				cutDCs[n.dc] = true
			}
		}
		actives := map[*mirrorJob]string{}
		for _, j := range jobs {
			_, actives[j], _ = j.watch.delivered()
		}
		start := time.Now()
		for i, h := range hosts {
			if err := h.Cut(ctx, slices.Delete(slices.Clone(hosts), i, i+1)...); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			for _, h := range hosts {
				if err := h.Heal(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
		fed := map[*mirrorJob]time.Time{}
		defer func() {
			if t.Failed() {
				for _, j := range jobs {
					if fed[j].IsZero() {
						diagnoseRouters(t, lc, j.name)
					}
				}
			}
		}()
		testenv.EventuallyWith(t, what+": every sink receiving again", 90*time.Second, func() (bool, string) {
			var why []string
			for _, j := range jobs {
				_, link, at := j.watch.delivered()
				if at.After(start.Add(lc.Session)) && (!cutDCs[actives[j]] || link != actives[j]) {
					fed[j] = at
					continue
				}
				why = append(why, fmt.Sprintf("%s: last record from %s at %s", j.name, link, at.Format("15:04:05.000")))
			}
			return len(why) == 0, strings.Join(why, "; ")
		})
		for _, j := range jobs {
			msg := fmt.Sprintf("figure: mirrored job %s (%s sink), %s:", j.name, kinds[j], what)
			if back, ok := j.watch.resumedAfter(start, fed[j]); ok {
				msg += fmt.Sprintf(" output back after %s", back.Round(time.Millisecond))
			}
			if sw, ok := j.watch.switchedSince(start); ok && cutDCs[actives[j]] {
				msg += fmt.Sprintf("; sink switched from %s to %s after %s", sw.from, sw.to, sw.at.Sub(start).Round(time.Millisecond))
			}
			t.Log(msg)
		}
	}
	waitAll := func(t *testing.T) {
		for _, j := range jobs {
			waitMirrorRunning(t, j)
		}
	}

	t.Run("active-link-dc-cut", func(t *testing.T) {
		_, active, _ := mpg.watch.delivered()
		cutUntilFed(t, "the active link's data center "+active+" cut", hostsOfDC(lc, active))
		waitAll(t)
	})
	t.Run("standby-link-worker-host-cut", func(t *testing.T) {
		_, active, _ := mpg.watch.delivered()
		var standby string
		for k, p := range procsOf(mpg.name) {
			if !strings.HasPrefix(k, active+"/") {
				standby = p.node
				break
			}
		}
		if standby == "" {
			t.Fatalf("no standby link worker of %s runs (active link %q)", mpg.name, active)
		}
		cutUntilFed(t, "a standby link worker's host "+standby+" cut", []*netlab.Host{lc.node(standby).host})
		waitAll(t)
	})
	t.Run("router-host-cut", func(t *testing.T) {
		r := mpg.leadingRouter(t, lc)
		cutUntilFed(t, "the leading router's host "+r+" cut (mirrorpg's)", []*netlab.Host{lc.node(r).host})
		waitAll(t)
	})
	t.Run("router-dc-cut", func(t *testing.T) {
		r := mjs.leadingRouter(t, lc)
		dc := lc.node(r).dc
		cutUntilFed(t, "the leading router's data center "+dc+" cut (mirrorjs's)", hostsOfDC(lc, dc))
		waitAll(t)
	})
	t.Run("master-host-cut", func(t *testing.T) {
		ls := lc.leaders()
		if len(ls) != 1 {
			t.Fatalf("leaders %v", ls)
		}
		cutUntilFed(t, "the leading master's host cut", []*netlab.Host{lc.masterHost(ls[0])})
	})
	t.Run("zk-leader-host-cut", func(t *testing.T) {
		l := lc.Ens.Leader()
		if l == nil {
			t.Fatal("no ZooKeeper leader")
		}
		cutUntilFed(t, "the ZooKeeper leader's host cut", []*netlab.Host{l.Host().(*netlab.Host)})
	})

	totals := map[*mirrorJob]int64{m: m.stop()}
	totals[mpg] = in.stop()
	totals[mjs] = totals[mpg]
	testenv.EventuallyWith(t, "every input line in every sink", 120*time.Second, func() (bool, string) {
		var why []string
		for _, j := range jobs {
			if n, _, _ := j.watch.delivered(); n < totals[j] {
				why = append(why, fmt.Sprintf("%s: %d of %d", j.name, n, totals[j]))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
	testenv.EventuallyWith(t, "every job's routers in two data centers", 90*time.Second, func() (bool, string) {
		for _, j := range jobs {
			if ok, why := routersApart(j); !ok {
				return false, why
			}
		}
		return true, ""
	})
	for _, j := range jobs {
		j.watch.end()
		j.watch.check(t)
		gap, end := j.watch.longestGap()
		written := &in.written
		if j == m {
			written = &m.written
		}
		t.Logf("figure: mirrored job %s (%s sink): the longest the sink received nothing: %s (until %s); %s; fencing epoch at the end %d",
			j.name, kinds[j], gap.Round(time.Millisecond), end.Format("15:04:05.000"), stallFigure(j.watch, written), j.watch.epochs())
	}
	for _, f := range fences {
		f.check(t)
	}
	// The router cuts made the fencing sinks change hands on evidence at least once.
	for _, j := range []*mirrorJob{mpg, mjs} {
		if e := j.watch.epochs(); e < 2 {
			t.Errorf("%s: the sink's fencing epoch is %d after the router cuts: no router took it over", j.name, e)
		}
	}
}

// diagnoseRouters logs what a mirrored job's routers last recorded, and where they run.
func diagnoseRouters(t *testing.T, lc *labCluster, job string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rec, ok, err := multidc.ReadRecord(ctx, lc.Store, job); err == nil && ok {
		b, _ := json.Marshal(rec.Status)
		t.Logf("%s: the routers' record: %s", job, b)
	}
	for k, ps := range workerProcs(job + routerJobSuffix) {
		for _, p := range ps {
			t.Logf("%s: router %s on %s (pid %d)", job, k, p.node, p.pid)
		}
	}
}

// hostsOfDC returns the hosts of a data center's nodes, but those in except.
func hostsOfDC(lc *labCluster, dc string, except ...*netlab.Host) []*netlab.Host {
	var out []*netlab.Host
	for _, n := range lc.nodes {
		if n.dc == dc && !slices.Contains(except, n.host) {
			out = append(out, n.host)
		}
	}
	return out
}
