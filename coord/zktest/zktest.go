// Package zktest starts real ZooKeeper servers for tests: standalone servers and ensembles on
// free loopback ports or on hosts of a network lab, from generated zoo.cfg files, killable,
// pausable and restartable on the same ports and data directories.
package zktest

import (
	"bytes"
	"context"
	"crypto/tls"
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

// Options tune test servers.
type Options struct {
	// TickTime is ZooKeeper's tick; sessions may last 2 to 20 ticks. Default 200ms for a
	// standalone server, 250ms for an ensemble (its members also time each other out in
	// ticks, and a loaded machine needs the room).
	TickTime time.Duration
	// StartTimeout bounds the wait for a server (and for an ensemble's quorum) to answer.
	// Default 30s.
	StartTimeout time.Duration
	// Hosts runs server i on Hosts[i], a host of a network lab (internal/netlab), instead of
	// on loopback ports of this machine: the server runs in the host's network and listens on
	// its address with ZooKeeper's standard ports (client 2181, quorum 2888, election 3888).
	// An ensemble needs one host per server.
	Hosts []Host
	// Dial connects the test to its servers (the four-letter words); nil: this machine's
	// network. A lab's hosts are reached through the lab (netlab.Lab.DialContext).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxClientCnxns caps connections from one client address (ZooKeeper's default is 60);
	// 0 means no cap, which a benchmark that runs thousands of simulated agents in one
	// process needs: each holds a session of its own.
	MaxClientCnxns int
	// Heap is the server's JVM heap ("256m", "2g"). Default 256m for a standalone server,
	// 128m for an ensemble member.
	Heap string
	// MaxSessionTimeout caps the sessions the server grants (maxSessionTimeout); 0 keeps
	// ZooKeeper's 20 ticks. A client asking for more gets this.
	MaxSessionTimeout time.Duration
	// SyncLimit is how many ticks a follower goes without hearing from its leader before it
	// gives up on it (and a leader on a follower); 0 keeps the tests' 5. Until then a
	// follower cut off from its leader goes on answering its clients' reads and pings.
	SyncLimit int
	// SyncTxnLog makes the server sync its transaction log to disk before it answers, as a
	// production server does (forceSync=yes). Off by default: see writeConfig.
	SyncTxnLog bool
	// TLS makes the servers serve clients over TLS only, on secureClientPort (Netty, PEM
	// stores) with no plain clientPort, with certificates for their addresses signed by a
	// CA the test makes (Server.CAFile); URL gives zks:// URLs. The four-letter words go
	// over TLS too.
	TLS bool
	// ClientAuth makes TLS servers ask every client for a certificate signed by that CA
	// (ssl.clientAuth=need); Server.ClientCert issues one.
	ClientAuth bool
}

// Host is a machine of a test network that a server can run on (netlab.Host is one).
type Host interface {
	// IP is the host's address, which the server listens on and advertises to its peers.
	IP() string
	// Command runs a program in the host's network.
	Command(name string, args ...string) *exec.Cmd
}

// Standard ZooKeeper ports, used on lab hosts (each has an address of its own).
const (
	clientPort   = 2181
	quorumPort   = 2888
	electionPort = 3888
)

func (o Options) withDefaults(tick time.Duration, heap string) Options {
	if o.TickTime <= 0 {
		o.TickTime = tick
	}
	if o.Heap == "" {
		o.Heap = heap
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	return o
}

// Server is a ZooKeeper server run by a test: standalone (Start) or a member of an ensemble
// (StartEnsemble).
type Server struct {
	t       testing.TB
	script  string
	dir     string
	cfg     string
	logFile string
	addr    string
	id      int // myid in an ensemble, 0 for a standalone server
	heap    string
	opts    Options
	host    Host // nil: this machine's loopback

	ca  *testCA // TLS servers: the CA of the servers' certificates
	tls *tls.Config

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs a standalone ZooKeeper server for the test and stops it when the test ends. A
// missing ZooKeeper skips the test, or fails it under CI=true (internal/testenv).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	// 256 MiB: a standalone server holds a whole local cluster's state in e2e tests.
	opts = opts.withDefaults(200*time.Millisecond, "256m")
	servers := launch(t, 1, opts)
	return servers[0]
}

// launch writes the configuration of n servers (n == 1: standalone, no server.N lines),
// starts them all at once (members must find each other to elect a leader) and waits until
// each answers: a standalone server must serve, an ensemble member only answer imok (it
// serves once a quorum has formed; StartEnsemble waits for that).
func launch(t testing.TB, n int, opts Options) []*Server {
	t.Helper()
	script := testenv.ZKServerScript(t)
	// Each server's address and client, quorum and election ports.
	type where struct {
		ip                   string
		client, quorum, elec int
	}
	at := make([]where, n)
	if opts.Hosts != nil {
		if len(opts.Hosts) != n {
			t.Fatalf("zktest: %d servers on %d hosts: want one host per server", n, len(opts.Hosts))
		}
		for i, h := range opts.Hosts {
			at[i] = where{h.IP(), clientPort, quorumPort, electionPort}
		}
	} else {
		ports, err := freePorts(n * 3)
		if err != nil {
			t.Fatalf("zktest: free ports: %v", err)
		}
		for i := range at {
			at[i] = where{"127.0.0.1", ports[3*i], ports[3*i+1], ports[3*i+2]}
		}
	}
	var peers strings.Builder
	if n > 1 {
		for i, w := range at {
			fmt.Fprintf(&peers, "server.%d=%s:%d:%d\n", i+1, w.ip, w.quorum, w.elec)
		}
	}
	var ca *testCA
	if opts.TLS {
		var err error
		if ca, err = newTestCA(t.TempDir()); err != nil {
			t.Fatalf("zktest: %v", err)
		}
	}
	servers := make([]*Server, n)
	for i := range servers {
		dir := t.TempDir()
		s := &Server{
			t:       t,
			script:  script,
			dir:     dir,
			cfg:     filepath.Join(dir, "zoo.cfg"),
			logFile: filepath.Join(dir, "server.out"),
			addr:    net.JoinHostPort(at[i].ip, strconv.Itoa(at[i].client)),
			heap:    opts.Heap,
			opts:    opts,
		}
		if opts.Hosts != nil {
			s.host = opts.Hosts[i]
		}
		if ca != nil {
			if err := s.setupTLS(ca, at[i].ip); err != nil {
				t.Fatalf("zktest: %v", err)
			}
		}
		if n > 1 {
			s.id = i + 1
		}
		if err := s.writeConfig(at[i].ip, at[i].client, peers.String()); err != nil {
			t.Fatalf("zktest: %v", err)
		}
		// Registered after t.TempDir: cleanups run last-in first-out, so the JVM is dead
		// before its directory is removed.
		t.Cleanup(s.Kill)
		servers[i] = s
	}
	for _, s := range servers {
		if err := s.spawn(); err != nil {
			t.Fatalf("zktest: %v", err)
		}
	}
	for _, s := range servers {
		if err := s.waitUp(); err != nil {
			t.Fatalf("zktest: %v", err)
		}
	}
	return servers
}

// writeConfig writes zoo.cfg (and myid for an ensemble member). forceSync=no: a test
// server's log need not reach the disk before it answers (a killed JVM's writes still
// survive in the page cache); on a loaded machine an fsync per write stalls the server long
// enough to expire sessions.
func (s *Server) writeConfig(clientIP string, clientPort int, peers string) error {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	if s.id != 0 {
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(s.id)+"\n"), 0o644); err != nil {
			return fmt.Errorf("write myid: %w", err)
		}
	}
	syncLimit := 5
	if s.opts.SyncLimit > 0 {
		syncLimit = s.opts.SyncLimit
	}
	forceSync := "no"
	if s.opts.SyncTxnLog {
		forceSync = "yes"
	}
	cfg := fmt.Sprintf(`tickTime=%d
initLimit=10
syncLimit=%d
dataDir=%s
%s
admin.enableServer=false
4lw.commands.whitelist=*
maxClientCnxns=%d
forceSync=%s
%s`, s.opts.TickTime.Milliseconds(), syncLimit, data, s.clientConfig(clientIP, clientPort), max(s.opts.MaxClientCnxns, 0), forceSync, peers)
	if s.opts.MaxSessionTimeout > 0 {
		cfg += fmt.Sprintf("\nmaxSessionTimeout=%d\n", s.opts.MaxSessionTimeout.Milliseconds())
	}
	if err := os.WriteFile(s.cfg, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write zoo.cfg: %w", err)
	}
	return nil
}

