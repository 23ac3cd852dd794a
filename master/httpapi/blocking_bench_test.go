package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/sim"
	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/master/httpapi"
)

// BenchmarkBlockingQueries: what 1,000 clients blocked on `job status` (the summary form
// --wait reads) or `job list` cost the master, in memory while they wait and in cpu per
// change they are answered for, on a master of 100 simulated nodes running 20 jobs whose
// nodes' memory readings change all along (changes the master looks at and lets pass: they
// change no answer). Clients and server share the process, over loopback.
//
//	go test -run '^$' -bench BlockingQueries -benchtime 20x ./master/httpapi/
//
// An op is one change (job-0 scaled between 5 and 6 workers), done once every client has
// seen it and waits again. Metrics: B/waiter and goroutines/waiter (heap and stacks with
// the clients waiting, less before: both ends of each connection), B/waiter-over-held (less
// the same for 1,000 requests held by a handler that only waits: what blocking queries add
// to holding the connections), cpu-ms/op (user and system time of the whole process per
// change), cpu-µs/op/waiter (the same less a change with no client, per client: the
// master's answer and the client's next read), renders/op (the master's renders per change:
// one per distinct read and state, however many wait on it).
func BenchmarkBlockingQueries(b *testing.B) {
	tc := clustertest.NewSim(b)
	tc.Beat = 200 * time.Millisecond
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(4, 5, 5) {
		tc.Agent(n, sim.Config{Churn: 0.2})
	}
	testenv.Eventually(b, "100 nodes", time.Minute, func() bool { return len(m.NodeEntries()) == 100 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		b.Fatal(err)
	}
	for i := range 20 {
		spec := clustertest.Spec(fmt.Sprintf("job-%d", i), 2)
		if i == 0 {
			spec.Workers = 5
		}
		if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, spec); err != nil {
			b.Fatal(err)
		}
	}
	srv, _ := tc.API(m, httpapi.Config{})
	token := tc.AdminToken()
	admin, _ := api.NewClient(srv.URL, token)
	testenv.Eventually(b, "20 jobs running", time.Minute, func() bool {
		jobs, err := admin.Jobs(tc.Ctx)
		if err != nil || len(jobs) != 20 {
			return false
		}
		for _, j := range jobs {
			if j.Running != j.Workers {
				return false
			}
		}
		return true
	})
	reg := tc.Registry(m)
	const waiters = 1000
	workers := 5
	scale := func(b *testing.B) []byte {
		workers = 11 - workers // 5, 6, 5...
		if _, err := admin.ScaleJob(tc.Ctx, "job-0", workers); err != nil {
			b.Fatal(err)
		}
		return []byte(`"running": ` + strconv.Itoa(workers) + ",")
	}
	// The process's cpu while nothing but the nodes' memory readings changes, per second.
	idle := func(window time.Duration) float64 {
		c0 := cpuTime()
		time.Sleep(window)
		return float64((cpuTime() - c0).Microseconds()) / window.Seconds()
	}
	// A change with nobody waiting: the scale, the plan, the simulated nodes, the reads.
	var baseCPU float64 // µs per change
	var baseIdle float64
	b.Run("no-waiter", func(b *testing.B) {
		baseIdle = idle(idleWindow)
		var cpu time.Duration
		for b.Loop() {
			c0 := cpuTime()
			scale(b)
			testenv.Eventually(b, "job-0 settled", 10*time.Second, func() bool {
				st, err := admin.JobSummary(tc.Ctx, "job-0")
				return err == nil && st.Summary.Running == workers && st.Summary.Stopping == 0
			})
			cpu += cpuTime() - c0
		}
		baseCPU = float64(cpu.Microseconds()) / float64(b.N)
		b.ReportMetric(baseCPU/1000, "cpu-ms/op")
		b.ReportMetric(baseIdle/1000, "idle-cpu-ms/s")
	})
	for _, c := range []struct{ name, path string }{
		{"job-status", "/v1/jobs/job-0?workers=false"},
		{"job-list", "/v1/jobs"},
	} {
		b.Run(c.name, func(b *testing.B) {
			heldB := heldCost(b, waiters)
			ws := newWaiters(tc.Ctx, srv.URL, token, c.path, waiters)
			mem0, g0 := memNow()
			ws.start()
			waiting := func() bool {
				return testenv.Metric(b, reg, "stormdock_master_blocking_queries", nil) == waiters
			}
			testenv.Eventually(b, "1,000 blocking queries waiting", time.Minute, waiting)
			mem1, g1 := memNow()
			idleCPU := idle(idleWindow)
			renders0 := testenv.Metric(b, reg, "stormdock_master_blocking_renders_total", nil)
			var cpu time.Duration
			for b.Loop() {
				c0 := cpuTime()
				marker := scale(b)
				testenv.Eventually(b, "every client saw the change and waits again", time.Minute, func() bool {
					return ws.saw(marker) == waiters && waiting()
				})
				cpu += cpuTime() - c0
			}
			renders := testenv.Metric(b, reg, "stormdock_master_blocking_renders_total", nil) - renders0
			ws.stop()
			perWaiter := float64(mem1-mem0) / waiters
			b.ReportMetric(perWaiter, "B/waiter")
			b.ReportMetric(perWaiter-heldB, "B/waiter-over-held")
			b.ReportMetric(float64(g1-g0)/waiters, "goroutines/waiter")
			perOp := float64(cpu.Microseconds()) / float64(b.N)
			b.ReportMetric(perOp/1000, "cpu-ms/op")
			b.ReportMetric((perOp-baseCPU)/waiters, "cpu-µs/op/waiter")
			b.ReportMetric(renders/float64(b.N), "renders/op")
			b.ReportMetric(idleCPU/1000, "idle-cpu-ms/s")
			b.ReportMetric((idleCPU-baseIdle)/waiters, "idle-cpu-µs/s/waiter")
		})
	}
	// What --wait did before blocking queries, after its first second: a read every 200ms.
	b.Run("job-status-polled-200ms", func(b *testing.B) {
		ctx, cancel := context.WithCancel(tc.Ctx)
		defer cancel()
		hc := &http.Client{Transport: &http.Transport{MaxIdleConns: waiters, MaxIdleConnsPerHost: waiters}}
		defer hc.CloseIdleConnections()
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		var polled atomic.Int64 // answers the pollers got
		for i := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Spread over the interval, as clients that started at different times are.
				next := time.Now().Add(time.Duration(i) * 200 * time.Millisecond / waiters)
				for ctx.Err() == nil {
					if time.Until(next) > 0 {
						time.Sleep(time.Until(next))
					}
					next = next.Add(200 * time.Millisecond)
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/jobs/job-0?workers=false", nil)
					req.Header.Set("Authorization", "Bearer "+token)
					if resp, err := hc.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						polled.Add(1)
					}
				}
			}()
		}
		// Measured once every poller has its connection and its pace: each answered twice.
		testenv.Eventually(b, "every poller polling", time.Minute, func() bool { return polled.Load() >= 2*waiters })
		// An op is a tenth of a second of polling.
		var cpu float64
		for b.Loop() {
			cpu += idle(100 * time.Millisecond)
		}
		b.ReportMetric(cpu/float64(b.N)/1000, "idle-cpu-ms/s")
		b.ReportMetric((cpu/float64(b.N)-baseIdle)/waiters, "idle-cpu-µs/s/waiter")
	})
}

