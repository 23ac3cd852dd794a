package testenv

import (
	"net"
	"testing"
)

// FreePort returns a loopback port that was free a moment ago, for a server a test starts.
// Another process may take it before the server binds it; the server then fails to start
// and says so.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
