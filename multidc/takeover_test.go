package multidc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestRouterTakesOverOnEvidence runs the two routers of a job writing PostgreSQL as
// processes, on ZooKeeper with a long session (10 s), and stops the leader as a cut host
// would look (SIGSTOP: it answers nothing, its session lives on), later SIGKILLs the next
// leader (its port refuses). Each time the standby takes the sink over on that evidence,
// while the old leader's session, and its candidate entry in the election, still live; the
// old leader, let go on, writes nothing (its epoch is old) and stops. The table, read with
// SQL, holds every offset once, in order, the epochs never going back.
func TestRouterTakesOverOnEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("stops processes")
	}
	srv := pgtest.Shared(t)
	db := srv.NewDB(t)
	sinkURL := pgURL(srv.Addr(), db, "out")
	storeURL := "zk://" + testenv.ZKAddr(t) + fmt.Sprintf("/stormdock-test/takeover-%d-%d", os.Getpid(), time.Now().UnixNano())
	ctx := context.Background()
	store, err := coord.Open(ctx, storeURL, coord.Options{SessionTimeout: 10 * time.Second, Logger: testenv.Logger(t, slog.LevelWarn)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })

	listens := []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))), net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))}
	start := func(i int) *child {
		return startChild(t, fmt.Sprintf("router %d", i), envChild+"=router", envStore+"="+storeURL, envSinkURL+"="+sinkURL,
			envListen+"="+listens[i], envLinks+"=dc-a,dc-b", envTimeout+"=400ms", envCkptEvery+"=100ms", envSession+"=10s")
	}
	routers := []*child{start(0), start(1)}
	defer func() {
		if t.Failed() {
			for i, r := range routers {
				t.Logf("router %d (%s):\n%s", i, listens[i%2], r.out.String())
			}
		}
	}()
	const rate = 400.0
	n := int(rate * 40) // a bound: the test ends the input once it is done
	_, lines := writeFixture(t, n)
	urls := "http://" + listens[0] + ",http://" + listens[1]
	stops := startSenders(t, urls, []string{"dc-a", "dc-b"}, 2, lines, rate, time.Now())

	// leader returns the index of the router that leads, and its status.
	leader := func(what string) (int, Status) {
		var idx int
		var st Status
		testenv.EventuallyWith(t, what, 30*time.Second, func() (bool, string) {
			var why []string
			for i, l := range listens {
				cl, _ := NewClient("http://" + l)
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				s, err := cl.Status(cctx)
				cancel()
				if err == nil && s.Active != "" {
					idx, st = i, s
					return true, ""
				}
				why = append(why, fmt.Sprintf("%s: %v", l, err))
			}
			return false, strings.Join(why, "; ")
		})
		return idx, st
	}
	// candidates lists the router election's candidate entries: a session's entry goes
	// only when the session ends.
	candidates := func() int {
		ekey, _ := cluster.RouterElectionKey("wordcount")
		cs, err := store.Children(ctx, ekey)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs)
	}
	delivered := func(i int) int64 {
		cl, _ := NewClient("http://" + listens[i])
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := cl.Status(cctx)
		if err != nil {
			return -1
		}
		return st.Delivered
	}

	first, st := leader("a router leading")
	testenv.Eventually(t, "output flowing", 30*time.Second, func() bool { return delivered(first) > 200 })
	if st.Epoch != 1 {
		t.Errorf("the first leader holds epoch %d, want 1", st.Epoch)
	}

	// 1. The leader stops answering, its session alive.
	stopped := routers[first]
	at := delivered(first)
	cut := time.Now()
	testenv.Stop(t, stopped.cmd.Process.Pid)
	next, st := leader("the standby leading")
	if next == first {
		t.Fatalf("router %d leads again", first)
	}
	testenv.Eventually(t, "output flowing from the new leader", 30*time.Second, func() bool { return delivered(next) > at+100 })
	resumed := firstWritten(t, srv, db, 2).Sub(cut)
	if c := candidates(); c != 2 {
		t.Errorf("%d candidates in the election when output resumed; want 2: the stopped leader's session must still live (the takeover must not wait for it)", c)
	}
	if st.Leading != LeadEvidence || st.Epoch != 2 {
		t.Errorf("the new leader: leading %q, epoch %d; want %q and 2", st.Leading, st.Epoch, LeadEvidence)
	}
	t.Logf("figure: leader stopped (SIGSTOP, session alive): the first row from the standby %s after", resumed.Round(time.Millisecond))

	// The old leader, let go on, writes nothing more and stops.
	if err := stopped.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the fenced-off router stopping", 30*time.Second, func() (bool, string) {
		return stopped.exited(), "running"
	})
	if out := stopped.out.String(); !strings.Contains(out, "fenced off") && !strings.Contains(out, "conflict") {
		t.Errorf("the old leader stopped without saying it was fenced off:\n%s", out)
	}
	// It comes back (as its agent would start it) and stands by.
	routers[first] = start(first)
	testenv.Eventually(t, "the restarted router standing by", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + listens[first] + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})

	// 2. The new leader is killed: its port refuses.
	at = delivered(next)
	routers[next].kill()
	cut = time.Now()
	third, st := leader("the restarted router leading")
	if third != first {
		t.Fatalf("router %d leads, want the restarted router %d", third, first)
	}
	testenv.Eventually(t, "output flowing again", 30*time.Second, func() bool { return delivered(third) > at+100 })
	resumed = firstWritten(t, srv, db, 3).Sub(cut)
	if st.Leading != LeadEvidence || st.Epoch != 3 {
		t.Errorf("the third leader: leading %q, epoch %d; want %q and 3", st.Leading, st.Epoch, LeadEvidence)
	}
	t.Logf("figure: leader killed (SIGKILL, session alive): the first row from the standby %s after", resumed.Round(time.Millisecond))

	// Every line delivered once, as the table says.
	total := min(n, int(time.Since(cut).Seconds()*rate))
	testenv.Eventually(t, "the input delivered", 60*time.Second, func() bool { return delivered(third) >= int64(total) })
	for _, stop := range stops {
		stop()
	}
	got := delivered(third) + 1
	routers[third].stop(10 * time.Second)
	rows := pgRows(t, srv, db, "out")
	if int64(len(rows)) < got {
		t.Errorf("the table holds %d rows; the router said %d were delivered", len(rows), got)
	}
	checkPGRows(t, rows, int64(len(rows)))
	if len(rows) > 0 && rows[len(rows)-1].epoch != 3 {
		t.Errorf("the last rows were written at epoch %d, want 3", rows[len(rows)-1].epoch)
	}
	if os.Getenv("MULTIDC_TEST_SHOW") != "" {
		for i, r := range routers {
			t.Logf("router %d:\n%s", i, r.out.String())
		}
	}
}

