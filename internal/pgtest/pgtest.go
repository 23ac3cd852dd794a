// Package pgtest runs real PostgreSQL servers (Debian's postgresql 15) for tests: on loopback
// or on hosts of a network lab, killable and restartable on the same port and data, and
// databases of their own on the shared server scripts/test starts (STORMDOCK_PG).
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stormdock/stormdock/internal/pki"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Env names the variable scripts/test exports with the address (127.0.0.1:PORT) of the
// PostgreSQL it started, which trusts loopback connections.
const Env = "STORMDOCK_PG"

// BinDir is where Debian's postgresql-15 keeps its server programs (initdb, postgres).
const BinDir = "/usr/lib/postgresql/15/bin"

// Superuser is the role every test server is initialised with.
const Superuser = "postgres"

// Host is a machine of a test network a server can run on (netlab.Host is one).
type Host interface {
	// IP is the host's address, which the server listens on.
	IP() string
	// Command runs a program in the host's network.
	Command(name string, args ...string) *exec.Cmd
}

// Options tune a test server.
type Options struct {
	// Host runs the server on a lab host, on its address and port 5432, instead of on a free
	// loopback port of this machine.
	Host Host
	// Dial is how the test reaches the server; nil: this machine's network. A lab's hosts are
	// reached through the lab (netlab.Lab.DialContext).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Password, when set, is the superuser's password, and every TCP connection must give
	// its role's password (scram-sha-256). Without it the server trusts every connection.
	Password string
	// StartTimeout bounds the wait for the server to answer. Default 30 s.
	StartTimeout time.Duration
	// TLS makes the server take TCP connections over TLS only (ssl=on, hostssl alone in
	// pg_hba.conf), with a certificate for its address and localhost issued by a CA of the
	// test's own (internal/pki); RootCAs trusts it.
	TLS bool
}

// Server is a PostgreSQL server run by a test (Start), or the shared one (Shared), which the
// test may use but not stop.
type Server struct {
	t    testing.TB
	addr string
	opts Options
	dir  string // holds data/ (the cluster), the socket and server.log; "" for the shared server

	pool *x509.CertPool // the CA of a TLS server's certificate; nil for a plain server

	mu   sync.Mutex
	proc *testenv.Proc // nil while not running
}

