package zktest

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Partition is a dialer (coord.Options.Dialer) that lets a test cut one client off from
// ZooKeeper: cut, it drops the client's connections and refuses new ones, as a network
// partition would, while the server keeps running; Heal lets it reconnect.
type Partition struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

// Dial connects unless the partition is cut.
func (p *Partition) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut {
		time.Sleep(50 * time.Millisecond)
		return nil, errors.New("zktest: partitioned")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	return c, nil
}

// Cut drops every connection made through the dialer and refuses new ones.
func (p *Partition) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Heal lets the client connect again.
func (p *Partition) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}
