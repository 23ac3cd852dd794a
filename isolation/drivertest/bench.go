package drivertest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/isolation"
)

// Workers is how many workers one benchmark iteration starts and stops.
const Workers = 50

// BenchmarkStartStop starts Workers workers one after another, then stops them, and reports
// the p50 and p99 of start-to-running and of stop latency in milliseconds. spec must give a
// worker that runs until SIGTERM and then exits at once.
func BenchmarkStartStop(b *testing.B, d isolation.Driver, spec func(id string) isolation.Spec) {
	ctx := context.Background()
	var starts, stops []time.Duration
	for i := 0; b.Loop(); i++ {
		ids := make([]string, 0, Workers)
		for j := range Workers {
			s := spec(fmt.Sprintf("bench-%d-%d-%d", time.Now().UnixNano()%1e6, i, j))
			t0 := time.Now()
			if _, err := d.Start(ctx, s); err != nil {
				b.Fatalf("start: %v", err)
			}
			starts = append(starts, time.Since(t0))
			ids = append(ids, s.ID)
		}
		for _, id := range ids {
			t0 := time.Now()
			if _, err := d.Stop(ctx, id, 10*time.Second); err != nil {
				b.Fatalf("stop: %v", err)
			}
			stops = append(stops, time.Since(t0))
		}
	}
	ReportLatency(b, "start", starts)
	ReportLatency(b, "stop", stops)
}

// ReportLatency reports the p50 and p99 of ds as NAME-p50-ms and NAME-p99-ms.
func ReportLatency(b *testing.B, name string, ds []time.Duration) {
	b.ReportMetric(Percentile(ds, 50).Seconds()*1000, name+"-p50-ms")
	b.ReportMetric(Percentile(ds, 99).Seconds()*1000, name+"-p99-ms")
}

// Percentile is the p-th percentile of ds (nearest rank).
func Percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}