// Addr returns the server's client host:port.
func (s *Server) Addr() string { return s.addr }

// URL returns a coord store URL for the server alone with the given chroot ("" for none):
// zks:// for a TLS server.
func (s *Server) URL(chroot string) string {
	if s.ca != nil {
		return "zks://" + s.addr + chroot
	}
	return "zk://" + s.addr + chroot
}

// TickTime returns the server's tick.
func (s *Server) TickTime() time.Duration { return s.opts.TickTime }

// ID returns the server's myid in its ensemble, 0 for a standalone server.
func (s *Server) ID() int { return s.id }

// String names the server in test logs.
func (s *Server) String() string {
	if s.id == 0 {
		return "zk " + s.addr
	}
	return fmt.Sprintf("zk%d %s", s.id, s.addr)
}

// jvmFlags: Debian's zkEnv.sh overwrites CLASSPATH and ZOO_LOG_DIR but zkServer.sh passes
// JVMFLAGS (SERVER_JVMFLAGS prepended) after its own -cp, and java takes the last -cp. The
// package has no SLF4J binding, so the server logs nothing; slf4j-simple (from libslf4j-java,
// which zookeeper depends on) on the class path makes it log to stderr, into server.out.
func (s *Server) jvmFlags() string {
	flags := "-Xmx" + s.heap + " -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
	cp := "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar"
	const binding = "/usr/share/java/slf4j-simple.jar"
	if _, err := os.Stat(binding); err == nil {
		cp += ":" + binding
		flags += " -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"
	}
	// Netty's codec and resolver (libnetty-java, which zookeeper depends on) are not on the
	// package's class path (zookeeper.jar's manifest lists handler and transport only):
	// without them the first TLS client kills the channel (ClassNotFoundException:
	// io.netty.handler.codec.ByteToMessageDecoder).
	for _, jar := range []string{"/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar"} {
		if _, err := os.Stat(jar); err == nil {
			cp += ":" + jar
		}
	}
	return flags + " -cp " + cp
}

