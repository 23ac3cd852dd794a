package zktest_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord/zktest"
)

func TestStartKillRestart(t *testing.T) {
	s := zktest.Start(t, zktest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := zktest.FourLetter(ctx, s.Addr(), "srvr")
	if err != nil || !strings.Contains(r, "Mode: standalone") {
		t.Fatalf("srvr = %q, %v", r, err)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("still running after Kill")
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("port still accepting after Kill")
	}
	s.Restart()
	if r, err := zktest.FourLetter(ctx, s.Addr(), "ruok"); err != nil || r != "imok" {
		t.Fatalf("after restart ruok = %q, %v", r, err)
	}
}

// An ensemble serves with one leader; when the leader is killed the other two elect a new
// one, and the killed server rejoins as a follower.
func TestEnsembleLeaderKill(t *testing.T) {
	e := zktest.StartEnsemble(t, 3, zktest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if got := len(strings.Split(e.Addrs(), ",")); got != 3 {
		t.Fatalf("Addrs() = %q", e.Addrs())
	}
	if u := e.URL("/x"); u != "zk://"+e.Addrs()+"/x" {
		t.Fatalf("URL = %q", u)
	}
	for i, s := range e.Servers() {
		if s.ID() != i+1 {
			t.Fatalf("server %d has id %d", i, s.ID())
		}
	}
	old := e.Leader()
	if old == nil {
		t.Fatal("no leader in a started ensemble")
	}
	start := time.Now()
	old.Kill()
	if err := e.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("a quorum served again %s after the leader (%s) was killed", time.Since(start), old)
	if l := e.Leader(); l == nil || l == old {
		t.Fatalf("leader after kill: %v", l)
	}
	old.Restart()
	for {
		m, err := old.Mode(ctx)
		if err == nil {
			if m != "follower" {
				t.Fatalf("restarted old leader is %s, want follower", m)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("restarted server never served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
