package testenv

import (
	"net"
	"testing"
	"time"
)

// SlowHeaders plays a client that holds a server's connection by sending its request
// headers one byte at a time, every interval: it dials addr (plain TCP), writes a request
// line and then header bytes until the server closes the connection, and returns how long
// that took. It fails the test if the server still holds the connection after limit.
func SlowHeaders(t testing.TB, addr string, interval, limit time.Duration) time.Duration {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("slow client: %v", err)
	}
	defer conn.Close()
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		b := make([]byte, 4096)
		for {
			if _, err := conn.Read(b); err != nil {
				return
			}
		}
	}()
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nHost: slow\r\nX-Slow: ")); err != nil {
		t.Fatalf("slow client: %v", err)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	deadline := time.After(limit)
	for {
		select {
		case <-closed:
			return time.Since(start)
		case <-deadline:
			t.Fatalf("the server at %s still holds a client that has sent headers for %s", addr, limit)
		case <-tick.C:
			_, _ = conn.Write([]byte("a")) // fails once the server has closed
		}
	}
}
