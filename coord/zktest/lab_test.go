package zktest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Servers on lab hosts: each in its host's network, on its address, reached through the lab.
func TestStandaloneOnALabHost(t *testing.T) {
	lab := netlab.ForTest(t)
	hs := lab.AddHosts(t, "zk1")
	s := zktest.Start(t, zktest.Options{Hosts: []zktest.Host{hs[0]}, Dial: lab.DialContext})
	if !strings.HasPrefix(s.Addr(), hs[0].IP()+":") {
		t.Errorf("server address %s, want one on %s", s.Addr(), hs[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m, err := s.Mode(ctx); err != nil || m != "standalone" {
		t.Fatalf("mode %q, %v", m, err)
	}
	s.Restart()
	if m, err := s.Mode(ctx); err != nil || m != "standalone" {
		t.Fatalf("mode after a restart %q, %v", m, err)
	}
}

func TestEnsembleOnLabHostsSurvivesTheLeadersHostCut(t *testing.T) {
	lab := netlab.ForTest(t)
	hs := lab.AddHosts(t, "zk1", "zk2", "zk3")
	e := zktest.StartEnsemble(t, 3, zktest.Options{Hosts: []zktest.Host{hs[0], hs[1], hs[2]}, Dial: lab.DialContext})
	leader := e.Leader()
	if leader == nil {
		t.Fatal("no leader")
	}
	host := leader.Host().(*netlab.Host)
	ctx := context.Background()
	start := time.Now()
	if err := host.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	var next *zktest.Server
	testenv.Eventually(t, "a new leader on another host", 60*time.Second, func() bool {
		next = e.Leader()
		return next != nil && next != leader
	})
	wctx, cancel := context.WithTimeout(ctx, testenv.Timeout(60*time.Second))
	defer cancel()
	if err := e.WaitServing(wctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: ZooKeeper leader's host cut (tick %s): a new leader serving after %s", e.TickTime(), time.Since(start).Round(time.Millisecond))
	if err := host.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWith(t, "the old leader serving again after the heal", 60*time.Second, func() (bool, string) {
		m, err := leader.Mode(ctx)
		return err == nil, m
	})
}
