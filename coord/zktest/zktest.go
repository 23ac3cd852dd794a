// Package zktest starts real standalone ZooKeeper servers for tests: on a free loopback port,
// from a generated zoo.cfg, killable and restartable on the same port and data directory.
package zktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// Options tune a test server.
type Options struct {
	// TickTime is ZooKeeper's tick; sessions may last 2 to 20 ticks. Default 200ms.
	TickTime time.Duration
	// StartTimeout bounds the wait for "imok". Default 30s.
	StartTimeout time.Duration
}

// Server is a standalone ZooKeeper server run by a test.
type Server struct {
	t       testing.TB
	script  string
	dir     string
	cfg     string
	logFile string
	addr    string
	opts    Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs a ZooKeeper server for the test and stops it when the test ends. A missing
// ZooKeeper skips the test, or fails it under CI=true (internal/testenv).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	script := testenv.ZKServerScript(t)
	if opts.TickTime <= 0 {
		opts.TickTime = 200 * time.Millisecond
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 30 * time.Second
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatalf("zktest: free port: %v", err)
	}
	s := &Server{
		t:       t,
		script:  script,
		dir:     dir,
		cfg:     filepath.Join(dir, "zoo.cfg"),
		logFile: filepath.Join(dir, "logs", "server.out"),
		addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		opts:    opts,
	}
	// forceSync=no: a test server's log need not reach the disk before it answers (a killed
	// JVM's writes still survive in the page cache); on a loaded machine an fsync per write
	// stalls the server long enough to expire sessions.
	cfg := fmt.Sprintf(`tickTime=%d
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=*
maxClientCnxns=0
forceSync=no
`, opts.TickTime.Milliseconds(), filepath.Join(dir, "data"), port)
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatalf("zktest: %v", err)
	}
	if err := os.WriteFile(s.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatalf("zktest: write zoo.cfg: %v", err)
	}
	t.Cleanup(s.Kill)
	if err := s.start(); err != nil {
		t.Fatalf("zktest: %v", err)
	}
	return s
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns a coord store URL for the server with the given chroot ("" for none).
func (s *Server) URL(chroot string) string { return "zk://" + s.addr + chroot }

// TickTime returns the server's tick.
func (s *Server) TickTime() time.Duration { return s.opts.TickTime }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	out, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// The server runs at a higher CPU priority than the test's other processes, as it would on
	// machines of its own: on a two-core machine running hundreds of workers, a starved JVM
	// answers no pings and expires every session at once.
	cmd := exec.Command(s.script, "start-foreground", s.cfg)
	if os.Geteuid() == 0 {
		cmd = exec.Command("nice", "-n", "-10", s.script, "start-foreground", s.cfg)
	}
	cmd.Env = append(os.Environ(),
		"ZOO_LOG_DIR="+filepath.Join(s.dir, "logs"),
		"JVMFLAGS=-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("start %s: %w", s.script, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited

	deadline := time.Now().Add(s.opts.StartTimeout)
	for {
		if ready(s.addr) == nil {
			return nil
		}
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("zookeeper exited while starting: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.killLocked()
			return fmt.Errorf("zookeeper at %s not answering imok after %s: %s", s.addr, s.opts.StartTimeout, s.logTail())
		}
	}
}

// Kill SIGKILLs the server's process group (the whole JVM) and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Pause stops the server's JVM (SIGSTOP) as a long garbage-collection pause or a starved
// machine would: connections stay open but nothing is answered. Resume lets it go on.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	}
}

// Stop asks the server to shut down (SIGTERM) and waits; after 10s it kills it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.exited:
		s.cmd = nil
	case <-time.After(10 * time.Second):
		s.killLocked()
	}
}

// Restart stops the server if it runs and starts it again on the same port and data
// directory, failing the test if it does not come back.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("zktest: restart: %v", err)
	}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// FourLetter sends a four-letter command ("ruok", "stat", "dump", ...) and returns the reply.
func FourLetter(ctx context.Context, addr, cmd string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if _, err := c.Write([]byte(cmd)); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(c)
	return buf.String(), err
}

// SessionLive reports whether the server at addr holds session sid, from the session list of
// its four-letter command "dump": a session that left it was expired or closed. It is an
// error when the server lists no sessions (dump not in 4lw.commands.whitelist, or the server
// not serving yet).
func SessionLive(ctx context.Context, addr string, sid int64) (bool, error) {
	out, err := FourLetter(ctx, addr, "dump")
	if err != nil {
		return false, err
	}
	sessions, _, _ := strings.Cut(out, "ephemeral nodes dump:")
	if !strings.Contains(sessions, "SessionTracker dump:") {
		return false, fmt.Errorf("zktest: dump from %s lists no sessions: %s", addr, strings.TrimSpace(out))
	}
	id := fmt.Sprintf("0x%x", uint64(sid))
	for _, line := range strings.Split(sessions, "\n") {
		if strings.TrimSpace(line) == id {
			return true, nil
		}
	}
	return false, nil
}

// ready checks that the server says imok and serves requests ("imok" comes earlier).
func ready(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := FourLetter(ctx, addr, "ruok")
	if err != nil {
		return err
	}
	if r != "imok" {
		return fmt.Errorf("ruok: %q", r)
	}
	r, err = FourLetter(ctx, addr, "srvr")
	if err != nil {
		return err
	}
	if !strings.Contains(r, "Mode: ") {
		return fmt.Errorf("srvr: %q", r)
	}
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logFile)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
