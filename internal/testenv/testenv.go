// Package testenv holds the helpers the tests of every package share, as Go's tree has its own:
// real parts (ZooKeeper, dockerd, cgroups; under CI=true a missing one fails), waits, binaries, metrics.
package testenv

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CI reports whether the tests run under CI, where nothing may skip for a missing part.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing fails the test under CI and skips it elsewhere, saying which part is missing and
// how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("required real part missing (CI=true): "+format, args...)
	}
	t.Skipf("skipped, real part missing (run ./scripts/test to start it): "+format, args...)
}

// ZKAddr returns the address of the shared ZooKeeper server started by scripts/test
// (STORMDOCK_ZK, default 127.0.0.1:2181), after checking that it answers.
func ZKAddr(t testing.TB) string {
	t.Helper()
	addr := os.Getenv("STORMDOCK_ZK")
	if addr == "" {
		addr = "127.0.0.1:2181"
	}
	if err := ruok(addr); err != nil {
		Missing(t, "ZooKeeper at %s: %v", addr, err)
	}
	return addr
}

func ruok(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ruok")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := c.Read(buf); err != nil {
		return err
	}
	return nil
}

// ZKServerScript returns the path of zkServer.sh from the Debian zookeeper package, for tests
// that start, kill and restart a server of their own.
func ZKServerScript(t testing.TB) string {
	t.Helper()
	p := os.Getenv("STORMDOCK_ZK_SERVER")
	if p == "" {
		p = "/usr/share/zookeeper/bin/zkServer.sh"
	}
	if _, err := os.Stat(p); err != nil {
		Missing(t, "zkServer.sh: %v (apt-get install zookeeper)", err)
	}
	return p
}

// DockerSocket checks that a Docker engine answers on DOCKER_HOST or the default socket.
func DockerSocket(t testing.TB) {
	t.Helper()
	host := os.Getenv("DOCKER_HOST")
	path := "/var/run/docker.sock"
	if host != "" {
		if len(host) > 7 && host[:7] == "unix://" {
			path = host[7:]
		} else {
			return // a TCP engine: the client reports reachability itself
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		Missing(t, "dockerd at %s: %v", path, err)
		return
	}
	c.Close()
}

// Root checks that the test runs as root, which cgroup and container tests need.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (cgroups need it), running as uid %d", os.Geteuid())
	}
}

// Cgroups checks that a cgroup hierarchy is mounted and writable.
func Cgroups(t testing.TB) {
	t.Helper()
	Root(t)
	for _, p := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cgroup.controllers"} {
		if _, err := os.Stat(p); err == nil {
			return
		}
	}
	Missing(t, "no cgroup v1 memory hierarchy or cgroup v2 mount under %s", filepath.Clean("/sys/fs/cgroup"))
}