// Start runs a server of the test's own and stops it, removing its data, when the test
// ends. A machine without postgresql skips the test, or fails it under CI=true.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	testenv.Root(t) // the server runs as the postgres user, which only root can switch to
	if _, err := os.Stat(filepath.Join(BinDir, "postgres")); err != nil {
		testenv.Missing(t, "PostgreSQL 15: %v (apt-get install postgresql)", err)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		testenv.Missing(t, "the postgres user: %v (apt-get install postgresql)", err)
	}
	tmpl, err := template(pg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// A copy of an initialised cluster: initdb takes a second or two, a copy a tenth.
	if out, err := exec.Command("cp", "-a", tmpl, filepath.Join(dir, "data")).CombinedOutput(); err != nil {
		t.Fatalf("pgtest: copy the template cluster: %v: %s", err, out)
	}
	if err := chownTo(dir, pg); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s := &Server{t: t, opts: opts, dir: dir}
	ip, port := "127.0.0.1", 5432
	if opts.Host != nil {
		ip = opts.Host.IP()
	} else {
		port = testenv.FreePort(t)
	}
	s.addr = net.JoinHostPort(ip, strconv.Itoa(port))
	if opts.TLS {
		if err := s.issueCert(ip, pg); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	if err := s.writeHBA(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(s.Kill)
	if err := s.spawn(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if err := s.waitUp(); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if opts.Password != "" {
		// Set over the socket, which the server trusts (pg_hba.conf below).
		s.Exec(t, "postgres", fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", Superuser, strings.ReplaceAll(opts.Password, "'", "''")))
	}
	return s
}

// Shared returns the server scripts/test started (STORMDOCK_PG), after checking that it
// answers: tests make databases of their own on it (NewDB). Missing, the test skips, or
// fails under CI=true.
func Shared(t testing.TB) *Server {
	t.Helper()
	addr := os.Getenv(Env)
	if addr == "" {
		testenv.Missing(t, "PostgreSQL: %s is not set (scripts/test starts one from Debian's postgresql)", Env)
		return nil
	}
	s := &Server{t: t, addr: addr}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.Connect(ctx, "postgres")
	if err != nil {
		testenv.Missing(t, "PostgreSQL at %s (%s): %v", addr, Env, err)
		return nil
	}
	_ = c.Close(ctx)
	return s
}

// template returns an initialised cluster to copy, made once per machine and PostgreSQL
// version (initdb into a temporary directory, then renamed into place).
var templateOnce struct {
	sync.Mutex
	dir string
}

func template(pg *user.User) (string, error) {
	templateOnce.Lock()
	defer templateOnce.Unlock()
	if templateOnce.dir != "" {
		return templateOnce.dir, nil
	}
	dir := filepath.Join(os.TempDir(), "stormdock-pgtest-template-15")
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		templateOnce.dir = dir
		return dir, nil
	}
	tmp, err := os.MkdirTemp("", "pgtest-initdb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := chownTo(tmp, pg); err != nil {
		return "", err
	}
	data := filepath.Join(tmp, "data")
	cmd := exec.Command("setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
		filepath.Join(BinDir, "initdb"), "-D", data, "-A", "trust", "-U", Superuser, "--no-sync", "-E", "UTF8", "--locale=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("initdb: %w: %s", err, out)
	}
	if err := os.Rename(data, dir); err != nil && !errors.Is(err, os.ErrExist) {
		if _, serr := os.Stat(filepath.Join(dir, "PG_VERSION")); serr != nil {
			return "", fmt.Errorf("template: %w", err)
		}
	}
	templateOnce.dir = dir
	return dir, nil
}

func chownTo(dir string, u *user.User) error {
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// writeHBA says whom the server trusts: its own socket always (the test sets passwords
// through it); over TCP everyone, or with a password only when Options.Password is set.
func (s *Server) writeHBA() error {
	method := "trust"
	if s.opts.Password != "" {
		method = "scram-sha-256"
	}
	kind := "host"
	if s.opts.TLS {
		kind = "hostssl" // a connection in clear finds no entry: refused
	}
	hba := fmt.Sprintf("local all all trust\n%s all all 0.0.0.0/0 %s\n", kind, method)
	p := filepath.Join(s.dir, "data", "pg_hba.conf")
	if err := os.WriteFile(p, []byte(hba), 0o600); err != nil {
		return err
	}
	pg, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	return chownTo(p, pg)
}

// spawn starts the server without waiting for it to answer.
func (s *Server) spawn() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("already running")
	}
	host, port, _ := net.SplitHostPort(s.addr)
	// fsync off: a test server's data need not reach the disk (a killed server's writes
	// are still in the page cache), and on a loaded machine fsyncs stall it.
	args := []string{"--reuid=postgres", "--regid=postgres", "--init-groups", filepath.Join(BinDir, "postgres"),
		"-D", filepath.Join(s.dir, "data"), "-p", port, "-k", s.dir, "-c", "listen_addresses=" + host,
		"-c", "fsync=off", "-c", "max_connections=200", "-c", "shared_buffers=16MB", "-c", "log_min_messages=warning"}
	if s.opts.TLS {
		args = append(args, "-c", "ssl=on", "-c", "ssl_cert_file="+filepath.Join(s.dir, "server.crt"),
			"-c", "ssl_key_file="+filepath.Join(s.dir, "server.key"))
	}
	cmd := exec.Command("setpriv", args...)
	if s.opts.Host != nil {
		cmd = s.opts.Host.Command("setpriv", args...)
	}
	p, err := testenv.StartProc(cmd, s.logFile())
	if err != nil {
		return err
	}
	s.proc = p
	return nil
}

func (s *Server) logFile() string { return filepath.Join(s.dir, "server.log") }

// issueCert makes the test's CA and the server's certificate (for ip and localhost) in the
// server's directory, its key the postgres user's alone (the server refuses one others read).
func (s *Server) issueCert(ip string, pg *user.User) error {
	caPEM, caKeyPEM, err := pki.NewCA("pgtest CA")
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
	crt, key := filepath.Join(s.dir, "server.crt"), filepath.Join(s.dir, "server.key")
	if err := pki.WriteFiles(map[string][]byte{crt: certPEM, key: keyPEM}, 0o600); err != nil {
		return err
	}
	for _, p := range []string{crt, key} {
		if err := chownTo(p, pg); err != nil {
			return err
		}
	}
	s.pool = x509.NewCertPool()
	s.pool.AddCert(ca)
	return nil
}

// RootCAs is the pool that verifies a TLS server's certificate (Options.TLS); nil for a
// plain server.
func (s *Server) RootCAs() *x509.CertPool { return s.pool }

func (s *Server) waitUp() error {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	err := p.WaitUp(s.opts.StartTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, s.adminConfig("postgres"))
		if err == nil {
			_ = c.Close(ctx)
		}
		return err
	})
	if err != nil {
		s.mu.Lock()
		s.proc = nil
		s.mu.Unlock()
		return fmt.Errorf("postgres at %s: %w", s.addr, err)
	}
	return nil
}

