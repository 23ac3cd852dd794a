package coord_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/coord/coordtest"
	"github.com/stormdock/stormdock/coord/zktest"
	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// The conformance suite against a server that serves TLS only (secureClientPort, no
// clientPort): every request, watch and session event goes over TLS. scripts/test starts
// one beside its plain server (STORMDOCK_ZK_TLS, with its CA in STORMDOCK_ZK_CA): the suite
// runs on it when set, on a server of its own otherwise.
func TestZKTLSConformance(t *testing.T) {
	t.Parallel()
	if addr, ca := os.Getenv("STORMDOCK_ZK_TLS"), os.Getenv("STORMDOCK_ZK_CA"); addr != "" && ca != "" {
		coordtest.RunSuite(t, func(t *testing.T) coordtest.Backend {
			b := &zkBackend{addrs: addr, chroot: uniqueChroot(t, "stormdock-test"), tick: sharedTick, timeout: sharedTimeout,
				tlsCA: ca, dialers: map[coord.Store]*zktest.Partition{}}
			t.Cleanup(func() { cleanupZKTLS(t, addr, ca, b.chroot) })
			return b
		})
		return
	}
	const tick = 200 * time.Millisecond
	srv := zktest.Start(t, zktest.Options{TickTime: tick, TLS: true})
	coordtest.RunSuite(t, func(t *testing.T) coordtest.Backend {
		b := &zkBackend{addrs: srv.Addr(), chroot: uniqueChroot(t, "stormdock-test"), tick: tick, timeout: time.Second,
			srv: srv, dialers: map[coord.Store]*zktest.Partition{}}
		return b
	})
}

// What a client of a TLS server gets with each way of being wrong: a one-line error that
// says what to give, at once rather than after the connect timeout.
func TestZKTLSErrors(t *testing.T) {
	t.Parallel()
	srv := zktest.Start(t, zktest.Options{TLS: true})
	auth := zktest.Start(t, zktest.Options{TLS: true, ClientAuth: true})
	otherCA := filepath.Join(t.TempDir(), "other.crt")
	certPEM, _, err := pki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(otherCA, certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cert, key, err := auth.ClientCert("client")
	if err != nil {
		t.Fatal(err)
	}
	plain := zktest.Start(t, zktest.Options{})
	for _, tc := range []struct {
		name    string
		url     string
		files   coord.TLSFiles
		wantErr string // "" : opens
	}{
		{"right CA", srv.URL("/tls"), coord.TLSFiles{CA: srv.CAFile()}, ""},
		{"wrong CA", srv.URL("/tls"), coord.TLSFiles{CA: otherCA}, "store " + srv.URL("/tls") + ": TLS: certificate signed by unknown authority: give --store-ca the CA that signed the ZooKeeper servers' certificates"},
		{"system roots", srv.URL("/tls"), coord.TLSFiles{}, "TLS: certificate signed by unknown authority"},
		{"not a CA file", srv.URL("/tls"), coord.TLSFiles{CA: "/etc/hostname"}, "holds no PEM certificate"},
		{"cert without key", srv.URL("/tls"), coord.TLSFiles{CA: srv.CAFile(), Cert: cert}, "needs both --store-cert and --store-key"},
		{"client certificate", auth.URL("/tls"), coord.TLSFiles{CA: auth.CAFile(), Cert: cert, Key: key}, ""},
		{"plain zk:// to a TLS port", "zk://" + srv.Addr() + "/tls", coord.TLSFiles{}, "no session within"},
		{"zks:// to a plain port", plain.URL("/tls")[:2] + "s" + plain.URL("/tls")[2:], coord.TLSFiles{CA: srv.CAFile()}, "no session within"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			start := time.Now()
			// The connect bound scales with the machine: a handshake to Netty on a loaded
			// 2-core machine took more than 3 s. That a certificate which does not verify
			// fails on it, not by the bound, is what the message says ("TLS: ..." rather
			// than "no session within").
			s, err := coord.Open(ctx, tc.url, coord.Options{SessionTimeout: 2 * time.Second, ConnectTimeout: testenv.Timeout(3 * time.Second), TLS: tc.files, Logger: quiet})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				if _, err := s.Put(ctx, "/k", []byte("v"), coord.AnyVersion); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("opened; want %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q; want one line with %q", err, tc.wantErr)
			}
			if strings.Contains(tc.wantErr, "TLS:") {
				t.Logf("failed on the certificate after %s", time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// The keeper's probes of a TLS server's four-letter words go over TLS: a serving server
// says so, a paused one counts as hung (it accepts the connection, answers no handshake),
// as a plain server's would.
func TestZKTLSProbe(t *testing.T) {
	t.Parallel()
	srv := zktest.Start(t, zktest.Options{TLS: true})
	dial, err := coord.TLSFiles{CA: srv.CAFile()}.ProbeDialer(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	probe := func() coord.ServerProbe { return coord.ProbeServers(ctx, []string{srv.Addr()}, time.Second, dial)[0] }
	if p := probe(); p.State != coord.ServerServing || p.Detail != "standalone" {
		t.Fatalf("probe of a serving TLS server: %+v", p)
	}
	srv.Pause()
	defer srv.Resume()
	if p := probe(); p.State != coord.ServerHung {
		t.Fatalf("probe of a paused TLS server: %+v; want hung", p)
	}
}

// cleanupZKTLS is cleanupZK for the shared TLS server.
func cleanupZKTLS(t testing.TB, addr, ca, chroot string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := coord.Open(ctx, "zks://"+addr, coord.Options{SessionTimeout: sharedTimeout, TLS: coord.TLSFiles{CA: ca}, Logger: quiet})
	if err != nil {
		t.Logf("cleanup %s: %v", chroot, err)
		return
	}
	defer s.Close()
	if err := coord.DeleteTree(ctx, s, chroot); err != nil {
		t.Logf("cleanup %s: %v", chroot, err)
	}
}
