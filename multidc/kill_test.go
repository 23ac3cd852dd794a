package multidc

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// linkProcs runs every worker of every link as a child process.
type linkProcs struct {
	t       *testing.T
	router  string
	fixture string
	rate    float64
	epoch   time.Time
	workers int
	endFile string
	procs   map[string][]*child
}

// endInput ends the input after the offset now due plus a margin, and returns its length.
func (lp *linkProcs) endInput(max int) int {
	n := min(max, int(time.Since(lp.epoch).Seconds()*lp.rate)+int(lp.rate/2))
	if err := os.WriteFile(lp.endFile, []byte(strconv.Itoa(n)), 0o644); err != nil {
		lp.t.Fatal(err)
	}
	return n
}

func (lp *linkProcs) start(link string, worker int) {
	c := startChild(lp.t, fmt.Sprintf("%s/%d", link, worker),
		envChild+"=link", envRouter+"="+lp.router, envLink+"="+link,
		envWorker+"="+strconv.Itoa(worker), envWorkers+"="+strconv.Itoa(lp.workers),
		envFixture+"="+lp.fixture, envRate+"="+strconv.FormatFloat(lp.rate, 'f', -1, 64),
		envEpoch+"="+strconv.FormatInt(lp.epoch.UnixNano(), 10), envBeat+"=200ms", envEnd+"="+lp.endFile)
	if lp.procs[link] == nil {
		lp.procs[link] = make([]*child, lp.workers)
	}
	lp.procs[link][worker] = c
}

func (lp *linkProcs) stopAll() {
	for _, cs := range lp.procs {
		for _, c := range cs {
			c.stop(5 * time.Second)
		}
	}
}

// checkAlive fails the test if a link child died by itself (a protocol error shows here).
func (lp *linkProcs) checkAlive() {
	for l, cs := range lp.procs {
		for i, c := range cs {
			if c.exited() && c.cmd.ProcessState != nil && !killedBySignal(c) {
				lp.t.Fatalf("link %s worker %d exited by itself: %s\n%s", l, i, c.cmd.ProcessState, c.out.String())
			}
		}
	}
}

func killedBySignal(c *child) bool {
	return strings.Contains(c.cmd.ProcessState.String(), "signal")
}

// TestLinkKillFailover kills the active link ten times (all its workers, or one of them)
// at random moments, restarting the killed workers as an agent would, while three links
// of two worker processes each feed a router with a file sink and the embedded store. The
// sink must hold offsets 0..N-1 exactly once, in order. It reports the failover latency:
// from the kill to the first record of another link at the sink.
func TestLinkKillFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes for ~15 s")
	}
	_, store := embeddedStore(t)
	runLinkKillTest(t, store, 10)
}

// TestLinkKillFailoverZK is the same against the real ZooKeeper, with three kills.
func TestLinkKillFailoverZK(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes")
	}
	addr := testenv.ZKAddr(t)
	chroot := fmt.Sprintf("/stormdock-test/multidc-%d-%d", os.Getpid(), time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := coord.Open(ctx, "zk://"+addr+chroot, coord.Options{SessionTimeout: 10 * time.Second, Logger: testenv.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() }) // after the router stops: cleanups run last-in first-out
	runLinkKillTest(t, store, 3)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	rec, ok, err := ReadRecord(rctx, store, "wordcount")
	if err != nil || !ok || rec.Failovers < 3 {
		t.Fatalf("router record in ZooKeeper: %+v %v %v", rec, ok, err)
	}
}

