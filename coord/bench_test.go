package coord_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/coordtest"
	"github.com/stormdock/stormdock/internal/testenv"
)

var quiet = slog.New(slog.DiscardHandler)

// latencies records per-operation latencies and reports their percentiles.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	pct := func(p float64) time.Duration { return l[min(len(l)-1, int(float64(len(l))*p))] }
	b.ReportMetric(float64(pct(0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(pct(0.99).Nanoseconds()), "p99-ns")
}

// benchStores returns a factory of clients of one namespace per backend.
func benchBackends(b *testing.B) map[string]func(b *testing.B) func() coord.Store {
	return map[string]func(b *testing.B) func() coord.Store{
		"embedded": func(b *testing.B) func() coord.Store {
			srv, err := coord.NewServer(coord.ServerOptions{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { srv.Close() })
			return func() coord.Store {
				c, err := srv.Connect(coord.Options{Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { c.Close() })
				return c
			}
		},
		"zk": func(b *testing.B) func() coord.Store {
			addr := testenv.ZKAddr(b)
			chroot := uniqueChroot(b, "stormdock-bench")
			b.Cleanup(func() { cleanupZK(b, addr, chroot) })
			return func() coord.Store {
				s, err := coord.OpenZK(context.Background(), []string{addr}, chroot, coord.Options{SessionTimeout: 4 * time.Second, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				return s
			}
		},
	}
}

func forEachBackend(b *testing.B, fn func(b *testing.B, open func() coord.Store)) {
	backends := benchBackends(b)
	for _, name := range []string{"embedded", "zk"} {
		b.Run(name, func(b *testing.B) { fn(b, backends[name](b)) })
	}
}

func BenchmarkPut(b *testing.B) {
	forEachBackend(b, func(b *testing.B, open func() coord.Store) {
		ctx := context.Background()
		s := open()
		value := make([]byte, 256)
		lat := make(latencies, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, err := s.Put(ctx, "/bench/put", value, coord.AnyVersion); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		lat.report(b)
	})
}

func BenchmarkGet(b *testing.B) {
	forEachBackend(b, func(b *testing.B, open func() coord.Store) {
		ctx := context.Background()
		s := open()
		if _, err := s.Put(ctx, "/bench/get", make([]byte, 256), coord.AnyVersion); err != nil {
			b.Fatal(err)
		}
		lat := make(latencies, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if _, err := s.Get(ctx, "/bench/get"); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		lat.report(b)
	})
}

// BenchmarkCAS: compare-and-set writes at the known current version.
func BenchmarkCAS(b *testing.B) {
	forEachBackend(b, func(b *testing.B, open func() coord.Store) {
		ctx := context.Background()
		s := open()
		v, err := s.Put(ctx, "/bench/cas", []byte("0"), coord.AnyVersion)
		if err != nil {
			b.Fatal(err)
		}
		lat := make(latencies, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			v, err = s.Put(ctx, "/bench/cas", []byte(fmt.Sprint(i)), v)
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		lat.report(b)
	})
}

// BenchmarkWatchDelivery: time from the start of a write by one client to the delivery of
// the matching event to another client's watch.
func BenchmarkWatchDelivery(b *testing.B) {
	forEachBackend(b, func(b *testing.B, open func() coord.Store) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w, s := open(), open()
		v, err := s.Put(ctx, "/bench/watch", []byte("x"), coord.AnyVersion)
		if err != nil {
			b.Fatal(err)
		}
		ch, err := w.Watch(ctx, "/bench/watch")
		if err != nil {
			b.Fatal(err)
		}
		for ev := range ch {
			if ev.Entry.Version == v {
				break
			}
		}
		lat := make(latencies, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			v, err = s.Put(ctx, "/bench/watch", []byte("x"), coord.AnyVersion)
			if err != nil {
				b.Fatal(err)
			}
			for ev := range ch {
				if ev.Entry.Version >= v {
					break
				}
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		lat.report(b)
	})
}

// BenchmarkLeaderFailover: a leader process campaigning on the shared ZooKeeper is
// SIGKILLed; the time until an in-process follower leads is reported in ms. It is bounded
// below by the session timeout (1s, the shortest the shared server allows).
func BenchmarkLeaderFailover(b *testing.B) {
	addr := testenv.ZKAddr(b)
	chroot := uniqueChroot(b, "stormdock-bench")
	b.Cleanup(func() { cleanupZK(b, addr, chroot) })
	ctx := context.Background()
	f, err := coord.OpenZK(ctx, []string{addr}, chroot, coord.Options{SessionTimeout: sharedTimeout, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		prefix := fmt.Sprintf("/election/e%d", i)
		kill := coordtest.StartChildLeader(b, "zk://"+addr+chroot, sharedTimeout, prefix, "child")
		e, _ := coord.NewElection(f, prefix, "follower")
		won := make(chan *coord.Leadership, 1)
		go func() {
			l, err := e.Campaign(ctx)
			if err != nil {
				b.Error(err)
				close(won)
				return
			}
			won <- l
		}()
		testenv.Eventually(b, "the follower standing", 10*time.Second, func() bool {
			names, err := f.Children(ctx, prefix)
			return err == nil && len(names) == 2
		})
		b.StartTimer()
		start := time.Now()
		kill()
		l, ok := <-won
		if !ok {
			b.FailNow()
		}
		took = append(took, time.Since(start))
		b.StopTimer()
		_ = l.Resign(ctx)
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(took)
	var sum time.Duration
	for _, d := range took {
		sum += d
	}
	b.ReportMetric(float64(sum.Milliseconds())/float64(len(took)), "mean-ms")
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "max-ms")
}

// BenchmarkFencedTxn is the cost of the leadership check on an assignment transaction: the
// same versioned puts of assignment-sized values (2 KiB), with and without the fence's
// CheckOp on a held election entry (compare with benchstat -col /fence).
func BenchmarkFencedTxn(b *testing.B) {
	forEachBackend(b, func(b *testing.B, open func() coord.Store) {
		for _, ops := range []int{1, 50} {
			for _, fenced := range []bool{false, true} {
				name := fmt.Sprintf("ops=%d/fence=off", ops)
				if fenced {
					name = fmt.Sprintf("ops=%d/fence=on", ops)
				}
				b.Run(name, func(b *testing.B) {
					ctx := context.Background()
					s := open()
					el, err := coord.NewElection(s, "/bench/election", "bench")
					if err != nil {
						b.Fatal(err)
					}
					lead, err := el.Campaign(ctx)
					if err != nil {
						b.Fatal(err)
					}
					defer func() { _ = lead.Resign(ctx) }()
					kv := coord.KV(s)
					if fenced {
						kv = coord.Fenced(s, lead.Fence())
					}
					value := make([]byte, 2<<10)
					versions := make([]int64, ops)
					for i := range ops {
						if _, err := s.Put(ctx, fmt.Sprintf("/bench/assign/n%d", i), value, coord.AnyVersion); err != nil {
							b.Fatal(err)
						}
						e, _ := s.Get(ctx, fmt.Sprintf("/bench/assign/n%d", i))
						versions[i] = e.Version
					}
					batch := make([]coord.Op, ops)
					lat := make(latencies, 0, b.N)
					b.ResetTimer()
					for range b.N {
						for i := range ops {
							batch[i] = coord.PutOp(fmt.Sprintf("/bench/assign/n%d", i), value, versions[i])
						}
						start := time.Now()
						res, err := kv.Txn(ctx, batch...)
						lat = append(lat, time.Since(start))
						if err != nil {
							b.Fatal(err)
						}
						for i := range ops {
							versions[i] = res[i].Version
						}
					}
					b.StopTimer()
					lat.report(b)
				})
			}
		}
	})
}

// BenchmarkEmbeddedFileWrite: a write to the embedded store kept in a file (stormdock up's),
// of 1,000 persistent entries: a persistent entry (saved before it applies) and a
// session-bound one (nothing to save: a node record's heartbeat).
func BenchmarkEmbeddedFileWrite(b *testing.B) {
	ctx := context.Background()
	srv, err := coord.NewServer(coord.ServerOptions{Path: b.TempDir() + "/store.json", Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := srv.Connect(coord.Options{SessionTimeout: -1, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	value := make([]byte, 256)
	for i := range 1000 {
		if _, err := c.Put(ctx, fmt.Sprintf("/jobs/j%04d", i), value, coord.AnyVersion); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := c.Create(ctx, "/nodes/n1", value, coord.Ephemeral); err != nil {
		b.Fatal(err)
	}
	for _, key := range []string{"/jobs/j0500", "/nodes/n1"} {
		name := "persistent"
		if key == "/nodes/n1" {
			name = "session-bound"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.Put(ctx, key, value, coord.AnyVersion); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
