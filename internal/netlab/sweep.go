package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// namePrefix starts every namespace a lab makes; the run's pid and start time follow, so
// that a namespace whose run is gone is told from one of a run still going.
const namePrefix = "sdlab-"

// runPrefix is the prefix of the namespaces of the run of process pid: sdlab-PID-START-, with
// START the process's start time in clock ticks after boot (a reused pid has another).
func runPrefix(pid int) (string, error) {
	start, err := procStart(pid)
	if err != nil {
		return "", fmt.Errorf("netlab: own start time: %w", err)
	}
	return fmt.Sprintf("%s%d-%d-", namePrefix, pid, start), nil
}

// procStart reads field 22 of /proc/PID/stat: when the process started, in ticks after boot.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// After the command: state is field 3, so starttime (22) is the 20th here.
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// owner parses a lab namespace's name into the run that made it.
func owner(ns string) (pid int, start uint64, ok bool) {
	rest, ok := strings.CutPrefix(ns, namePrefix)
	if !ok {
		return 0, 0, false
	}
	f := strings.SplitN(rest, "-", 3)
	if len(f) < 3 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(f[0])
	start, err2 := strconv.ParseUint(f[1], 10, 64)
	return pid, start, err1 == nil && err2 == nil
}

// Sweep removes the namespaces of labs whose run is over (a test binary killed before its
// cleanup, a crashed chaos run), killing every process still inside them. Labs of runs still
// going are left alone. New calls it, so every lab starts by removing what killed runs left.
func Sweep(ctx context.Context) error {
	ents, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		pid, start, ok := owner(e.Name())
		if !ok {
			continue
		}
		if s, err := procStart(pid); err == nil && s == start {
			continue // its run is alive
		}
		if err := removeNamespace(ctx, e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeNamespace kills every process in the namespace (again while any is left: a dying
// agent's keeper or a launcher may fork meanwhile) and deletes it. A missing namespace is
// not an error.
func removeNamespace(ctx context.Context, ns string) error {
	path := "/run/netns/" + ns
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := pidsIn(path)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netlab: namespace %s: processes %v survive SIGKILL", ns, pids)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return run(ctx, "ip", "netns", "del", ns)
}

// pidsIn lists the processes (not this one) whose network namespace is the one bound at path.
// Zombies count: they are gone once their parent, also in the namespace or not, reaps them.
func pidsIn(path string) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue
		}
		if st.Ino == want.Ino && st.Dev == want.Dev && !zombie(pid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// checkUnused refuses a subnet that overlaps an address or a route (other than the default
// route) of this machine's own network.
func checkUnused(subnet netip.Prefix) error {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("netlab: this machine's addresses: %w", err)
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		p, ok := prefixOf(ipn)
		if ok && p.Overlaps(subnet) {
			return fmt.Errorf("netlab: subnet %s overlaps this machine's address %s: choose another (Options.Subnet)", subnet, ipn)
		}
	}
	routes, err := os.ReadFile("/proc/net/route")
	if err != nil {
		return fmt.Errorf("netlab: this machine's routes: %w", err)
	}
	for _, line := range strings.Split(string(routes), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		dst, err1 := strconv.ParseUint(f[1], 16, 32)
		mask, err2 := strconv.ParseUint(f[7], 16, 32)
		if err1 != nil || err2 != nil || mask == 0 {
			continue
		}
		// /proc/net/route prints the addresses in host (little-endian) byte order.
		le := func(v uint64) net.IP { return net.IPv4(byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
		p, ok := prefixOf(&net.IPNet{IP: le(dst), Mask: net.IPMask(le(mask).To4())})
		if ok && p.Overlaps(subnet) {
			return fmt.Errorf("netlab: subnet %s overlaps this machine's route %s via %s: choose another (Options.Subnet)", subnet, p, f[0])
		}
	}
	return nil
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	if a.Is4In6() {
		a = a.Unmap()
		if bits > 32 {
			bits -= 96
		}
	}
	return netip.PrefixFrom(a, bits).Masked(), true
}

// dialerOf turns a context dialer into coord.Options.Dialer's shape.
func dialerOf(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(network, addr string, timeout time.Duration) (net.Conn, error) {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return dial(ctx, network, addr)
	}
}