// idleWindow is how long idle cpu is measured.
const idleWindow = 2 * time.Second

// waiters are clients that read path by blocking queries, each again as soon as answered.
type waiters struct {
	ctx    context.Context
	cancel context.CancelFunc
	hc     *http.Client
	url    string
	token  string
	last   []atomic.Pointer[[]byte] // each client's last answer
	wg     sync.WaitGroup
}

func newWaiters(ctx context.Context, base, token, path string, n int) *waiters {
	ctx, cancel := context.WithCancel(ctx)
	tr := &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n}
	return &waiters{ctx: ctx, cancel: cancel, hc: &http.Client{Transport: tr}, url: base + path, token: token,
		last: make([]atomic.Pointer[[]byte], n)}
}

func (ws *waiters) start() {
	for i := range ws.last {
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			var index uint64
			for ws.ctx.Err() == nil {
				url := ws.url
				if index > 0 {
					sep := "?"
					if strings.Contains(url, "?") {
						sep = "&"
					}
					url += sep + "index=" + strconv.FormatUint(index, 10)
				}
				req, _ := http.NewRequestWithContext(ws.ctx, http.MethodGet, url, nil)
				req.Header.Set("Authorization", "Bearer "+ws.token)
				resp, err := ws.hc.Do(req)
				if err != nil {
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				index, _ = strconv.ParseUint(resp.Header.Get(api.IndexHeader), 10, 64)
				ws.last[i].Store(&body)
			}
		}()
	}
}

// saw counts the clients whose last answer holds marker.
func (ws *waiters) saw(marker []byte) int {
	n := 0
	for i := range ws.last {
		if p := ws.last[i].Load(); p != nil && bytes.Contains(*p, marker) {
			n++
		}
	}
	return n
}

func (ws *waiters) stop() {
	ws.cancel()
	ws.wg.Wait()
	ws.hc.CloseIdleConnections()
}

// heldCost is the memory per request (both ends) of n requests held by a handler that only
// waits, on connections of their own, as the waiters' are.
func heldCost(b *testing.B, n int) float64 {
	release := make(chan struct{})
	var in atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n}}
	mem0, g0 := memNow()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	testenv.Eventually(b, "the held requests in", time.Minute, func() bool { return in.Load() == int64(n) })
	mem1, _ := memNow()
	close(release)
	wg.Wait()
	hc.CloseIdleConnections()
	srv.Close()
	// The connections' goroutines end after their close: gone before the next measure.
	testenv.Eventually(b, "the held connections' goroutines gone", time.Minute, func() bool { return runtime.NumGoroutine() <= g0+10 })
	return float64(mem1-mem0) / float64(n)
}

// memNow is the heap and stacks in use, after a collection, and the goroutines.
func memNow() (uint64, int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse, runtime.NumGoroutine()
}

// cpuTime is the process's user and system time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
