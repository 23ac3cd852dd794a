package coord_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		in   string
		want coord.Target
		err  bool
	}{
		{in: "zk://127.0.0.1:2181/stormdock", want: coord.Target{Scheme: "zk", Servers: []string{"127.0.0.1:2181"}, Chroot: "/stormdock"}},
		{in: "zk://a:1,b:2,c/x/y/", want: coord.Target{Scheme: "zk", Servers: []string{"a:1", "b:2", "c:2181"}, Chroot: "/x/y"}},
		{in: "zk://zk1", want: coord.Target{Scheme: "zk", Servers: []string{"zk1:2181"}}},
		{in: "zk://zk1/", want: coord.Target{Scheme: "zk", Servers: []string{"zk1:2181"}}},
		{in: "zk://[::1]:2181/s", want: coord.Target{Scheme: "zk", Servers: []string{"[::1]:2181"}, Chroot: "/s"}},
		{in: "zk://user:p@ss@h:1/s", want: coord.Target{Scheme: "zk", Servers: []string{"h:1"}, Chroot: "/s", Credentials: "user:p@ss"}},
		{in: "mem://", want: coord.Target{Scheme: "mem"}},
		{in: "mem://local", want: coord.Target{Scheme: "mem", Name: "local"}},
		{in: "file:///var/lib/stormdock/store.json", want: coord.Target{Scheme: "file", Path: "/var/lib/stormdock/store.json"}},
		{in: "file:///a/../b.json", want: coord.Target{Scheme: "file", Path: "/b.json"}},
		{in: "", err: true},
		{in: "zk:/h", err: true},
		{in: "zks://zk1:2281,zk2:2281/s", want: coord.Target{Scheme: "zk", TLS: true, Servers: []string{"zk1:2281", "zk2:2281"}, Chroot: "/s"}},
		{in: "zks://127.0.0.1:2281", want: coord.Target{Scheme: "zk", TLS: true, Servers: []string{"127.0.0.1:2281"}}},
		{in: "zk://", err: true},
		{in: "zks://", err: true},
		{in: "zks://h/a?x=1", err: true},
		{in: "zk:///chroot", err: true},
		{in: "zk://h:0", err: true},
		{in: "zk://h:65536", err: true},
		{in: "zk://h:x", err: true},
		{in: "zk://h,,g", err: true},
		{in: "zk://h/a//b", err: true},
		{in: "zk://h/a/../b", err: true},
		{in: "zk://h/a?x=1", err: true},
		{in: "zk://user@h", err: true},
		{in: "etcd://h", err: true},
		{in: "mem://a/b", err: true},
		{in: "file://host/x.json", err: true},
		{in: "file://", err: true},
		{in: "file:///", err: true},
		{in: "file:///dir/", err: true},
		{in: "file:///x.json?y", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := coord.ParseURL(tc.in)
			if tc.err {
				if err == nil || !errors.Is(err, coord.ErrInvalid) {
					t.Fatalf("ParseURL(%q) = %+v, %v; want ErrInvalid", tc.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURL(%q): %v", tc.in, err)
			}
			// String gives the URL back without credentials, with its scheme.
			if back, err := coord.ParseURL(got.String()); err != nil || back.TLS != got.TLS {
				t.Fatalf("ParseURL(%q).String() = %q: does not parse back (%v)", tc.in, got.String(), err)
			}
			if got.Scheme != tc.want.Scheme || !slices.Equal(got.Servers, tc.want.Servers) || got.Chroot != tc.want.Chroot ||
				got.Name != tc.want.Name || got.Path != tc.want.Path || got.Credentials != tc.want.Credentials || got.TLS != tc.want.TLS {
				t.Fatalf("ParseURL(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseURLRedactsCredentials(t *testing.T) {
	_, err := coord.ParseURL("zk://admin:topsecret@h:bad/x")
	if err == nil || strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("error leaks credentials or is nil: %v", err)
	}
}

// FuzzParseURL: the parser never panics, accepted URLs are well formed, and the canonical
// form of an accepted URL parses to the same target.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"zk://127.0.0.1:2181/stormdock", "zk://a:1,b:2,c/x/y/", "zk://u:p@h/c",
		"zk://[::1]:2181/s", "mem://", "mem://local", "file:///var/lib/s.json", "file:///a/../b", "zk://h:0", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		tg, err := coord.ParseURL(in)
		if err != nil {
			if !errors.Is(err, coord.ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		switch tg.Scheme {
		case "zk":
			if len(tg.Servers) == 0 {
				t.Fatalf("%q: no servers", in)
			}
			if tg.Chroot != "" && coord.ValidateKey(tg.Chroot) != nil {
				t.Fatalf("%q: bad chroot %q", in, tg.Chroot)
			}
		case "file":
			if !strings.HasPrefix(tg.Path, "/") {
				t.Fatalf("%q: relative path %q", in, tg.Path)
			}
		case "mem":
		default:
			t.Fatalf("%q: scheme %q", in, tg.Scheme)
		}
		again, err := coord.ParseURL(tg.String())
		if err != nil {
			t.Fatalf("%q: canonical form %q does not parse: %v", in, tg.String(), err)
		}
		tg.Credentials = ""
		if again.String() != tg.String() || !slices.Equal(again.Servers, tg.Servers) || again.Chroot != tg.Chroot ||
			again.Path != tg.Path || again.Name != tg.Name {
			t.Fatalf("%q: round trip %+v -> %+v", in, tg, again)
		}
	})
}

// A store that cannot be opened is a nil Store, which a caller can test and skip closing.
func TestOpenFailureIsNil(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	s, err := coord.Open(context.Background(), "zk://"+dead+"/x", coord.Options{SessionTimeout: time.Second, ConnectTimeout: 200 * time.Millisecond})
	if err == nil || s != nil {
		t.Fatalf("Open of a dead server = %#v, %v; want a nil Store and an error", s, err)
	}
}
