// Package netlab builds a network of hosts on one Linux machine for tests: network namespaces
// on a bridge with addresses of their own, processes run inside them, and partitions cut and healed.
package netlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"
)

// ErrUnavailable is returned by New when this machine cannot build a lab: not root, or ip,
// iptables-restore or nsenter missing.
var ErrUnavailable = errors.New("netlab: unavailable")

// DefaultSubnet is where hosts get their addresses. The addresses exist only inside the lab's
// own namespaces (the machine's own network gets none), so concurrent labs cannot clash; New
// still refuses a subnet that overlaps an address or route of this machine, so that no lab
// address ever shadows a real one in a test's view.
var DefaultSubnet = netip.MustParsePrefix("10.213.0.0/24")

// Options configure a lab.
type Options struct {
	// Subnet holds the hosts' addresses (IPv4, at most /24 of hosts used). Default DefaultSubnet.
	Subnet netip.Prefix
	// Logf, when set, receives a line per change to the lab (hosts added, cut, healed).
	Logf func(format string, args ...any)
}

// Lab is a set of hosts, each a network namespace with one interface (eth0) on a bridge that
// lives in a namespace of its own, plus a control host (Lab.DialContext) that is never cut,
// from which the test process reaches the others. Every namespace is named with the run's
// prefix (sdlab-PID-START-), so that leftovers of a killed run are found and removed by the
// next one (Sweep).
type Lab struct {
	prefix string
	subnet netip.Prefix
	logf   func(format string, args ...any)
	bridge string // namespace holding the bridge br0

	mu     sync.Mutex
	hosts  []*Host
	next   netip.Addr
	closed bool
	ctl    *Host
}

var hostName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,30}$`)

// New builds an empty lab (its bridge and its control host) after removing what dead runs
// left behind. Close removes everything it made.
func New(ctx context.Context, opts Options) (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if !opts.Subnet.IsValid() {
		opts.Subnet = DefaultSubnet
	}
	if !opts.Subnet.Addr().Is4() || opts.Subnet.Bits() > 29 {
		return nil, fmt.Errorf("netlab: subnet %s: want an IPv4 prefix of /29 or larger", opts.Subnet)
	}
	if err := checkUnused(opts.Subnet); err != nil {
		return nil, err
	}
	if err := Sweep(ctx); err != nil {
		return nil, fmt.Errorf("netlab: removing leftovers of dead runs: %w", err)
	}
	prefix, err := runPrefix(os.Getpid())
	if err != nil {
		return nil, err
	}
	l := &Lab{prefix: prefix, subnet: opts.Subnet.Masked(), logf: opts.Logf, bridge: prefix + "br"}
	if l.logf == nil {
		l.logf = func(string, ...any) {}
	}
	l.next = l.subnet.Addr().Next()
	if err := run(ctx, "ip", "netns", "add", l.bridge); err != nil {
		return nil, err
	}
	if err := l.ip(ctx, l.bridge, "link", "add", "br0", "type", "bridge"); err != nil {
		_ = l.Close()
		return nil, err
	}
	if err := l.ip(ctx, l.bridge, "link", "set", "br0", "up"); err != nil {
		_ = l.Close()
		return nil, err
	}
	ctl, err := l.AddHost(ctx, "ctl")
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	l.ctl = ctl
	return l, nil
}

// Available reports why this machine cannot build a lab (ErrUnavailable), or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: network namespaces need root (running as uid %d)", ErrUnavailable, os.Geteuid())
	}
	for _, tool := range []struct{ bin, pkg string }{{"ip", "iproute2"}, {"iptables-restore", "iptables"}, {"nsenter", "util-linux"}} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			return fmt.Errorf("%w: %s not found (apt-get install %s)", ErrUnavailable, tool.bin, tool.pkg)
		}
	}
	return nil
}

// AddHost makes a host: a namespace with loopback and eth0 up, eth0 on the bridge with the
// next free address of the subnet. name is a short DNS label, unique in the lab.
func (l *Lab) AddHost(ctx context.Context, name string) (*Host, error) {
	if !hostName.MatchString(name) {
		return nil, fmt.Errorf("netlab: host name %q: want lower-case letters, digits and '-', at most 31", name)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("netlab: lab closed")
	}
	for _, h := range l.hosts {
		if h.name == name {
			l.mu.Unlock()
			return nil, fmt.Errorf("netlab: host %s exists", name)
		}
	}
	addr := l.next
	if !l.subnet.Contains(addr) || !l.subnet.Contains(addr.Next()) { // the last one is broadcast
		l.mu.Unlock()
		return nil, fmt.Errorf("netlab: subnet %s is full", l.subnet)
	}
	l.next = addr.Next()
	idx := len(l.hosts)
	h := &Host{lab: l, name: name, ns: l.prefix + name, addr: addr, peer: fmt.Sprintf("v%d", idx)}
	l.hosts = append(l.hosts, h)
	l.mu.Unlock()

	steps := [][]string{
		{"netns", "add", h.ns},
		{"-n", l.bridge, "link", "add", h.peer, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
		{"-n", l.bridge, "link", "set", h.peer, "master", "br0", "up"},
		{"-n", h.ns, "addr", "add", fmt.Sprintf("%s/%d", addr, l.subnet.Bits()), "dev", "eth0"},
		{"-n", h.ns, "link", "set", "eth0", "up"},
		{"-n", h.ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(ctx, "ip", s...); err != nil {
			return nil, fmt.Errorf("netlab: host %s: %w", name, err)
		}
	}
	f, err := os.Open(h.Path())
	if err != nil {
		return nil, fmt.Errorf("netlab: host %s: %w", name, err)
	}
	h.fd = f
	l.logf("netlab: host %s at %s (namespace %s)", name, addr, h.ns)
	return h, nil
}

// Host returns the host of that name, or nil.
func (l *Lab) Host(name string) *Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.hosts {
		if h.name == name {
			return h
		}
	}
	return nil
}

// Hosts returns the hosts in the order they were added (the control host first).
func (l *Lab) Hosts() []*Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Host(nil), l.hosts...)
}

// Prefix is the run's prefix of every namespace name.
func (l *Lab) Prefix() string { return l.prefix }

// DialContext opens a connection from the control host, which reaches every host that is not
// cut: how the test process talks to what runs in the lab (its own network reaches none of it).
func (l *Lab) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return l.ctl.DialContext(ctx, network, addr)
}

// Dialer adapts the lab's DialContext to coord.Options.Dialer's shape.
func (l *Lab) Dialer() func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return dialerOf(l.DialContext)
}

// Close kills every process left in the lab's namespaces and removes them, the bridge's last.
// It is safe to call more than once.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	hosts := append([]*Host(nil), l.hosts...)
	l.mu.Unlock()
	ctx := context.Background()
	var errs []error
	for i := len(hosts) - 1; i >= 0; i-- {
		h := hosts[i]
		if h.fd != nil {
			h.fd.Close()
		}
		if err := removeNamespace(ctx, h.ns); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeNamespace(ctx, l.bridge); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (l *Lab) ip(ctx context.Context, ns string, args ...string) error {
	return run(ctx, "ip", append([]string{"-n", ns}, args...)...)
}

// run runs a command and returns its output in the error when it fails.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