func runLinkKillTest(t *testing.T, store coord.Store, kills int) {
	links := []string{"dc-a", "dc-b", "dc-c"}
	const rate = 2500.0          // input records per second
	fixtureLen := int(rate * 60) // the input ends after the kills (endInput): this is a bound
	// MULTIDC_TEST_CLOSE_GRACE=-1s measures failover by heartbeat timeout alone.
	closeGrace, _ := time.ParseDuration(os.Getenv("MULTIDC_TEST_CLOSE_GRACE"))
	tr := startRouter(t, store, links, func(c *Config) {
		c.HeartbeatTimeout = 600 * time.Millisecond
		c.CloseGrace = closeGrace
	})
	waitReady(t, tr.URL())
	fixture, lines := writeFixture(t, fixtureLen)
	lp := &linkProcs{t: t, router: tr.URL(), fixture: fixture, rate: rate, epoch: time.Now().Add(300 * time.Millisecond),
		workers: 2, endFile: filepath.Join(t.TempDir(), "end"), procs: map[string][]*child{}}
	for _, l := range links {
		for w := range lp.workers {
			lp.start(l, w)
		}
	}
	defer lp.stopAll()
	testenv.Eventually(t, "delivery", 10*time.Second, func() bool { st, _ := tr.Status(); return st.Delivered > 0 })

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d, input at %.0f records/s, %d kills", seed, rate, kills)
	type kill struct {
		at     time.Time
		victim string
		all    bool
		offset int64
	}
	var done []kill
	for k := range kills {
		time.Sleep(200*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond) // a random moment to kill at: the chaos under test
		lp.checkAlive()
		st, _ := tr.Status()
		if st.Delivered >= int64(fixtureLen-1) {
			t.Fatalf("kill %d: the fixture is exhausted: the machine is too slow for this test", k)
		}
		victim := st.Active
		ws := []int{rng.IntN(lp.workers)}
		if k%2 == 0 {
			ws = []int{0, 1} // the whole data center
		}
		at := time.Now()
		for _, w := range ws {
			lp.procs[victim][w].kill()
		}
		done = append(done, kill{at: at, victim: victim, all: len(ws) == lp.workers, offset: st.Delivered})
		testenv.Eventually(t, "failover away from "+victim, 10*time.Second, func() bool { st, _ := tr.Status(); return st.Active != victim })
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random time down: the chaos under test
		for _, w := range ws {
			lp.start(victim, w)
		}
	}
	n := lp.endInput(fixtureLen)
	lines = lines[:n]
	testenv.Eventually(t, "every record delivered", 60*time.Second, func() bool {
		lp.checkAlive()
		st, _ := tr.Status()
		return st.Delivered == int64(n-1)
	})
	st, _ := tr.Status()
	lp.stopAll()
	tr.stop(t)

	perLink := checkSinkFile(t, tr.path, lines)
	if st.Failovers < int64(kills) {
		t.Fatalf("%d failovers for %d kills", st.Failovers, kills)
	}
	var lat []time.Duration
	for i, k := range done {
		w, ok := tr.sink.firstWriteAfter(k.at, k.victim)
		if !ok {
			t.Fatalf("kill %d of %s: no record of another link reached the sink afterwards", i, k.victim)
		}
		d := w.at.Sub(k.at)
		lat = append(lat, d)
		t.Logf("kill %2d: %s (all workers: %v) at offset %d -> first record of %s (offset %d) at the sink after %v",
			i+1, k.victim, k.all, k.offset, w.link, w.first, d.Round(time.Millisecond))
	}
	slices.Sort(lat)
	t.Logf("FIGURES: %d records, %d kills, %d failovers, lost 0, duplicated 0; records per link %v", n, kills, st.Failovers, perLink)
	grace := tr.cfg.CloseGrace.String()
	if tr.cfg.CloseGrace > time.Hour {
		grace = "off"
	}
	t.Logf("FIGURES: failover latency (kill -> first record of the new link at the sink, heartbeat 200ms, timeout 600ms, close grace %s): min %v median %v max %v",
		grace, lat[0].Round(time.Millisecond), lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func countLines(path string) int {
	b, _ := os.ReadFile(path)
	return bytes.Count(b, []byte("\n"))
}

// TestRouterKillRestart SIGKILLs the router process at random moments while two links of
// two worker processes feed it, and restarts it on the same port, store (file://, the
// embedded store persisted to a file) and sink file. The checkpoint interval is long (700
// ms), so at every kill the file is ahead of the checkpoint: exactly once holds only if
// the restarted router recovers from the file.
func TestRouterKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes")
	}
	dir := t.TempDir()
	storeURL := "file://" + filepath.Join(dir, "store.json")
	sinkPath := filepath.Join(testSinkBase(t), "sink.jsonl")
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	url := "http://" + listen
	var routers []*child
	startRouterChild := func() *child {
		c := startChild(t, "router", envChild+"=router", envStore+"="+storeURL, envSink+"="+sinkPath,
			envListen+"="+listen, envLinks+"=dc-a,dc-b", envTimeout+"=600ms", envCkptEvery+"=700ms")
		routers = append(routers, c)
		return c
	}
	router := startRouterChild()
	const rate, kills = 3000.0, 4
	fixtureLen := int(rate * 60) // the input ends after the kills (endInput): this is a bound
	fixture, lines := writeFixture(t, fixtureLen)
	lp := &linkProcs{t: t, router: url, fixture: fixture, rate: rate, epoch: time.Now().Add(500 * time.Millisecond),
		workers: 2, endFile: filepath.Join(dir, "end"), procs: map[string][]*child{}}
	for _, l := range []string{"dc-a", "dc-b"} {
		for w := range lp.workers {
			lp.start(l, w)
		}
	}
	defer lp.stopAll()
	cl, _ := NewClient(url)
	ctx := context.Background()
	testenv.Eventually(t, "delivery", 15*time.Second, func() bool { st, err := cl.Status(ctx); return err == nil && st.Delivered > 0 })
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	for k := range kills {
		time.Sleep(400*time.Millisecond + time.Duration(rng.IntN(600))*time.Millisecond) // a random moment to kill at: the chaos under test
		lp.checkAlive()
		if router.exited() {
			t.Fatalf("router exited by itself:\n%s", router.out.String())
		}
		router.kill()
		at := countLines(sinkPath)
		if at >= fixtureLen {
			t.Fatalf("kill %d: the fixture is exhausted: the machine is too slow for this test", k)
		}
		t.Logf("router kill %d with %d lines in the sink", k+1, at)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random time down: the chaos under test
		router = startRouterChild()
	}
	n := lp.endInput(fixtureLen)
	lines = lines[:n]
	defer func() {
		if t.Failed() {
			t.Logf("last router's output:\n%s", router.out.String())
		}
	}()
	testenv.Eventually(t, "every record delivered", 60*time.Second, func() bool {
		lp.checkAlive()
		st, err := cl.Status(ctx)
		return err == nil && st.Delivered == int64(n-1)
	})
	lp.stopAll()
	router.stop(10 * time.Second)
	if !router.exited() || !router.cmd.ProcessState.Success() {
		t.Fatalf("router did not stop cleanly: %v\n%s", router.cmd.ProcessState, router.out.String())
	}
	checkSinkFile(t, sinkPath, lines)
	ahead := 0
	for _, r := range routers[1:] {
		if strings.Contains(r.out.String(), "sink is ahead of the checkpoint") {
			ahead++
		}
	}
	if ahead == 0 {
		t.Fatalf("no restarted router found the file ahead of the checkpoint: the test did not exercise file recovery")
	}
	t.Logf("FIGURES: %d router kills, %d restarts recovered from the file ahead of the checkpoint; %d records, lost 0, duplicated 0", kills, ahead, n)

	s, err := coord.Open(ctx, storeURL, coord.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec, ok, err := ReadRecord(ctx, s, "wordcount")
	if err != nil || !ok || rec.Checkpoint != int64(n-1) {
		t.Fatalf("final record: %+v %v %v", rec, ok, err)
	}
}
