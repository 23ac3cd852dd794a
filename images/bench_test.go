package images

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkPushPull times the push of the stormdock worker image (the static stormdock
// binary, about 28 MB) to an empty loopback registry, and its pull back onto an engine that
// no longer has it:
//
//	go test -run '^$' -bench PushPull -benchtime 5x ./images/
func BenchmarkPushPull(b *testing.B) {
	cli := connect(b)
	bin := testenv.BuildBinary(b, "./cmd/stormdock")
	ctx := context.Background()
	m := New(cli)
	labels := map[string]string{"io.stormdock.test": fmt.Sprintf("bench-%d", time.Now().UnixNano())}
	var push, pull time.Duration
	var size int64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		srv := testenv.StartRegistry(b, nil) // empty: every layer is uploaded
		tag := fmt.Sprintf("%s/stormdock-bench/w:%d", srv.Addr, i)
		img, err := m.Build(ctx, BuildOptions{Tag: tag, Binary: bin, Labels: labels})
		if err != nil {
			b.Fatal(err)
		}
		size = img.Size
		b.StartTimer()
		t0 := time.Now()
		dgst, err := m.Push(ctx, tag, Progress{})
		if err != nil {
			b.Fatal(err)
		}
		push += time.Since(t0)
		b.StopTimer()
		removeAll(b, cli, img.ID)
		p, _ := ParseRef(tag)
		pinned, _ := p.WithDigest(dgst)
		b.StartTimer()
		t0 = time.Now()
		if err := m.Pull(ctx, pinned, Progress{}); err != nil {
			b.Fatal(err)
		}
		pull += time.Since(t0)
		b.StopTimer()
		removeAll(b, cli, img.ID)
		srv.Stop()
		b.StartTimer()
	}
	b.ReportMetric(float64(push.Milliseconds())/float64(b.N), "push-ms/op")
	b.ReportMetric(float64(pull.Milliseconds())/float64(b.N), "pull-ms/op")
	b.ReportMetric(float64(size)/1e6, "image-MB")
}