// spawn starts the server's process without waiting for it to answer.
func (s *Server) spawn() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	out, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "==== zktest: starting %s at %s\n", s, time.Now().Format("15:04:05.000"))
	// The server runs at a higher CPU priority than the test's other processes, as it would on
	// machines of its own: on a two-core machine running hundreds of workers, a starved JVM
	// answers no pings and expires every session at once.
	args := []string{s.script, "start-foreground", s.cfg}
	if os.Geteuid() == 0 {
		args = append([]string{"nice", "-n", "-10"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if s.host != nil {
		cmd = s.host.Command(args[0], args[1:]...)
	}
	// JMX is not used and costs startup time and memory in every JVM.
	cmd.Env = append(os.Environ(), "JMXDISABLE=true", "JVMFLAGS="+s.jvmFlags())
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
	return nil
}

// waitUp waits until the server answers: a standalone server must serve (srvr shows a
// Mode line), an ensemble member must answer imok.
func (s *Server) waitUp() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s is not running", s)
	}
	check := s.ready
	if s.id != 0 {
		check = s.alive
	}
	deadline := time.Now().Add(s.opts.StartTimeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			s.mu.Lock()
			if s.cmd == cmd {
				s.cmd = nil
			}
			s.mu.Unlock()
			return fmt.Errorf("%s exited while starting: %s", s, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Kill()
			return fmt.Errorf("%s not answering after %s (%v): %s", s, s.opts.StartTimeout, err, s.logTail())
		}
	}
}

// Kill SIGKILLs the server's process group (the whole JVM) and waits for it to exit. A
// paused server dies too.
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
// machine would: connections stay open and the kernel still accepts new ones, but nothing
// is answered. Resume lets it go on.
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

