package clusterbench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/clusterbench"
	"github.com/stormdock/stormdock/internal/testenv"
)

// TestMain serves the API clients' processes when TestBenchCluster runs this binary as it
// would `stormdock bench poll` or `stormdock bench submit`.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "bench" && (os.Args[2] == clusterbench.PollCommand || os.Args[2] == clusterbench.SubmitCommand) {
		if err := clusterbench.ServeClient(context.Background(), os.Args[2], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBenchCluster runs a small `stormdock bench cluster` (200 simulated nodes, 2,000
// workers) against a real master and a ZooKeeper of its own, and checks what it must get
// right whatever the machine's speed: every worker acknowledged running exactly once, and a
// rack's loss moving that rack's workers and no other. Its times are logged, not checked.
func TestBenchCluster(t *testing.T) {
	// 200 sessions from one address: over ZooKeeper's default of 60 per address.
	zk := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond, MaxClientCnxns: 0, Heap: "512m"})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(5*time.Minute))
	defer cancel()
	var progress strings.Builder
	rep, err := clusterbench.Run(ctx, clusterbench.Config{
		Store: "zk://" + zk.Addr(), Nodes: 200, Workers: 2000, Jobs: 20, DCs: 4, Racks: 5, Slots: 16,
		// Sessions as long as this server grants (20 ticks): under the suite's -race, beside
		// the e2e tests, the process has stalled long enough for 8 of 200 agents' 5 s sessions
		// to expire, and their workers moved, rightly, as a lost node's.
		Heartbeat: 200 * time.Millisecond, Churn: 0.2, SessionTimeout: 10 * time.Second,
		Steady: 2 * time.Second, Poll: time.Second, Pollers: 10, Settle: testenv.Timeout(2 * time.Minute),
		MetricsSeries: 4, MetricsInterval: 500 * time.Millisecond,
		ProfileDir: t.TempDir(), ProfileSpan: time.Second, Progress: &progress,
		ClientBinary: os.Args[0], // TestMain serves `bench poll` and `bench submit`
	})
	t.Log("progress:\n" + progress.String())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("figure: small bench cluster report:\n%s", b)

	if rep.Submit.Left != 0 || rep.Submit.Workers != 2000 {
		t.Errorf("submit: %d of %d workers not acknowledged", rep.Submit.Left, rep.Submit.Workers)
	}
	// Read from the leader's /metrics with the scrape token: none would mean the scrape was refused.
	if rep.Submit.Reconciles == 0 {
		t.Errorf("submit: no reconciles read from the master's /metrics")
	}
	// Every job's metrics pulled from the simulated agents' signed endpoint: 2,000 workers of
	// 4 series and the agents' 5, in 20 jobs: at least 20 x 10 series (throughput included).
	if m := rep.Metrics; m == nil || m.Series < 200 || m.Rounds == 0 || m.Answers == 0 || rep.Poll.MetricsP99 == 0 {
		t.Errorf("job metrics: %+v, job metrics p99 %v", rep.Metrics, rep.Poll.MetricsP99)
	}
	if rep.StartedTwice != 0 {
		t.Errorf("%d workers started more than once", rep.StartedTwice)
	}
	if rep.Rack.Workers == 0 || rep.Rack.Left != 0 {
		t.Errorf("rack loss: %d workers on the rack, %d not running elsewhere", rep.Rack.Workers, rep.Rack.Left)
	}
	if rep.Rack.OthersMoved != 0 || rep.Rack.OthersRestarted != 0 {
		t.Errorf("rack loss moved %d and restarted %d workers of other racks", rep.Rack.OthersMoved, rep.Rack.OthersRestarted)
	}
	if rep.DC == nil || rep.DC.Workers == 0 || rep.DC.Left != 0 {
		t.Errorf("dc loss: %+v", rep.DC)
	}
	if rep.Rack.MovedTwice != 0 || (rep.DC != nil && rep.DC.MovedTwice != 0) {
		t.Errorf("lost workers started more than once: %d of the rack's, %+v", rep.Rack.MovedTwice, rep.DC)
	}
	if rep.Poll.Errors != 0 || rep.Poll.Requests == 0 || rep.Poll.Where != "in a process of their own" {
		t.Errorf("API pollers: %d requests, %d errors, ran %s", rep.Poll.Requests, rep.Poll.Errors, rep.Poll.Where)
	}
	// The master's own measure of the same requests, from its /metrics: none would mean
	// its request histogram, or the bench's reading of it, is broken.
	if p := rep.Poll; p.ServerListP99 == 0 || p.ServerStatusP99 == 0 || p.ServerListP50 > p.ServerListP99 {
		t.Errorf("API pollers as the master measured them: %+v", p)
	}
	// Each reconcile's steps, from the master's /metrics.
	if s := rep.Submit.ReconcileSteps; s["plan"] == 0 || s["write"] == 0 {
		t.Errorf("submit: reconciles' steps %v, want plan and write timed", s)
	}
	if rep.Store.LargestAssign == 0 || rep.Store.LargestAssign > 1<<20 {
		t.Errorf("largest assignment %d bytes", rep.Store.LargestAssign)
	}
	// The master's profiles, taken with the admin token: a heap profile after each phase
	// and a cpu profile over each event, gzipped protobuf.
	if p := rep.Profiles; p == nil || len(p.Errors) > 0 || len(p.Files) != 6 || p.Heap == "" || p.HeapBytes == 0 {
		t.Errorf("profiles: %+v", p)
	} else {
		for _, f := range p.Files {
			b, err := os.ReadFile(f.File)
			if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
				t.Errorf("profile %s (%s): %d bytes, %v", f.What, f.Kind, len(b), err)
			}
		}
	}
}

