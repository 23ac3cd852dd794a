package netlab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Host is one machine of the lab: a network namespace whose only way out is eth0 on the
// lab's bridge.
type Host struct {
	lab  *Lab
	name string
	ns   string // namespace name, under /run/netns
	addr netip.Addr
	peer string // its veth's end on the bridge
	fd   *os.File

	mu  sync.Mutex
	cut bool
}

// Name is the host's name in the lab.
func (h *Host) Name() string { return h.name }

// IP is the host's address, as a string ("10.213.0.5").
func (h *Host) IP() string { return h.addr.String() }

// Addr is the host's address.
func (h *Host) Addr() netip.Addr { return h.addr }

// Path is the namespace's file (/run/netns/NAME), for nsenter --net.
func (h *Host) Path() string { return "/run/netns/" + h.ns }

// String names the host in test logs.
func (h *Host) String() string { return h.name + "(" + h.addr.String() + ")" }

// Command returns a command that runs name in the host's network namespace and nothing else
// of it: `nsenter --net=PATH -- name args...`. nsenter joins the namespace and executes name
// in its own process, so the command's pid is the program's. `ip netns exec` is not used: it
// also remounts /sys, hiding the cgroup hierarchies an agent needs.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + h.Path(), "--", name}, args...)...)
}

// CommandContext is Command bound to ctx as exec.CommandContext is.
func (h *Host) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + h.Path(), "--", name}, args...)...)
}

// DialContext connects from this host: the socket is made in the host's namespace (by a
// thread that joins it for that moment) and stays there, so the connection goes through
// eth0 and the host's cut rules like any of its processes'. addr must be an IP literal: a
// name would be resolved by goroutines outside the namespace.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.in(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a listener in the host's namespace (as DialContext makes its sockets): a
// server of the test's own, reachable at the host's address.
func (h *Host) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.in(func() error {
		var lc net.ListenConfig
		var err error
		ln, err = lc.Listen(ctx, network, addr)
		return err
	})
	return ln, err
}

// Dialer adapts DialContext to coord.Options.Dialer's shape.
func (h *Host) Dialer() func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return dialerOf(h.DialContext)
}

// in runs fn on an OS thread that has joined the host's network namespace. The net package
// makes a dial's socket on the calling goroutine (for one address, no parallel dials), so a
// socket made in fn belongs to the namespace. The thread returns to its own namespace after
// fn; if it cannot, it stays locked and dies with the goroutine instead of serving others.
func (h *Host) in(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netlab: own namespace: %w", err)
	}
	defer self.Close()
	if err := unix.Setns(int(h.fd.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netlab: enter %s: %w", h.ns, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("netlab: leave %s: %w (thread retired)", h.ns, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// PIDs lists the processes whose network namespace is the host's.
func (h *Host) PIDs() ([]int, error) {
	return pidsIn(h.Path())
}
