package daemon

import (
	"fmt"
	"net"
	"strconv"

	"github.com/stormdock/stormdock/coord"
)

// AdvertiseAddr is the address this host is reached at by the others of a cluster on the
// store at storeURL: the local address of the interface that reaches the store's first
// server. Nothing is sent (a UDP socket only picks its route). An embedded store lives in
// one process, so its cluster is on one host: 127.0.0.1.
func AdvertiseAddr(storeURL string) (string, error) {
	t, err := coord.ParseURL(storeURL)
	if err != nil {
		return "", err
	}
	if t.Scheme != "zk" || len(t.Servers) == 0 {
		return "127.0.0.1", nil
	}
	var last error
	for _, s := range t.Servers {
		c, err := net.Dial("udp", s)
		if err != nil {
			last = err
			continue
		}
		ip := c.LocalAddr().(*net.UDPAddr).IP
		c.Close()
		return ip.String(), nil
	}
	return "", fmt.Errorf("find the address that reaches the store (give it with --advertise-addr): %w", last)
}

// advertisedAddr is the address (HOST:PORT) others reach a listener at: its own address, or,
// when it listens on every interface, the address that reaches the store.
func advertisedAddr(ln net.Listener, storeURL string) (string, error) {
	host, port, err := net.SplitHostPort(ln.Addr().String())
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if host, err = AdvertiseAddr(storeURL); err != nil {
			return "", err
		}
	}
	p, _ := strconv.Atoi(port)
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}