// TestBenchClusterRefusesCappedServer: a ZooKeeper that caps connections per address below
// the agents' sessions is refused with a line saying what to change.
func TestBenchClusterRefusesCappedServer(t *testing.T) {
	zk := zktest.Start(t, zktest.Options{MaxClientCnxns: 60})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(time.Minute))
	defer cancel()
	_, err := clusterbench.Run(ctx, clusterbench.Config{Store: "zk://" + zk.Addr(), Nodes: 200, Workers: 2000, DCs: 4, Racks: 5, Slots: 16})
	if err == nil || !strings.Contains(err.Error(), "maxClientCnxns=0") {
		t.Fatalf("err = %v, want one naming maxClientCnxns", err)
	}
}

// TestBenchClusterTLS runs the benchmark on a plain ZooKeeper and on one that serves TLS
// only (zks://, the master, its client and every simulated agent's session over TLS), and
// logs what TLS costs side by side. STORMDOCK_BENCH_TLS_NODES sets the nodes (default 200,
// ten workers each).
func TestBenchClusterTLS(t *testing.T) {
	nodes := 200
	if v := os.Getenv("STORMDOCK_BENCH_TLS_NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 20 {
			t.Fatalf("STORMDOCK_BENCH_TLS_NODES=%q: want a number of nodes, 20 or more", v)
		}
		nodes = n
	}
	var lines []string
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		zk := zktest.Start(t, zktest.Options{TickTime: 500 * time.Millisecond, MaxClientCnxns: 0, Heap: "512m", TLS: tc.tls})
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(10*time.Minute))
		rep, err := clusterbench.Run(ctx, clusterbench.Config{
			Store: zk.URL(""), StoreTLS: coord.TLSFiles{CA: zk.CAFile()}, Nodes: nodes, Workers: nodes * 10, Jobs: nodes / 10,
			DCs: 4, Racks: 5, Slots: 16, Heartbeat: time.Second, Churn: 0.2, SessionTimeout: 10 * time.Second,
			Steady: 10 * time.Second, Poll: 5 * time.Second, Pollers: 10, Settle: testenv.Timeout(3 * time.Minute), SkipDC: true,
		})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rep.Submit.Left != 0 || rep.StartedTwice != 0 || rep.Rack.Left != 0 || rep.Poll.Errors != 0 {
			t.Errorf("%s: submit left %d, started twice %d, rack loss left %d, poll errors %d",
				tc.name, rep.Submit.Left, rep.StartedTwice, rep.Rack.Left, rep.Poll.Errors)
		}
		lines = append(lines, fmt.Sprintf("%-5s register %.2fs, submit to acked %.2fs, steady writes/s %.0f (%.2f per node per heartbeat), "+
			"steady master cpu %.2fs in 10s, master cpu %.1fs, bench cpu %.1fs, job status p50/p99 %.1f/%.1fms, rack loss acked %.2fs",
			tc.name, rep.Register, rep.Submit.Acked, rep.Steady.ZK.WritesPerSecond, rep.Steady.WritesPerNodePerHeartbeat,
			rep.Steady.MasterCPU, rep.MasterCPU, rep.BenchCPU, rep.Poll.StatusP50, rep.Poll.StatusP99, rep.Rack.Acked))
	}
	t.Logf("figure: ZooKeeper TLS at %d nodes, %d workers:\n%s", nodes, nodes*10, strings.Join(lines, "\n"))
}
