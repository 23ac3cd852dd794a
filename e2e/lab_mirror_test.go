package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// mirrorJob is a mirrored job of the lab's tests: links in dc-a and dc-b (the router outside
// them, in dc-c), reading an input file that grows, writing a file sink.
type mirrorJob struct {
	name    string
	input   string
	sink    string
	workers int

	mu      sync.Mutex
	lines   int64 // written to the input so far
	stopped chan struct{}
	done    chan struct{}
}

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
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-m.stopped:
				return
			case <-tick.C:
				m.append(t, rate)
			}
		}
	}()
	t.Cleanup(func() { m.stop() })
	return m
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
	t.Helper()
	var node string
	lc.anyMaster(t, m.name+": the leading router", func(ctx context.Context, cl *api.Client) error {
		st, err := cl.Job(ctx, m.name)
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
// run in one, and nothing moves a running router back when it returns.
func routersRunning(m *mirrorJob) (bool, string) {
	rs := workerProcs(m.name + routerJobSuffix)
	if len(rs) != 2 || len(rs["0"]) != 1 || len(rs["1"]) != 1 {
		return false, fmt.Sprintf("routers %v", rs)
	}
	return true, fmt.Sprintf("routers on %s and %s", rs["0"][0].node, rs["1"][0].node)
}

const routerJobSuffix = ".router"

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

func TestAcrossHostsMirroredJob(t *testing.T) {
	lc := newLabCluster(t, plainLabSpec())
	m := startMirror(t, lc, "mirror", 100)
	waitMirrorRunning(t, m)
	if rs := workerProcs(m.name + routerJobSuffix); rs["0"][0].node[:1] == rs["1"][0].node[:1] ||
		!strings.HasPrefix(rs["0"][0].node, "c") && !strings.HasPrefix(rs["1"][0].node, "c") {
		t.Errorf("routers run on %s and %s; want them in two data centers, one of them dc-c, outside both links", rs["0"][0].node, rs["1"][0].node)
	}
	sink := watchSink(t, m.sink)
	fence := watchFence(t, m.name, fencingBound(lc.Session, labJobGrace))
	routerFence := watchFence(t, m.name+routerJobSuffix, fencingBound(lc.Session, labJobGrace))
	testenv.EventuallyWith(t, "output flowing", 90*time.Second, func() (bool, string) {
		n, _, _ := sink.delivered()
		return n > 300, fmt.Sprintf("%d delivered", n)
	})

	// Each case cuts hosts and waits for the sink to receive records made after the cut,
	// then heals them.
	cutUntilFed := func(t *testing.T, what string, hosts []*netlab.Host, wantSwitch bool) {
		t.Helper()
		ctx := context.Background()
		_, active, _ := sink.delivered()
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
		var fed time.Duration
		testenv.EventuallyWith(t, what+": the sink receiving again", 90*time.Second, func() (bool, string) {
			_, link, at := sink.delivered()
			if at.After(start.Add(lc.Session)) && (!wantSwitch || link != active) {
				fed = at.Sub(start)
				return true, ""
			}
			return false, fmt.Sprintf("last record from %s at %s", link, at.Format("15:04:05.000"))
		})
		msg := fmt.Sprintf("figure: mirrored job, %s: the sink receiving again after %s", what, fed.Round(time.Millisecond))
		if sw, ok := sink.switchedSince(start); ok && wantSwitch {
			msg += fmt.Sprintf("; switched from %s to %s after %s", sw.from, sw.to, sw.at.Sub(start).Round(time.Millisecond))
		}
		t.Log(msg)
	}
	hostsOf := func(pred func(labNode) bool) []*netlab.Host {
		var out []*netlab.Host
		for _, n := range lc.nodes {
			if pred(n) {
				out = append(out, n.host)
			}
		}
		return out
	}

	t.Run("active-link-dc-cut", func(t *testing.T) {
		_, active, _ := sink.delivered()
		cutUntilFed(t, "active link's data center "+active+" cut", hostsOf(func(n labNode) bool { return n.dc == active }), true)
		waitMirrorRunning(t, m)
	})
	t.Run("standby-link-worker-host-cut", func(t *testing.T) {
		_, active, _ := sink.delivered()
		var standby string
		for k, p := range procsOf(m.name) {
			if !strings.HasPrefix(k, active+"/") {
				standby = p.node
				break
			}
		}
		cutUntilFed(t, "a standby link worker's host "+standby+" cut", hostsOf(func(n labNode) bool { return n.id == standby }), false)
		waitMirrorRunning(t, m)
	})
	t.Run("router-host-cut", func(t *testing.T) {
		r := m.leadingRouter(t, lc)
		cutUntilFed(t, "the leading router's host "+r+" cut", hostsOf(func(n labNode) bool { return n.id == r }), false)
		waitMirrorRunning(t, m)
	})
	t.Run("router-dc-cut", func(t *testing.T) {
		r := m.leadingRouter(t, lc)
		dc := lc.node(r).dc
		cutUntilFed(t, "the leading router's data center "+dc+" cut", hostsOf(func(n labNode) bool { return n.dc == dc }), false)
		waitMirrorRunning(t, m)
	})
	t.Run("master-host-cut", func(t *testing.T) {
		ls := lc.leaders()
		if len(ls) != 1 {
			t.Fatalf("leaders %v", ls)
		}
		cutUntilFed(t, "the leading master's host cut", []*netlab.Host{lc.masterHost(ls[0])}, false)
	})
	t.Run("zk-leader-host-cut", func(t *testing.T) {
		l := lc.Ens.Leader()
		if l == nil {
			t.Fatal("no ZooKeeper leader")
		}
		cutUntilFed(t, "the ZooKeeper leader's host cut", []*netlab.Host{l.Host().(*netlab.Host)}, false)
	})

	total := m.stop()
	testenv.EventuallyWith(t, "every input line in the sink", 120*time.Second, func() (bool, string) {
		n, _, _ := sink.delivered()
		return n >= total, fmt.Sprintf("%d of %d", n, total)
	})
	sink.end()
	sink.check(t)
	fence.check(t)
	routerFence.check(t)
	gap, end := sink.longestGap()
	t.Logf("figure: mirrored job: the longest the sink received nothing: %s (until %s)", gap.Round(time.Millisecond), end.Format("15:04:05.000"))
}