// Addr is the server's HOST:PORT.
func (s *Server) Addr() string { return s.addr }

// ConnConfig is a connection as the superuser to database db, over TCP.
func (s *Server) ConnConfig(db string) *pgx.ConnConfig {
	host, port, _ := net.SplitHostPort(s.addr)
	cfg := config(host, port, db)
	cfg.Password = s.opts.Password
	if s.pool != nil {
		cfg.TLSConfig = &tls.Config{RootCAs: s.pool, ServerName: host, MinVersion: tls.VersionTLS12}
	}
	if s.opts.Dial != nil {
		cfg.DialFunc = s.opts.Dial
	}
	return cfg
}

// config parses a connection of exactly what it is given: no PG* variable or password file
// of the machine comes into it.
func config(host, port, db string) *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable connect_timeout=5 passfile=/dev/null", host, port, db, Superuser))
	if err != nil {
		panic(err) // the string above is well formed
	}
	return cfg
}

// Connect connects as the superuser to database db, over TCP (through Options.Dial).
func (s *Server) Connect(ctx context.Context, db string) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, s.ConnConfig(db))
}

// adminConfig is how the test itself administers the server: through its socket, which
// it trusts and which no network cut reaches, when the server is the test's own.
func (s *Server) adminConfig(db string) *pgx.ConnConfig {
	if s.dir == "" {
		return s.ConnConfig(db)
	}
	_, port, _ := net.SplitHostPort(s.addr)
	return config(s.dir, port, db)
}

// Admin connects as the superuser to database db the way the test administers the server
// (its socket for a server of the test's own, unaffected by cuts).
func (s *Server) Admin(ctx context.Context, db string) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, s.adminConfig(db))
}

// Exec runs SQL as the superuser in database db, failing the test on error.
func (s *Server) Exec(t testing.TB, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
	defer cancel()
	c, err := s.Admin(ctx, db)
	if err != nil {
		t.Fatalf("pgtest: connect to %s/%s: %v", s.addr, db, err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// NewDB makes a database of the test's own and drops it when the test ends.
func (s *Server) NewDB(t testing.TB) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "test_" + hex.EncodeToString(b)
	s.Exec(t, "postgres", "CREATE DATABASE "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := s.Admin(ctx, "postgres"); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	return name
}

// Kill SIGKILLs the server and its backends, as a crash or a lost machine would, and waits.
// Nothing of a transaction in flight commits; the next start recovers from the WAL.
func (s *Server) Kill() { s.stop(syscall.SIGKILL, 0) }

// Stop shuts the server down fast (SIGINT: transactions in flight are rolled back) and
// waits; after 10 s it kills it.
func (s *Server) Stop() { s.stop(syscall.SIGINT, 10*time.Second) }

func (s *Server) stop(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	// PostgreSQL's backends are sessions of their own (setsid), out of the server's process
	// group: a killed server's backends are killed too, as a crash would, and waited for, so
	// that a restart finds no backend holding the old shared memory.
	kids := children(s.proc.Pid())
	s.proc.Stop(sig, grace)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	for range 250 {
		alive := 0
		for _, k := range kids {
			if syscall.Kill(k, 0) == nil {
				alive++
			}
		}
		if alive == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.proc = nil
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		k, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, k)
		}
	}
	return out
}

// Restart kills the server (when it runs) and starts it again on the same address and data,
// failing the test if it does not answer again.
func (s *Server) Restart() {
	s.t.Helper()
	if s.dir == "" {
		s.t.Fatal("pgtest: the shared server is not the test's to restart")
	}
	s.Kill()
	if err := s.spawn(); err != nil {
		s.t.Fatalf("pgtest: restart: %v", err)
	}
	if err := s.waitUp(); err != nil {
		s.t.Fatalf("pgtest: restart: %v", err)
	}
}

// Running reports whether the server's process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// LogTail returns the end of the server's log.
func (s *Server) LogTail() string { return testenv.LogTail(s.logFile()) }
