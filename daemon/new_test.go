package daemon

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/healthcheck"
)

// A constructor that fails part-way releases what it built and returns the error: it does
// not panic on the nil result a failing return leaves behind (up with a cgroup parent it may
// not write used to end in a nil dereference instead of the driver's one-line error).
func TestConstructorsFailCleanly(t *testing.T) {
	ctx := context.Background()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"drivers: second isolation unknown", func() error {
			_, err := NewDrivers(ctx, DriverConfig{Isolation: []string{cluster.IsolationProcess, "bogus"}, Cgroups: CgroupsOff,
				ProcessState: t.TempDir()})
			return err
		}, `unknown isolation "bogus"`},
		{"agent: store URL", func() error {
			health := healthcheck.DefaultConfig()
			health.CgroupParent = ""
			_, err := NewAgent(ctx, AgentConfig{Node: cluster.Node{ID: "n1", DC: "dc-a", Rack: "r1", Slots: 1},
				Store: "bogus://x", StateDir: filepath.Join(t.TempDir(), "state"), Health: health,
				Drivers: DriverConfig{Isolation: []string{cluster.IsolationProcess}, Cgroups: CgroupsOff}})
			return err
		}, "bogus://x"},
		{"master: address in use", func() error {
			_, err := NewMaster(ctx, MasterConfig{Store: "mem://", Listen: busy.Addr().String(), DataDir: t.TempDir()})
			return err
		}, "listen on " + busy.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}
