package agents

import (
	"net"
	"strconv"
	"testing"

	"github.com/stormdock/stormdock/cluster"
)

// TestAllocPortSkipsBusyPorts: a port of the agent's range that another program listens on
// is not given to a worker (it could not serve there), nor one another worker has.
func TestAllocPortSkipsBusyPorts(t *testing.T) {
	base, held := busyRange(t)
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	// base and base+2 are another program's; base+1 is a worker's.
	r := &run{a: &Agent{cfg: Config{PortBase: base, Node: cluster.Node{Addr: "127.0.0.1"}}},
		workers: map[string]*slot{"w0": {id: "w0", port: base + 1}}}
	if got := r.allocPort(); got != base+3 {
		t.Errorf("allocPort = %d, want %d: %d and %d are listened on, %d is a worker's", got, base+3, base, base+2, base+1)
	}
	// An advertised address that is not this host's says nothing about the ports.
	r.a.cfg.Node.Addr = "192.0.2.1"
	if got := r.allocPort(); got != base {
		t.Errorf("with an address not of this host, allocPort = %d, want the range's first unused by workers, %d", got, base)
	}
}

// busyRange finds four ports in a row, free but for base and base+2, which it listens on
// (a port the kernel gave a moment ago may be taken again: it tries a few).
func busyRange(t *testing.T) (int, []net.Listener) {
	t.Helper()
	listen := func(port int) net.Listener {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil
		}
		return ln
	}
	for range 20 {
		probe := listen(0)
		if probe == nil {
			continue
		}
		base := probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		if base > 65000 {
			continue
		}
		a, c := listen(base), listen(base+2)
		if a != nil && c != nil && portFree("127.0.0.1", base+1) && portFree("127.0.0.1", base+3) {
			return base, []net.Listener{a, c}
		}
		for _, ln := range []net.Listener{a, c} {
			if ln != nil {
				ln.Close()
			}
		}
	}
	t.Fatal("found no four ports in a row to test with")
	return 0, nil
}
