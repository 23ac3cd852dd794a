package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// zxid reads the ZooKeeper server's last transaction id: its low 32 bits count write
// transactions in the current epoch, so its growth is the server's write rate.
func zxid(tb testing.TB, addr string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := zktest.FourLetter(ctx, addr, "srvr")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Zxid: "); ok {
			n, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(v), "0x"), 16, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n & 0xffffffff
		}
	}
	tb.Fatalf("no Zxid in srvr output:\n%s", out)
	return 0
}

// BenchmarkFiftyAgents measures issue 5's figures on one machine: 50 agents, 200 workers,
// ZooKeeper session timeout 2 s. Run it alone:
//
//	CI=true go test -run '^$' -bench FiftyAgents -benchtime 1x -timeout 20m ./e2e/
func BenchmarkFiftyAgents(b *testing.B) {
	for range b.N {
		fiftyAgents(b)
	}
}

func fiftyAgents(b *testing.B) {
	const agents, workers = 50, 200
	h := newHarness(b, 2*time.Second)
	ctx := context.Background()
	cl := h.AdminClient(h.StartMaster("m1"))
	testenv.Eventually(b, "m1 leads", 30*time.Second, func() bool { hl, err := cl.Health(ctx); return err == nil && hl.Leader })
	m2 := h.StartMaster("m2")
	for i := range agents {
		h.StartAgent(fmt.Sprintf("n%02d", i), fmt.Sprintf("dc-%d", i%5), fmt.Sprintf("r%d", i/5%2), 8)
	}
	testenv.Eventually(b, "50 nodes", 2*time.Minute, func() bool { return len(h.NodeRecords()) == agents })
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "e2e"}); err != nil {
		b.Fatal(err)
	}
	spec := strings.Replace(string(jobSpec("wc", workers)), "wordcount]", "wordcount, --rate, '1']", 1)
	t0 := time.Now()
	if _, err := cl.SubmitJob(ctx, []byte(spec)); err != nil {
		b.Fatal(err)
	}
	// Progress is read from the master's API (its mirror of the store), not from the store:
	// a test that reads 50 node records every few milliseconds loads ZooKeeper itself.
	runningNow := func() int {
		st, err := cl.Job(ctx, "wc")
		if err != nil || st.Summary.Stopping > 0 {
			return -1
		}
		return st.Summary.Running
	}
	testenv.Eventually(b, "200 workers running", 5*time.Minute, func() bool { return runningNow() == workers })
	b.ReportMetric(time.Since(t0).Seconds(), "submit-to-running-s")

	// Steady state, once every worker's first memory sample (the last write of its start) is
	// in: ZooKeeper write transactions per second, per node.
	testenv.Eventually(b, "every worker's memory sampled", time.Minute, func() bool {
		st, err := cl.Job(ctx, "wc")
		if err != nil || len(st.Workers) != workers {
			return false
		}
		for _, w := range st.Workers {
			if w.Memory == 0 {
				return false
			}
		}
		return true
	})
	z0, s0 := zxid(b, h.ZK.Addr()), time.Now()
	time.Sleep(20 * time.Second) // the measurement window
	z1 := zxid(b, h.ZK.Addr())
	rate := float64(z1-z0) / time.Since(s0).Seconds()
	b.ReportMetric(rate, "zk-writes/s")
	b.ReportMetric(rate/agents, "zk-writes/s/node")

	// SIGKILL an agent: its workers run elsewhere.
	st, err := cl.Job(ctx, "wc")
	if err != nil {
		b.Fatal(err)
	}
	victim := st.Workers[0].Node
	if h.Agent(victim) == nil {
		b.Fatalf("worker 0 is on %q, not a known agent", victim)
	}
	t0 = time.Now()
	h.KillNode(victim)
	testenv.Eventually(b, "replacements running", 2*time.Minute, func() bool {
		st, err := cl.Job(ctx, "wc")
		if err != nil || st.Summary.Running != workers {
			return false
		}
		for _, w := range st.Workers {
			if w.Node == victim {
				return false
			}
		}
		return true
	})
	b.ReportMetric(time.Since(t0).Seconds(), "agent-kill-to-replaced-s")

	// SIGKILL the master that leads now: the other one takes over.
	cl2 := h.AdminClient(m2)
	leader, standby, standbyClient := "m1", "m2", cl2
	if hl, err := cl2.Health(ctx); err == nil && hl.Leader {
		leader, standby, standbyClient = "m2", "m1", cl
	}
	t0 = time.Now()
	h.Master(leader).Kill()
	testenv.Eventually(b, standby+" leads", time.Minute, func() bool {
		hl, err := standbyClient.Health(ctx)
		return err == nil && hl.Leader
	})
	b.ReportMetric(time.Since(t0).Seconds(), "master-kill-to-leader-s")
}
