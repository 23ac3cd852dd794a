package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
)

// BenchmarkJobStatus measures what TLS costs `job status`: the same request to a master
// serving plain HTTP and one serving TLS, each with a new connection per request (as every
// `stormdock job status` run makes: the TLS handshake included) and over one kept-alive
// connection. It reports the median and 99th percentile latency.
//
//	go test -run '^$' -bench JobStatus -benchtime 2000x ./daemon/
func BenchmarkJobStatus(b *testing.B) {
	for _, mode := range []string{"plain", "tls"} {
		dir := b.TempDir()
		cfg := MasterConfig{Store: "mem://" + b.Name() + mode, Listen: "127.0.0.1:0", DataDir: dir, Logger: slog.New(slog.DiscardHandler)}
		var opts []api.ClientOption
		if mode == "tls" {
			conf, err := MasterTLS(dir, "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			cfg.TLS = conf
			pool, err := api.CAPool(filepath.Join(dir, CACertFile))
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, api.WithRootCAs(pool))
		}
		m := startMaster(b, cfg)
		tok, _ := os.ReadFile(m.TokenPath())
		token := strings.TrimSpace(string(tok))
		ctx := context.Background()
		admin, _ := api.NewClient(m.URL(), token, opts...)
		deadline := time.Now().Add(10 * time.Second)
		for admin.CreateTenant(ctx, cluster.Tenant{Name: "bench"}) != nil {
			if time.Now().After(deadline) {
				b.Fatal("the master never answered")
			}
			time.Sleep(20 * time.Millisecond)
		}
		spec := "name: wc\ntenant: bench\nworkers: 4\nresources: {memory: 64Mi, cpu: 0.1}\ncommand: [sleep, '1000']\n"
		if _, err := admin.SubmitJob(ctx, []byte(spec)); err != nil {
			b.Fatal(err)
		}
		for _, conn := range []string{"new-conn", "keep-alive"} {
			b.Run(mode+"/"+conn, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				cl, _ := api.NewClient(m.URL(), token, opts...)
				b.ResetTimer()
				for range b.N {
					if conn == "new-conn" {
						cl.CloseIdleConnections()
						cl, _ = api.NewClient(m.URL(), token, opts...)
					}
					t0 := time.Now()
					if _, err := cl.Job(ctx, "wc"); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
