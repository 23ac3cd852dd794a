package multidc

import (
	"errors"
	"flag"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
)

// FuzzRouterArgs: what Args writes, Parse reads back exactly. Links are names (the master
// writes validated ones), so they hold no comma or blank and none is empty.
func FuzzRouterArgs(f *testing.F) {
	f.Add("zk://127.0.0.1:2181/stormdock", "", "wordcount", "dc-a,dc-b", "file:///var/out.jsonl", "127.0.0.1:17100", "",
		int64(2*time.Second), int64(600*time.Millisecond), int64(0), int64(100*time.Millisecond), int64(8192), int64(32<<20))
	f.Add("", "/data/store.credentials", "-job", "", "", "", "0f0f", int64(0), int64(-1), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), int64(0))
	f.Add("mem://", "--x", "j", "a", "http://h/p?x=1", "--listen", "--x", int64(1), int64(1), int64(1), int64(1), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, store, credsFile, job, links, sink, listen, tokenHash string,
		session, heartbeat, closeGrace, checkpoint, records, bytes int64) {
		var ls []string
		for _, l := range strings.Split(links, ",") {
			if l != "" && !strings.ContainsFunc(l, notInName) {
				ls = append(ls, l)
			}
		}
		want := RouterArgs{Store: store, SessionTimeout: time.Duration(session), StoreCredentialsFile: credsFile,
			Job: job, Links: ls, Sink: sink, Listen: listen, TokenHash: tokenHash,
			HeartbeatTimeout: time.Duration(heartbeat), CloseGrace: time.Duration(closeGrace),
			CheckpointInterval: time.Duration(checkpoint), BufferRecords: records, BufferBytes: bytes}
		var got RouterArgs
		if err := got.Parse(want.Args()); err != nil {
			t.Fatalf("Parse(%q): %v", want.Args(), err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse(Args(x)) = %+v, want %+v (args %q)", got, want, want.Args())
		}
	})
}

// notInName: a rune a link name cannot hold, one that Parse would trim.
func notInName(r rune) bool { return unicode.IsSpace(r) || r > unicode.MaxASCII }

func TestRouterArgs(t *testing.T) {
	base := DefaultRouterArgs()
	base.Store, base.Job, base.Links, base.Sink, base.Listen = "zk://127.0.0.1:2181/sd", "wc", []string{"dc-a", "dc-b"}, "file:///out", "127.0.0.1:17100"
	// What the master has always written: a router worker started by an older master and one
	// started by this one run the same command.
	want := []string{"--store", "zk://127.0.0.1:2181/sd", "--job", "wc", "--links", "dc-a,dc-b", "--sink", "file:///out", "--listen", "127.0.0.1:17100"}
	if got := base.Args(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Args() = %q, want %q", got, want)
	}

	tests := []struct {
		name    string
		args    []string
		change  func(*RouterArgs)
		wantErr error
		errText string
	}{
		{name: "as the master writes it", args: want, change: func(*RouterArgs) {}},
		{name: "listen defaults", args: []string{"--store", "s", "--job", "j", "--links", "a", "--sink", "k"}, change: func(a *RouterArgs) {
			*a = DefaultRouterArgs()
			a.Store, a.Job, a.Links, a.Sink = "s", "j", []string{"a"}, "k"
		}},
		{name: "links trimmed, empty ones dropped", args: append(want[:len(want):len(want)], "--links", " dc-a, ,dc-b,", "-heartbeat-timeout=1s", "--buffer-bytes", "0x10"),
			change: func(a *RouterArgs) { a.HeartbeatTimeout, a.BufferBytes = time.Second, 16 }},
		{name: "sink dir, tenant, dc and link token hashes", args: append(want[:len(want):len(want)], "--sink-dir", "/srv/sinks", "--tenant", "acme",
			"--dc", "dc-b", "--link-token-hashes", "dc-a=aa, dc-b=bb"),
			change: func(a *RouterArgs) {
				a.SinkDir, a.Tenant, a.DC, a.LinkTokenHashes = "/srv/sinks", "acme", "dc-b", map[string]string{"dc-a": "aa", "dc-b": "bb"}
			}},
		{name: "a fencing sink and its password file", args: append(want[:len(want):len(want)], "--sink", "postgres://app@db:5432/orders?table=out",
			"--sink-password-file", "$STORMDOCK_SECRETS_DIR/db"),
			change: func(a *RouterArgs) {
				a.Sink, a.SinkPasswordFile = "postgres://app@db:5432/orders?table=out", "$STORMDOCK_SECRETS_DIR/db"
			}},
		{name: "bad link token hashes", args: append(want[:len(want):len(want)], "--link-token-hashes", "dc-a"), errText: "want LINK=HEX"},
		{name: "positional argument", args: append(want[:len(want):len(want)], "extra"), wantErr: ErrRouterArgs},
		{name: "missing sink and job", args: []string{"--store", "s", "--links", "a"}, errText: `required flags "job, sink" not set`},
		{name: "unknown flag", args: append(want[:len(want):len(want)], "--bogus"), errText: "flag provided but not defined: -bogus"},
		{name: "help", args: []string{"-h"}, wantErr: flag.ErrHelp},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got RouterArgs
			err := got.Parse(tt.args)
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			case tt.errText != "":
				if err == nil || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("err = %v, want %q", err, tt.errText)
				}
			case err != nil:
				t.Fatal(err)
			default:
				w := base
				w.Links = []string{"dc-a", "dc-b"}
				tt.change(&w)
				if !reflect.DeepEqual(got, w) {
					t.Fatalf("got %+v, want %+v", got, w)
				}
			}
			if err != nil && !reflect.DeepEqual(got, RouterArgs{}) {
				t.Fatalf("a failed Parse changed the args: %+v", got)
			}
		})
	}
}

func TestRouterArgsRoundTripConfinement(t *testing.T) {
	a := DefaultRouterArgs()
	a.Store, a.Job, a.Links, a.Sink, a.Listen = "zk://h/sd", "wc", []string{"dc-a", "dc-b"}, "file:///srv/sinks/acme/out", "l"
	a.SinkDir, a.Tenant, a.MaxBody = "/srv/sinks", "acme", 1<<20
	a.OutputSecret, a.SecretsDir = "sinkpass", "/run/stormdock/leases/x.secrets"
	a.LinkTokenHashes = map[string]string{"dc-b": "bb", "dc-a": "aa"}
	var got RouterArgs
	if err := got.Parse(a.Args()); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("Parse(Args(a)) = %+v, want %+v (args %q)", got, a, a.Args())
	}
}
