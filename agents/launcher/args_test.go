package launcher

import (
	"errors"
	"flag"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzArgs: what Args writes, Parse reads back exactly, whatever the lease path, the
// durations and the worker's command (which may look like flags, or be "--").
func FuzzArgs(f *testing.F) {
	f.Add("/var/lib/stormdock/agent/leases/n1.wc.0", int64(2*time.Second), int64(10*time.Second), "/stormdock\x00worker\x00wordcount")
	f.Add("", int64(0), int64(0), "")
	f.Add("-lease", int64(-1), int64(math.MaxInt64), "--\x00-h\x00--lease\x00x")
	f.Add("a b=c", int64(math.MinInt64), int64(1), "\x00")
	f.Fuzz(func(t *testing.T, lease string, ttl, grace int64, cmd string) {
		var command []string
		if cmd != "" {
			command = strings.Split(cmd, "\x00")
		}
		want := Config{Lease: lease, TTL: time.Duration(ttl), Grace: time.Duration(grace), Command: command}
		var got Config
		if err := got.Parse(want.Args()); err != nil {
			t.Fatalf("Parse(%q): %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse(Args(x)) = %+v, want %+v (args %q)", got, want, want.Args())
		}
	})
}

// TestParse reads command lines written by hand, the way the launcher's flags have
// always been accepted.
func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Config
		wantErr string
		help    bool
	}{
		{name: "grace defaults", args: []string{"--lease", "L", "--ttl", "1s", "--", "w", "-x"},
			want: Config{Lease: "L", TTL: time.Second, Grace: DefaultGrace, Command: []string{"w", "-x"}}},
		{name: "command without --", args: []string{"-lease=L", "-ttl=2s", "--grace", "0s", "sleep", "1"},
			want: Config{Lease: "L", TTL: 2 * time.Second, Command: []string{"sleep", "1"}}},
		{name: "no command is for the caller to refuse", args: []string{"--lease", "L", "--ttl", "1s"},
			want: Config{Lease: "L", TTL: time.Second, Grace: DefaultGrace}},
		{name: "missing ttl", args: []string{"--lease", "L", "--", "w"}, wantErr: `required flag "ttl" not set`},
		{name: "missing both", args: []string{"--", "w"}, wantErr: `required flags "lease, ttl" not set`},
		{name: "unknown flag", args: []string{"--lease", "L", "--ttl", "1s", "--bogus", "--", "w"}, wantErr: "flag provided but not defined: -bogus"},
		{name: "bad duration", args: []string{"--lease", "L", "--ttl", "soon"}, wantErr: `invalid value "soon" for flag -ttl`},
		{name: "help", args: []string{"--help"}, help: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := Config{Lease: "old", Check: time.Second}
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
