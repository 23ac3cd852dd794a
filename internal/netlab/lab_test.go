package netlab_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/netlab"
	"github.com/stormdock/stormdock/internal/testenv"
)

// echo serves one line back per connection on the host's address.
func echo(t *testing.T, h *netlab.Host) string {
	t.Helper()
	ln, err := h.Listen(context.Background(), "tcp", h.IP()+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line over c and waits up to d for it to come back.
func roundTrip(c net.Conn, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("got %q", line)
	}
	return nil
}

// reach dials addr from h (nil: the control host) and round-trips a line within d.
func reach(l *netlab.Lab, h *netlab.Host, addr string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	dial := l.DialContext
	if h != nil {
		dial = h.DialContext
	}
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return roundTrip(c, d)
}

func TestHostsReachEachOtherAndNothingElse(t *testing.T) {
	l := netlab.ForTest(t)
	hs := l.AddHosts(t, "h1", "h2")
	a1, a2 := echo(t, hs[0]), echo(t, hs[1])
	for _, c := range []struct {
		from *netlab.Host
		to   string
	}{{nil, a1}, {nil, a2}, {hs[0], a2}, {hs[1], a1}, {hs[0], a1}} {
		if err := reach(l, c.from, c.to, 10*time.Second); err != nil {
			t.Errorf("from %v to %s: %v", c.from, c.to, err)
		}
	}
	// This machine's own network has no route into the lab.
	if c, err := net.DialTimeout("tcp", a1, time.Second); err == nil {
		c.Close()
		t.Errorf("the test's own network reached %s", a1)
	}
	// Processes run in the host's network only: they see its address, and the machine's
	// cgroup hierarchies (nsenter --net leaves /sys alone).
	out, err := hs[0].Command("ip", "-o", "-4", "addr", "show").CombinedOutput()
	if err != nil || !strings.Contains(string(out), hs[0].IP()+"/") || strings.Contains(string(out), hs[1].IP()+"/") {
		t.Errorf("ip addr in %s: %v\n%s", hs[0], err, out)
	}
	mine, _ := os.ReadDir("/sys/fs/cgroup")
	out, err = hs[0].Command("ls", "/sys/fs/cgroup").CombinedOutput()
	if err != nil || len(strings.Fields(string(out))) != len(mine) {
		t.Errorf("/sys/fs/cgroup in %s: %v: %q, want the %d entries seen outside", hs[0], err, out, len(mine))
	}
}

func TestCutDropsBothWaysAndHeals(t *testing.T) {
	l := netlab.ForTest(t)
	hs := l.AddHosts(t, "h1", "h2", "h3")
	h1, h2, h3 := hs[0], hs[1], hs[2]
	a1, a2 := echo(t, h1), echo(t, h2)
	ctx := context.Background()

	// A connection made before the cut, to see it hang and come back.
	before, err := h2.DialContext(ctx, "tcp", a1)
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	if err := roundTrip(before, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	if err := h1.Cut(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if !h1.IsCut() {
		t.Error("IsCut false after Cut")
	}
	// Dropped, not refused: a dial hangs until its deadline, as across a real partition.
	for _, c := range []struct {
		name string
		from *netlab.Host
		to   string
	}{{"in from h2", h2, a1}, {"in from the control host", nil, a1}, {"out to h2", h1, a2}} {
		err := reach(l, c.from, c.to, 500*time.Millisecond)
		var ne net.Error
		if err == nil || !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s with h1 cut: %v, want a timeout", c.name, err)
		}
	}
	if err := roundTrip(before, 500*time.Millisecond); err == nil {
		t.Error("an established connection still carried data across the cut")
	}
	// The exception, and the host's own address over loopback, still work.
	if err := reach(l, h3, a1, 10*time.Second); err != nil {
		t.Errorf("h3, excepted from the cut: %v", err)
	}
	if err := reach(l, h1, a1, 10*time.Second); err != nil {
		t.Errorf("h1 to itself: %v", err)
	}

	if err := h1.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from *netlab.Host
		to   string
	}{{h2, a1}, {nil, a1}, {h1, a2}} {
		if err := reach(l, c.from, c.to, 10*time.Second); err != nil {
			t.Errorf("from %v to %s after the heal: %v", c.from, c.to, err)
		}
	}
	// TCP retransmits what the cut dropped: the old connection carries data again.
	_ = before.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(before).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ping") {
		t.Errorf("the connection made before the cut, after the heal: %q, %v", line, err)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	testenv.Root(t)
	ctx := context.Background()
	l, err := netlab.New(ctx, netlab.Options{Logf: t.Logf})
	if errors.Is(err, netlab.ErrUnavailable) {
		testenv.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	h, err := l.AddHost(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	sleep := h.Command("sleep", "1000")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sleep.Wait() }()
	// Started means nsenter runs; the process is in the host once nsenter has joined it.
	testenv.Eventually(t, "the process in the host", 10*time.Second, func() bool {
		pids, err := h.PIDs()
		return err == nil && len(pids) == 1 && pids[0] == sleep.Process.Pid
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if left := namespaces(t, l.Prefix()); len(left) > 0 {
		t.Errorf("namespaces left after Close: %v", left)
	}
	testenv.Eventually(t, "the process in the host killed", 10*time.Second, func() bool {
		return syscall.Kill(sleep.Process.Pid, 0) != nil || zombie(sleep.Process.Pid)
	})
}

func TestNewRefusesASubnetInUse(t *testing.T) {
	testenv.Root(t)
	_, err := netlab.New(context.Background(), netlab.Options{Subnet: netip.MustParsePrefix("127.0.0.0/24")})
	if err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("New on 127.0.0.0/24: %v, want an overlap error", err)
	}
}

// A test binary killed before its cleanup leaves its lab behind, processes included; the next
// lab removes it, and leaves a live run's alone.
func TestSweepRemovesTheLabOfAKilledRun(t *testing.T) {
	if os.Getenv("NETLAB_HELPER") == "1" {
		helperRun()
		return
	}
	live := netlab.ForTest(t)
	live.AddHosts(t, "h1")

	cmd := exec.Command(os.Args[0], "-test.run=^TestSweepRemovesTheLabOfAKilledRun$")
	cmd.Env = append(os.Environ(), "NETLAB_HELPER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var prefix string
	var sleeper int
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if _, err := fmt.Sscanf(sc.Text(), "lab %s %d", &prefix, &sleeper); err == nil {
			break
		}
	}
	if prefix == "" {
		_ = cmd.Process.Kill()
		t.Fatalf("the helper run printed no lab (%v)", sc.Err())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if len(namespaces(t, prefix)) == 0 {
		t.Fatalf("the killed run left no namespace of %s: nothing to sweep", prefix)
	}

	if err := netlab.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left := namespaces(t, prefix); len(left) > 0 {
		t.Errorf("namespaces of the killed run left: %v", left)
	}
	testenv.Eventually(t, "the killed run's process in its lab killed", 10*time.Second, func() bool {
		return syscall.Kill(sleeper, 0) != nil || zombie(sleeper)
	})
	if len(namespaces(t, live.Prefix())) != 3 { // bridge, ctl, h1
		t.Errorf("the live lab's namespaces after the sweep: %v", namespaces(t, live.Prefix()))
	}
	if err := reach(live, nil, echo(t, live.Host("h1")), 10*time.Second); err != nil {
		t.Errorf("the live lab after the sweep: %v", err)
	}
}

// helperRun builds a lab with a process in it, says so, and waits to be killed.
func helperRun() {
	ctx := context.Background()
	l, err := netlab.New(ctx, netlab.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h, err := l.AddHost(ctx, "h1")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sleep := h.Command("sleep", "1000")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // outlives this process, as an agent's keeper would
	if err := sleep.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		if pids, _ := h.PIDs(); len(pids) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("lab %s %d\n", l.Prefix(), sleep.Process.Pid)
	select {}
}

func namespaces(t *testing.T, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir("/run/netns")
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err != nil || strings.Contains(string(b), ") Z ")
}

// A rejecting host answers at once, both ways: a dial to it is refused (as if nothing
// listened), a dial from it fails the same way; its exceptions still reach it; healed, it is
// reached again.
func TestRejectRefusesBothWaysAndHeals(t *testing.T) {
	l := netlab.ForTest(t)
	hs := l.AddHosts(t, "h1", "h2", "h3")
	h1, h2, h3 := hs[0], hs[1], hs[2]
	a1, a2 := echo(t, h1), echo(t, h2)
	ctx := context.Background()
	if err := h1.Reject(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if !h1.IsCut() {
		t.Error("IsCut false after Reject")
	}
	for _, c := range []struct {
		name string
		from *netlab.Host
		to   string
	}{{"in from h2", h2, a1}, {"in from the control host", nil, a1}, {"out to h2", h1, a2}} {
		// A long deadline: a refusal comes at once, a drop would take all of it.
		err := reach(l, c.from, c.to, 20*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("%s with h1 rejecting: %v, want connection refused", c.name, err)
		}
	}
	if err := reach(l, h3, a1, 10*time.Second); err != nil {
		t.Errorf("h3, excepted: %v", err)
	}
	if err := h1.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from *netlab.Host
		to   string
	}{{h2, a1}, {nil, a1}, {h1, a2}} {
		if err := reach(l, c.from, c.to, 10*time.Second); err != nil {
			t.Errorf("from %v to %s after the heal: %v", c.from, c.to, err)
		}
	}
}

// CutFrom cuts the link between two hosts alone: both still reach everyone else.
func TestCutFromCutsOneLink(t *testing.T) {
	l := netlab.ForTest(t)
	hs := l.AddHosts(t, "h1", "h2", "h3")
	h1, h2, h3 := hs[0], hs[1], hs[2]
	a1, a2, a3 := echo(t, h1), echo(t, h2), echo(t, h3)
	ctx := context.Background()
	if err := h1.CutFrom(ctx, h2); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		from *netlab.Host
		to   string
	}{{"h2 to h1", h2, a1}, {"h1 to h2", h1, a2}} {
		err := reach(l, c.from, c.to, 500*time.Millisecond)
		var ne net.Error
		if err == nil || !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s with the link cut: %v, want a timeout", c.name, err)
		}
	}
	for _, c := range []struct {
		name string
		from *netlab.Host
		to   string
	}{{"h3 to h1", h3, a1}, {"h1 to h3", h1, a3}, {"h3 to h2", h3, a2}, {"h2 to h3", h2, a3}, {"control to h1", nil, a1}} {
		if err := reach(l, c.from, c.to, 10*time.Second); err != nil {
			t.Errorf("%s, not cut: %v", c.name, err)
		}
	}
	if err := h1.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if err := reach(l, h2, a1, 10*time.Second); err != nil {
		t.Errorf("h2 to h1 after the heal: %v", err)
	}
}
