package coord_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

func TestSplitOps(t *testing.T) {
	op := func(n int) coord.Op { return coord.PutOp("/k", make([]byte, n), coord.AnyVersion) }
	cases := []struct {
		name  string
		sizes []int
		limit int
		want  []int // ops per batch
	}{
		{"none", nil, 1000, nil},
		{"one batch", []int{100, 100, 100}, 1000, []int{3}},
		{"cut at the limit", []int{400, 400, 400}, 1000, []int{2, 1}},
		{"an op over the limit alone", []int{100, 5000, 100}, 1000, []int{1, 1, 1}},
		{"default limit", []int{300 << 10, 300 << 10, 100}, 0, []int{1, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ops []coord.Op
			for _, n := range c.sizes {
				ops = append(ops, op(n))
			}
			var got []int
			total := 0
			for _, b := range coord.SplitOps(ops, c.limit) {
				got = append(got, len(b))
				total += len(b)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) || total != len(ops) {
				t.Fatalf("batches %v, want %v", got, c.want)
			}
		})
	}
}

// TestZKBufferSize: a client with small buffers reads and writes values that fit, writes
// batches that SplitOps cut to fit, and fails, without hanging, on a value that does not.
func TestZKBufferSize(t *testing.T) {
	addr := testenv.ZKAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	chroot := uniqueChroot(t, "stormdock-test")
	t.Cleanup(func() { cleanupZK(t, addr, chroot) })
	s, err := coord.Open(ctx, "zk://"+addr+chroot, coord.Options{BufferSize: 64 << 10, Logger: testenv.Logger(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ops []coord.Op
	for i := range 50 {
		ops = append(ops, coord.CreateOp(fmt.Sprintf("/b/k%02d", i), []byte(strings.Repeat("v", 4<<10)), coord.Persistent))
	}
	batches := coord.SplitOps(ops, 32<<10)
	if len(batches) < 2 {
		t.Fatalf("%d batches", len(batches))
	}
	for _, b := range batches {
		if _, err := s.Txn(ctx, b...); err != nil {
			t.Fatalf("txn of %d ops: %v", len(b), err)
		}
	}
	kids, err := s.Children(ctx, "/b")
	if err != nil || len(kids) != 50 {
		t.Fatalf("children: %d, %v", len(kids), err)
	}
	e, err := s.Get(ctx, "/b/k07")
	if err != nil || len(e.Value) != 4<<10 {
		t.Fatalf("get: %d bytes, %v", len(e.Value), err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := s.Put(wctx, "/b/big", make([]byte, 128<<10), coord.AnyVersion); err == nil {
		t.Fatal("a 128 KiB value went through 64 KiB buffers")
	}
}

// TestWatchFunc: both stores hand a key's states to a function as Watch sends them, and
// call done once the watch ends.
func TestWatchFunc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	open := map[string]func(t *testing.T) coord.Store{
		"embedded": func(t *testing.T) coord.Store {
			srv, err := coord.NewServer(coord.ServerOptions{Logger: testenv.Logger(t, slog.LevelDebug)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			s, err := srv.Connect(coord.Options{SessionTimeout: -1, Logger: testenv.Logger(t, slog.LevelDebug)})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"zk": func(t *testing.T) coord.Store {
			addr := testenv.ZKAddr(t)
			chroot := uniqueChroot(t, "stormdock-test")
			t.Cleanup(func() { cleanupZK(t, addr, chroot) })
			s, err := coord.Open(ctx, "zk://"+addr+chroot, coord.Options{Logger: testenv.Logger(t, slog.LevelDebug)})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, mk := range open {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			defer s.Close()
			fw, ok := s.(coord.FuncWatcher)
			if !ok {
				t.Fatalf("%T is not a FuncWatcher", s)
			}
			evs := make(chan coord.Event, 16)
			ended := make(chan struct{})
			wctx, stop := context.WithCancel(ctx)
			if err := fw.WatchFunc(wctx, "/w/k", func(ev coord.Event) { evs <- ev }, func() { close(ended) }); err != nil {
				t.Fatal(err)
			}
			next := func(what string) coord.Event {
				t.Helper()
				select {
				case ev := <-evs:
					return ev
				case <-ctx.Done():
					t.Fatalf("no event: %s", what)
				}
				return coord.Event{}
			}
			if ev := next("initial"); ev.Exists {
				t.Fatalf("initial event %+v, want missing", ev)
			}
			if _, err := s.Put(ctx, "/w/k", []byte("v1"), coord.AnyVersion); err != nil {
				t.Fatal(err)
			}
			if ev := next("created"); !ev.Exists || string(ev.Entry.Value) != "v1" {
				t.Fatalf("after put: %+v", ev)
			}
			if err := s.Delete(ctx, "/w/k", coord.AnyVersion); err != nil {
				t.Fatal(err)
			}
			if ev := next("deleted"); ev.Exists {
				t.Fatalf("after delete: %+v", ev)
			}
			stop()
			select {
			case <-ended:
			case <-ctx.Done():
				t.Fatal("done not called after the watch's context ended")
			}
		})
	}
}
