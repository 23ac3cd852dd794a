package api

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// TestServerCutsSlowClients: a client that trickles its headers is cut off after
// ReadHeaderTimeout, and one that sends more header bytes than MaxHeaderBytes is refused.
func TestServerCutsSlowClients(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	took := testenv.SlowHeaders(t, ln.Addr().String(), 100*time.Millisecond, testenv.Timeout(ReadHeaderTimeout+10*time.Second))
	if took < ReadHeaderTimeout-100*time.Millisecond {
		t.Errorf("cut off after %s, before the %s header timeout: the limit is not what it says", took, ReadHeaderTimeout)
	}
	t.Logf("figure: a client sending one header byte per 100ms is cut off after %s (ReadHeaderTimeout %s)", took.Round(time.Millisecond), ReadHeaderTimeout)

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	big := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2*MaxHeaderBytes) + "\r\n\r\n"
	go func() { _, _ = conn.Write([]byte(big)) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d KiB of headers: %s; want 431", 2*MaxHeaderBytes>>10, resp.Status)
	}
}
