package zktest

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
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

// Pin is a dialer (coord.Options.Dialer) that, until released, connects only to one server,
// so that a test chooses the server a client starts on; it remembers where the client
// connected last.
type Pin struct {
	next func(network, addr string, timeout time.Duration) (net.Conn, error)

	mu   sync.Mutex
	only string
	last string
}

// NewPin returns a dialer pinned to addr that connects with next (nil: net.DialTimeout; a
// lab host's Dialer for a client on that host).
func NewPin(addr string, next func(network, addr string, timeout time.Duration) (net.Conn, error)) *Pin {
	if next == nil {
		next = net.DialTimeout
	}
	return &Pin{next: next, only: addr}
}

// Dial connects, to the pinned server only until Release.
func (d *Pin) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	only := d.only
	d.mu.Unlock()
	if only != "" && addr != only {
		return nil, fmt.Errorf("zktest: pinned to %s: %w", only, syscall.ECONNREFUSED)
	}
	c, err := d.next(network, addr, timeout)
	if err == nil {
		d.mu.Lock()
		d.last = addr
		d.mu.Unlock()
	}
	return c, err
}

// Release lets the client connect to any server.
func (d *Pin) Release() {
	d.mu.Lock()
	d.only = ""
	d.mu.Unlock()
}

// Last is the server the client connected to last.
func (d *Pin) Last() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}
