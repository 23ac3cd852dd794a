package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/provision"
)

// BenchmarkClusterScale measures, on the real dockerd, `cluster create` of 5 agents until
// all are registered, and `cluster scale` 5 -> 10 -> 5 with a job running: the time each
// scale takes to settle and how many workers on kept agents were restarted (goal 0). It
// logs and reports the figures; it fails only when workers are lost or restarted.
//
//	go test ./provision/docker/ -run '^$' -bench ClusterScale -benchtime 1x -v
func BenchmarkClusterScale(b *testing.B) {
	p, spec, _ := newProvider(b, 5)
	spec.DCs, spec.RacksPerDC, spec.AgentMemory = []string{"dc-a", "dc-b"}, 2, 256<<20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	start := time.Now()
	c, err := p.Create(ctx, spec)
	if err != nil {
		b.Fatalf("create: %v", err)
	}
	createTime := time.Since(start)
	b.Logf("cluster create, 5 agents, to all registered: %s", createTime.Round(time.Millisecond))
	cl := apiClient(b, provision.Tokens{Dir: p.TokenDir()}, c)
	if err := cl.CreateTenant(ctx, cluster.Tenant{Name: "t1"}); err != nil {
		b.Fatal(err)
	}
	if _, err := cl.SubmitJob(ctx, jobSpec(10)); err != nil {
		b.Fatal(err)
	}
	settled(b, cl, 10, time.Minute)

	var out, in time.Duration
	restarted, moved := 0, 0
	b.ResetTimer()
	for range b.N {
		if _, err := cl.ScaleJob(ctx, "wc", 10); err != nil {
			b.Fatal(err)
		}
		settled(b, cl, 10, time.Minute)
		start := time.Now()
		if _, err := p.Scale(ctx, spec.Name, 10); err != nil {
			b.Fatalf("scale to 10: %v", err)
		}
		out += time.Since(start)
		// Grow the job onto the new agents, so that scaling in has workers to move.
		if _, err := cl.ScaleJob(ctx, "wc", 20); err != nil {
			b.Fatal(err)
		}
		before := settled(b, cl, 20, time.Minute)
		kept := map[string]bool{}
		for i := range 5 {
			kept[spec.SlotAt(i).Node] = true
		}
		start = time.Now()
		if _, err := p.Scale(ctx, spec.Name, 5); err != nil {
			b.Fatalf("scale to 5: %v", err)
		}
		in += time.Since(start)
		after, _, err := workers(ctx, cl)
		if err != nil {
			b.Fatal(err)
		}
		if len(after) != 20 {
			b.Errorf("after scale in: %d of 20 workers running", len(after))
		}
		for i, w := range before {
			switch {
			case kept[w.node] && after[i] != w:
				restarted++
			case !kept[w.node]:
				moved++
			}
		}
		for _, w := range after {
			if !kept[w.node] {
				b.Errorf("a worker runs on removed agent %s", w.node)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(createTime.Seconds(), "create-s")
	b.ReportMetric(out.Seconds()/n, "scale-out-s")
	b.ReportMetric(in.Seconds()/n, "scale-in-s")
	b.ReportMetric(float64(moved)/n, "moved/op")
	b.ReportMetric(float64(restarted)/n, "restarted-kept/op")
	b.Logf("scale 5->10 settled in %s; 10->5 settled in %s (drain included); %d workers moved off removed agents, %d restarted on kept ones (per round)",
		(out / time.Duration(b.N)).Round(time.Millisecond), (in / time.Duration(b.N)).Round(time.Millisecond), moved/b.N, restarted/b.N)
	if restarted > 0 {
		b.Errorf("%d workers on kept agents restarted", restarted)
	}
}
