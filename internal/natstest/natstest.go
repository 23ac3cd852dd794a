// Package natstest runs real NATS servers with JetStream (Debian's nats-server 2.9) for tests:
// on loopback or on hosts of a network lab, killable and restartable on the same port and
// store, and gives tests the shared one scripts/test starts (STORMDOCK_NATS).
package natstest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Env names the variable scripts/test exports with the address (127.0.0.1:PORT) of the
// nats-server (JetStream on) it started.
const Env = "STORMDOCK_NATS"

// Host is a machine of a test network a server can run on (netlab.Host is one).
type Host interface {
	IP() string
	Command(name string, args ...string) *exec.Cmd
}

// Options tune a test server.
type Options struct {
	// Host runs the server on a lab host, on its address and port 4222, instead of on a
	// free loopback port of this machine.
	Host Host
	// Dial is how the test reaches the server; nil: this machine's network.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// StartTimeout bounds the wait for the server to answer. Default 30 s.
	StartTimeout time.Duration
	// User and Password, when Password is set, make the server ask every client for them
	// (--user, --pass), or for Password as a token when User is empty (--auth).
	User, Password string
	// TLS makes the server speak TLS only (--tls), with a certificate for its address and
	// localhost issued by a CA of the test's own (internal/pki, as stormdock makes its
	// own); RootCAs trusts it.
	TLS bool
}

// Server is a nats-server run by a test (Start), or the shared one (Shared).
type Server struct {
	t    testing.TB
	addr string
	opts Options
	dir  string         // the JetStream store and server.log; "" for the shared server
	pool *x509.CertPool // the CA of a TLS server's certificate; nil for a plain server

	mu   sync.Mutex
	proc *testenv.Proc // nil while not running
}

// Binary is the nats-server program.
func binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("nats-server")
	if err != nil {
		testenv.Missing(t, "nats-server: %v (apt-get install nats-server)", err)
	}
	return p
}

// Start runs a server of the test's own, JetStream on, and kills it when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := binary(t)
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	s := &Server{t: t, opts: opts, dir: t.TempDir()}
	ip, port := "127.0.0.1", 4222
	if opts.Host != nil {
		ip = opts.Host.IP()
	} else {
		port = testenv.FreePort(t)
	}
	s.addr = net.JoinHostPort(ip, strconv.Itoa(port))
	if opts.TLS {
		if err := s.issueCert(ip); err != nil {
			t.Fatalf("natstest: %v", err)
		}
	}
	t.Cleanup(s.Kill)
	if err := s.spawn(bin); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	if err := s.waitUp(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return s
}

// Shared returns the server scripts/test started (STORMDOCK_NATS), after checking that it
// answers. Tests name streams and subjects of their own on it.
func Shared(t testing.TB) *Server {
	t.Helper()
	addr := os.Getenv(Env)
	if addr == "" {
		testenv.Missing(t, "NATS: %s is not set (scripts/test starts Debian's nats-server -js)", Env)
		return nil
	}
	s := &Server{t: t, addr: addr}
	nc, err := s.Connect()
	if err != nil {
		testenv.Missing(t, "NATS at %s (%s): %v", addr, Env, err)
		return nil
	}
	nc.Close()
	return s
}

func (s *Server) spawn(bin string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("already running")
	}
	host, port, _ := net.SplitHostPort(s.addr)
	args := []string{"-js", "-a", host, "-p", port, "-sd", filepath.Join(s.dir, "js")}
	switch {
	case s.opts.Password != "" && s.opts.User != "":
		args = append(args, "--user", s.opts.User, "--pass", s.opts.Password)
	case s.opts.Password != "":
		args = append(args, "--auth", s.opts.Password)
	}
	if s.pool != nil {
		args = append(args, "--tls", "--tlscert", filepath.Join(s.dir, "server.crt"), "--tlskey", filepath.Join(s.dir, "server.key"))
	}
	cmd := exec.Command(bin, args...)
	if s.opts.Host != nil {
		cmd = s.opts.Host.Command(bin, args...)
	}
	p, err := testenv.StartProc(cmd, filepath.Join(s.dir, "server.log"))
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

func (s *Server) waitUp() error {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	err := p.WaitUp(s.opts.StartTimeout, func() error {
		nc, err := s.Connect()
		if err == nil {
			nc.Close()
		}
		return err
	})
	if err != nil {
		s.mu.Lock()
		s.proc = nil
		s.mu.Unlock()
		return fmt.Errorf("nats-server at %s: %w", s.addr, err)
	}
	return nil
}

// issueCert makes the test's CA and the server's certificate (for ip and localhost) in the
// server's directory.
func (s *Server) issueCert(ip string) error {
	caPEM, caKeyPEM, err := pki.NewCA("natstest CA")
	if err != nil {
		return err
	}
	ca, caKey, err := pki.ParseCA(caPEM, caKeyPEM)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := pki.IssueCert(ca, caKey, []string{ip, "localhost"}, 24*time.Hour)
	if err != nil {
		return err
	}
	if err := pki.WriteFiles(map[string][]byte{filepath.Join(s.dir, "server.crt"): certPEM, filepath.Join(s.dir, "server.key"): keyPEM}, 0o600); err != nil {
		return err
	}
	s.pool = x509.NewCertPool()
	s.pool.AddCert(ca)
	return nil
}

// RootCAs is the pool that verifies a TLS server's certificate (Options.TLS); nil for a
// plain server.
func (s *Server) RootCAs() *x509.CertPool { return s.pool }

// Addr is the server's HOST:PORT.
func (s *Server) Addr() string { return s.addr }

// URL is the server's nats:// URL.
func (s *Server) URL() string { return "nats://" + s.addr }

// dialer adapts Options.Dial to nats.CustomDialer.
type dialer struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d dialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return d.dial(ctx, network, addr)
}

// Connect connects to the server (through Options.Dial), failing fast when it is down.
func (s *Server) Connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.Timeout(2 * time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if s.opts.Dial != nil {
		opts = append(opts, nats.SetCustomDialer(dialer{s.opts.Dial}))
	}
	if s.pool != nil {
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: s.pool, MinVersion: tls.VersionTLS12}))
	}
	switch {
	case s.opts.Password != "" && s.opts.User != "":
		opts = append(opts, nats.UserInfo(s.opts.User, s.opts.Password))
	case s.opts.Password != "":
		opts = append(opts, nats.Token(s.opts.Password))
	}
	return nats.Connect(s.URL(), opts...)
}

// Kill SIGKILLs the server and waits.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.Stop(syscall.SIGKILL, 0)
		s.proc = nil
	}
}

// Restart kills the server and starts it again on the same address and store.
func (s *Server) Restart() {
	s.t.Helper()
	if s.dir == "" {
		s.t.Fatal("natstest: the shared server is not the test's to restart")
	}
	s.Kill()
	if err := s.spawn(binary(s.t)); err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
	if err := s.waitUp(); err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
}

// LogTail returns the end of the server's log.
func (s *Server) LogTail() string { return testenv.LogTail(filepath.Join(s.dir, "server.log")) }
