package multidc

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/natstest"
	"github.com/stormdock/stormdock/internal/pgtest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// BenchmarkRouterFileSink measures the router's throughput with the file sink: two links
// of two workers each post every record (about 120 bytes, batches of 256) over loopback
// HTTP as fast as the router takes them; one link's records are delivered, the other's
// de-duplicated. records/s counts records delivered to the file.
func BenchmarkRouterFileSink(b *testing.B) {
	benchRouter(b, nil)
}

// BenchmarkRouterSinks is BenchmarkRouterFileSink for each kind of sink, side by side: the
// file, PostgreSQL (the shared server, a database of its own) and JetStream (the shared
// server, a subject of its own), each on this machine's loopback.
//
//	go test -run x -bench RouterSinks -benchtime 50000x ./multidc
func BenchmarkRouterSinks(b *testing.B) {
	b.Run("file", func(b *testing.B) { benchRouter(b, nil) })
	b.Run("postgres", func(b *testing.B) {
		srv := pgtest.Shared(b)
		db := srv.NewDB(b)
		benchRouter(b, func(ctx context.Context) (Sink, error) {
			return OpenPGSink(ctx, pgURL(srv.Addr(), db, "out"), FencingOptions{Job: "wordcount", Logger: slog.New(slog.DiscardHandler)})
		})
	})
	b.Run("jetstream", func(b *testing.B) {
		srv := natstest.Shared(b)
		benchRouter(b, func(ctx context.Context) (Sink, error) {
			return OpenNATSSink(ctx, srv.URL()+"/"+natsSubject(), FencingOptions{Job: "wordcount", Logger: slog.New(slog.DiscardHandler)})
		})
	})
}

// benchRouter runs the router throughput benchmark with the sink open opens (nil: the file
// sink).
func benchRouter(b *testing.B, open func(ctx context.Context) (Sink, error)) {
	n := max(b.N, 20000)
	_, store := embeddedStore(b)
	var timed *timedSink
	tr := startRouter(b, store, []string{"dc-a", "dc-b"}, func(c *Config) {
		c.Logger = slog.New(slog.DiscardHandler)
		if open != nil {
			s, err := open(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			timed = &timedSink{Sink: s}
			c.Sink = timed
		}
	})
	if timed == nil {
		timed = tr.sink
	}
	waitReady(b, tr.URL())
	const workers, batch = 2, 256
	type job struct {
		s      *Sender
		bodies [][]byte
	}
	var jobs []job
	for _, l := range []string{"dc-a", "dc-b"} {
		for w := range workers {
			j := job{s: NewSender(tr.URL(), l, w, workers)}
			j.s.Token = testToken
			var body bytes.Buffer
			k := 0
			for off := w; off < n; off += workers {
				fmt.Fprintf(&body, `{"offset":%d,"link":%q,"worker":%d,"counts":{"the":3,"quick":1,"brown":1,"fox":%d}}`+"\n", off, l, w, off%7)
				if k++; k == batch {
					j.bodies = append(j.bodies, bytes.Clone(body.Bytes()))
					body.Reset()
					k = 0
				}
			}
			if body.Len() > 0 {
				j.bodies = append(j.bodies, body.Bytes())
			}
			jobs = append(jobs, j)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, j := range jobs {
		wg.Go(func() { j.s.Heartbeats(ctx, 100*time.Millisecond) })
	}
	testenv.Eventually(b, "an active link", 5*time.Second, func() bool { st, _ := tr.Status(); return st.Active != "" })
	b.ResetTimer()
	start := time.Now()
	for _, j := range jobs {
		wg.Go(func() {
			for _, body := range j.bodies {
				if err := j.s.Send(ctx, body); err != nil {
					if ctx.Err() == nil {
						b.Errorf("send: %v", err)
					}
					return
				}
			}
		})
	}
	testenv.Eventually(b, "every record delivered", time.Minute, func() bool { st, _ := tr.Status(); return st.Delivered == int64(n-1) })
	b.StopTimer()
	// The time the last batch reached the sink, not the time the poll saw it.
	timed.mu.Lock()
	elapsed := timed.writes[len(timed.writes)-1].at.Sub(start)
	timed.mu.Unlock()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
	b.ReportMetric(0, "ns/op")
	cancel()
}

// BenchmarkOrderer measures the core alone: two links' records added in order, delivered
// in batches of 256.
func BenchmarkOrderer(b *testing.B) {
	o := newOrderer([]string{"dc-a", "dc-b"}, 0, Limits{Window: 1 << 20})
	_ = o.failover("dc-a")
	data := payload("dc-a", 0, 60)
	b.ReportAllocs()
	off := int64(0)
	for b.Loop() {
		o.add(Record{Offset: off, Link: "dc-a", Data: data})
		o.add(Record{Offset: off, Link: "dc-b", Data: data})
		off++
		if off%256 == 0 {
			if err := o.commit(o.peek(256)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
