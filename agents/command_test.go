package agents

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/cluster"
)

// TestAgentCommand: the command line the agent gives a worker resolves a program named
// stormdock to the binary the worker can see and, with leases, is the launcher's (the
// Launcher binary for process workers; for docker workers the launcher mounted into the
// container, or the image's stormdock when the agent has no static one), which reads it back
// whole; a docker worker without a command gets the launcher's part, the image's own
// command to follow.
func TestAgentCommand(t *testing.T) {
	cfg := Config{Self: "/usr/bin/sd", Launcher: "/usr/bin/sd-shim", ContainerSelf: "/stormdock", LeaseTTL: 3 * time.Second}
	wa := cluster.WorkerAssignment{Command: []string{"stormdock", "worker", "wordcount"}, Grace: cluster.Duration(5 * time.Second)}
	tests := []struct {
		name     string
		mode     string
		noLease  bool
		mounted  bool // the agent has a static launcher for docker workers (dockerlaunch.go)
		command  []string
		want     []string // the worker's own command, under the launcher unless noLease
		self     string   // the launcher's binary
		imageCmd bool     // the image's own command follows (isolation.Spec.ImageCommand)
	}{
		{"process", cluster.IsolationProcess, false, true, wa.Command, []string{"/usr/bin/sd", "worker", "wordcount"}, "/usr/bin/sd-shim", false},
		{"docker", cluster.IsolationDocker, false, true, wa.Command, []string{"/stormdock", "worker", "wordcount"}, containerLauncher, false},
		{"docker without a static launcher", cluster.IsolationDocker, false, false, wa.Command, []string{"/stormdock", "worker", "wordcount"}, "/stormdock", false},
		{"docker, the image's own command", cluster.IsolationDocker, false, true, nil, nil, containerLauncher, true},
		{"other program", cluster.IsolationProcess, false, true, []string{"sleep", "stormdock"}, []string{"sleep", "stormdock"}, "/usr/bin/sd-shim", false},
		{"no lease", cluster.IsolationProcess, true, true, wa.Command, []string{"/usr/bin/sd", "worker", "wordcount"}, "", false},
		{"no lease, the image's own command", cluster.IsolationDocker, true, true, nil, nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.NoLease = tt.noLease
			a := &Agent{cfg: c}
			if tt.mounted {
				a.dockerLauncher = "/state/" + dockerLauncherFile
			}
			w := wa
			w.Command = slices.Clone(tt.command)
			got := a.command(w, tt.mode, "/leases/x")
			if !slices.Equal(w.Command, tt.command) {
				t.Fatalf("the assignment's command changed to %q", w.Command)
			}
			if imageCommand(w, tt.mode) != tt.imageCmd {
				t.Fatalf("imageCommand %v, want %v", !tt.imageCmd, tt.imageCmd)
			}
			if tt.noLease {
				if !slices.Equal(got, tt.want) {
					t.Fatalf("command %q, want %q", got, tt.want)
				}
				return
			}
			if len(got) < 2 || got[0] != tt.self || got[1] != launcher.Command {
				t.Fatalf("command %q, want %s %s ...", got, tt.self, launcher.Command)
			}
			if tt.imageCmd && got[len(got)-1] != "--" {
				t.Fatalf("command %q: the image's own command must follow a closing --", got)
			}
			var lc launcher.Config
			if err := lc.Parse(got[2:]); err != nil {
				t.Fatal(err)
			}
			want := launcher.Config{Lease: "/leases/x", TTL: cfg.LeaseTTL, Grace: 5 * time.Second, Command: tt.want}
			if !reflect.DeepEqual(lc, want) {
				t.Fatalf("launcher reads %+v, want %+v", lc, want)
			}
		})
	}
}

// The launcher's default grace, which it cannot import from package cluster, is a job's.
func TestLauncherDefaultGrace(t *testing.T) {
	if launcher.DefaultGrace != cluster.DefaultGracePeriod {
		t.Fatalf("launcher.DefaultGrace %s, cluster.DefaultGracePeriod %s", launcher.DefaultGrace, cluster.DefaultGracePeriod)
	}
}
