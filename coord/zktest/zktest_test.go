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