// Stop asks the server to shut down (SIGTERM, and SIGCONT in case it is paused) and waits;
// after 10s it kills it.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGCONT)
	select {
	case <-s.exited:
		s.cmd = nil
	case <-time.After(10 * time.Second):
		s.killLocked()
	}
}

// Restart stops the server if it runs and starts it again on the same ports and data
// directory, failing the test if it does not come back: a standalone server must serve
// again, an ensemble member only answer (whether it serves depends on the others; see
// Ensemble.WaitServing).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.spawn(); err != nil {
		s.t.Fatalf("zktest: restart: %v", err)
	}
	if err := s.waitUp(); err != nil {
		s.t.Fatalf("zktest: restart: %v", err)
	}
}

// Running reports whether the server process is up (paused counts as up).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Mode asks the server with srvr and returns its mode ("standalone", "leader", "follower",
// ...); an error if it does not answer or does not serve (no quorum).
func (s *Server) Mode(ctx context.Context) (string, error) {
	return mode(ctx, s.dial(), s.addr)
}

// dial is how the test reaches the server's client port: Options.Dial, over TLS for a TLS
// server.
func (s *Server) dial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.tls == nil {
		return s.opts.Dial
	}
	return tlsDialer(s.opts.Dial, s.tls)
}

// Host is the lab host the server runs on, nil for loopback.
func (s *Server) Host() Host { return s.host }

// FourLetter sends a four-letter command to the server (through Options.Dial).
func (s *Server) FourLetter(ctx context.Context, cmd string) (string, error) {
	return fourLetter(ctx, s.dial(), s.addr, cmd)
}

// SessionLive is the package's SessionLive for this server (over TLS for a TLS server).
func (s *Server) SessionLive(ctx context.Context, sid int64) (bool, error) {
	return sessionLive(ctx, s.dial(), s.addr, sid)
}

// Log returns everything the server wrote (all its runs), for tests that look for what the
// server did (elections, session expiry).
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logFile)
	return string(b)
}

// FourLetter sends a four-letter command ("ruok", "stat", "dump", ...) and returns the reply.
func FourLetter(ctx context.Context, addr, cmd string) (string, error) {
	return fourLetter(ctx, nil, addr, cmd)
}

func fourLetter(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr, cmd string) (string, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	c, err := dial(ctx, "tcp", addr)
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
// its four-letter command "dump": a session that left it was expired or closed. A leader or
// a standalone server lists the ids alone ("Session Sets"), a follower each with its timeout
// ("Global Sessions": "0x... 2000ms"). It is an error when the server lists no sessions (dump
// not in 4lw.commands.whitelist, or the server not serving yet).
func SessionLive(ctx context.Context, addr string, sid int64) (bool, error) {
	return sessionLive(ctx, nil, addr, sid)
}

func sessionLive(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr string, sid int64) (bool, error) {
	out, err := fourLetter(ctx, dial, addr, "dump")
	if err != nil {
		return false, err
	}
	sessions, _, _ := strings.Cut(out, "ephemeral nodes dump:")
	if !strings.Contains(sessions, "SessionTracker dump:") {
		return false, fmt.Errorf("zktest: dump from %s lists no sessions: %s", addr, strings.TrimSpace(out))
	}
	id := fmt.Sprintf("0x%x", uint64(sid))
	for _, line := range strings.Split(sessions, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == id {
			return true, nil
		}
	}
	return false, nil
}

func mode(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr string) (string, error) {
	r, err := fourLetter(ctx, dial, addr, "srvr")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(r, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("srvr: %q", strings.TrimSpace(r))
}

// alive checks that the server process answers imok (it does so before it serves).
func (s *Server) alive() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := s.FourLetter(ctx, "ruok")
	if err != nil {
		return err
	}
	if r != "imok" {
		return fmt.Errorf("ruok: %q", r)
	}
	return nil
}

// ready checks that the server says imok and serves requests ("imok" comes earlier).
func (s *Server) ready() error {
	if err := s.alive(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := s.Mode(ctx)
	return err
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logFile)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// freePorts returns n distinct free loopback ports, holding each until all are found so that
// one search cannot return the same port twice. Another process may still take one before
// the server binds it; the server then fails to start and says so in its log.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