// firstWritten is when the first row of an epoch was written, by the database's clock (this
// machine's).
func firstWritten(t testing.TB, srv *pgtest.Server, db string, epoch int64) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := srv.Admin(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var at time.Time
	if err := c.QueryRow(ctx, `SELECT min(written) FROM out WHERE epoch = $1`, epoch).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// switchProxy forwards TCP connections to target while up; down, it closes every connection
// it takes at once (a database that refuses).
type switchProxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool
}

func newSwitchProxy(t testing.TB, target string) *switchProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.up.Load() {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

// A router whose fencing sink cannot be opened keeps trying and says why in its record
// (which `job status` shows): the database unreachable, then a table of another shape;
// once the database answers with a table it can write, it leads and the reason goes.
func TestRouterSaysWhyTheSinkIsNotFed(t *testing.T) {
	srv := pgtest.Shared(t)
	db := srv.NewDB(t)
	proxy := newSwitchProxy(t, srv.Addr())
	_, store := embeddedStore(t)
	tr := startRouter(t, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.Sink, c.TakeOver = nil, true
		c.OpenSink = func(ctx context.Context, _ *SinkEvidence) (Sink, error) {
			return OpenSink(ctx, pgURL(proxy.ln.Addr().String(), db, "out"), SinkOptions{Job: "wordcount", Logger: c.Logger})
		}
	})
	problem := func(want string) {
		t.Helper()
		testenv.EventuallyWith(t, "the record saying "+want, 30*time.Second, func() (bool, string) {
			rec, ok, err := ReadRecord(context.Background(), store, "wordcount")
			return ok && err == nil && strings.Contains(rec.SinkError, want) && rec.SinkErrorSince != nil, fmt.Sprintf("%+v %v", rec.Status, err)
		})
	}
	problem("cannot connect")
	srv.Exec(t, db, `CREATE TABLE out ("offset" bigint PRIMARY KEY, link text, epoch int, record jsonb)`)
	proxy.up.Store(true)
	problem(`column "epoch" is integer, not bigint; it must look like CREATE TABLE "out"`)
	if _, err := tr.Status(); err == nil {
		t.Fatal("the router is ready with a sink it cannot open")
	}
	srv.Exec(t, db, `DROP TABLE out`)
	waitReady(t, tr.URL())
	var body strings.Builder
	for off := range 5 {
		fmt.Fprintf(&body, "{\"offset\":%d,\"link\":\"dc-a\",\"worker\":0,\"workers\":1}\n", off)
	}
	testenv.EventuallyWith(t, "5 records delivered", 20*time.Second, func() (bool, string) {
		post(t, tr.URL()+"/v1/records?link=dc-a&worker=0", body.String())
		post(t, tr.URL()+"/v1/heartbeat?link=dc-b&worker=0&workers=1", "")
		st, _ := tr.Status()
		return st.Delivered == 4, fmt.Sprintf("delivered %d", st.Delivered)
	})
	testenv.EventuallyWith(t, "the reason gone from the record", 10*time.Second, func() (bool, string) {
		rec, _, err := ReadRecord(context.Background(), store, "wordcount")
		return err == nil && rec.SinkError == "" && rec.Leading == LeadElected, fmt.Sprintf("%+v", rec.Status)
	})
	checkPGRows(t, pgRows(t, srv, db, "out"), 5)
}
