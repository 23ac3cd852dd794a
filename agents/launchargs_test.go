package agents

import (
	"errors"
	"flag"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

// FuzzLaunchArgs: what Args writes, Parse reads back exactly, whatever the lease path, the
// durations and the worker's command (which may look like flags, or be "--").
func FuzzLaunchArgs(f *testing.F) {
	f.Add("/var/lib/stormdock/agent/leases/n1.wc.0", int64(2*time.Second), int64(10*time.Second), "/stormdock\x00worker\x00wordcount")
	f.Add("", int64(0), int64(0), "")
	f.Add("-lease", int64(-1), int64(math.MaxInt64), "--\x00-h\x00--lease\x00x")
	f.Add("a b=c", int64(math.MinInt64), int64(1), "\x00")
	f.Fuzz(func(t *testing.T, lease string, ttl, grace int64, cmd string) {
		var command []string
		if cmd != "" {
			command = strings.Split(cmd, "\x00")
		}
		want := LaunchConfig{Lease: lease, TTL: time.Duration(ttl), Grace: time.Duration(grace), Command: command}
		var got LaunchConfig
		if err := got.Parse(want.Args()); err != nil {
			t.Fatalf("Parse(%q): %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse(Args(x)) = %+v, want %+v (args %q)", got, want, want.Args())
		}
	})
}

// TestLaunchParse reads command lines written by hand, the way the launcher's flags have
// always been accepted.
func TestLaunchParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    LaunchConfig
		wantErr string
		help    bool
	}{
		{name: "grace defaults", args: []string{"--lease", "L", "--ttl", "1s", "--", "w", "-x"},
			want: LaunchConfig{Lease: "L", TTL: time.Second, Grace: cluster.DefaultGracePeriod, Command: []string{"w", "-x"}}},
		{name: "command without --", args: []string{"-lease=L", "-ttl=2s", "--grace", "0s", "sleep", "1"},
			want: LaunchConfig{Lease: "L", TTL: 2 * time.Second, Command: []string{"sleep", "1"}}},
		{name: "no command is for the caller to refuse", args: []string{"--lease", "L", "--ttl", "1s"},
			want: LaunchConfig{Lease: "L", TTL: time.Second, Grace: cluster.DefaultGracePeriod}},
		{name: "missing ttl", args: []string{"--lease", "L", "--", "w"}, wantErr: `required flag "ttl" not set`},
		{name: "missing both", args: []string{"--", "w"}, wantErr: `required flags "lease, ttl" not set`},
		{name: "unknown flag", args: []string{"--lease", "L", "--ttl", "1s", "--bogus", "--", "w"}, wantErr: "flag provided but not defined: -bogus"},
		{name: "bad duration", args: []string{"--lease", "L", "--ttl", "soon"}, wantErr: `invalid value "soon" for flag -ttl`},
		{name: "help", args: []string{"--help"}, help: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := LaunchConfig{Lease: "old", Check: time.Second}
			got := before
			err := got.Parse(tt.args)
			switch {
			case tt.help:
				if !errors.Is(err, flag.ErrHelp) {
					t.Fatalf("err = %v, want flag.ErrHelp", err)
				}
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			}
			if err != nil {
				if !reflect.DeepEqual(got, before) {
					t.Fatalf("a failed Parse changed the config: %+v", got)
				}
				return
			}
			tt.want.Check = before.Check // not part of the command line: left alone
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestAgentCommand: the command line the agent gives a worker resolves a program named
// stormdock to the binary the worker can see and, with leases, is the launcher's, which
// reads it back whole.
func TestAgentCommand(t *testing.T) {
	cfg := Config{Self: "/usr/bin/sd", ContainerSelf: "/stormdock", LeaseTTL: 3 * time.Second}
	wa := cluster.WorkerAssignment{Command: []string{"stormdock", "worker", "wordcount"}, Grace: cluster.Duration(5 * time.Second)}
	tests := []struct {
		name    string
		mode    string
		noLease bool
		command []string
		want    []string // the worker's own command, under the launcher unless noLease
		self    string
	}{
		{"process", cluster.IsolationProcess, false, wa.Command, []string{"/usr/bin/sd", "worker", "wordcount"}, "/usr/bin/sd"},
		{"docker", cluster.IsolationDocker, false, wa.Command, []string{"/stormdock", "worker", "wordcount"}, "/stormdock"},
		{"other program", cluster.IsolationProcess, false, []string{"sleep", "stormdock"}, []string{"sleep", "stormdock"}, "/usr/bin/sd"},
		{"no lease", cluster.IsolationProcess, true, wa.Command, []string{"/usr/bin/sd", "worker", "wordcount"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.NoLease = tt.noLease
			a := &Agent{cfg: c}
			w := wa
			w.Command = slices.Clone(tt.command)
			got := a.command(w, tt.mode, "/leases/x")
			if !slices.Equal(w.Command, tt.command) {
				t.Fatalf("the assignment's command changed to %q", w.Command)
			}
			if tt.noLease {
				if !slices.Equal(got, tt.want) {
					t.Fatalf("command %q, want %q", got, tt.want)
				}
				return
			}
			if len(got) < 2 || got[0] != tt.self || got[1] != LaunchCommand {
				t.Fatalf("command %q, want %s %s ...", got, tt.self, LaunchCommand)
			}
			var lc LaunchConfig
			if err := lc.Parse(got[2:]); err != nil {
				t.Fatal(err)
			}
			want := LaunchConfig{Lease: "/leases/x", TTL: cfg.LeaseTTL, Grace: 5 * time.Second, Command: tt.want}
			if !reflect.DeepEqual(lc, want) {
				t.Fatalf("launcher reads %+v, want %+v", lc, want)
			}
		})
	}
}
