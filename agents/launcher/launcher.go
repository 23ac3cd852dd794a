// Package launcher is the lease launcher, the program every worker of a node runs under: it
// runs the worker as its child and stops it once the node's keeper stops renewing the
// worker's lease (see package agents). It runs once per worker start, inside the worker's
// cgroup and as the worker's user, so it imports nothing heavy: stormdock-shim (the shim and
// this launcher in one small binary) starts it in about a millisecond of cpu.
package launcher

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/agents/leasefile"
)

// Config configures the lease launcher (`stormdock-shim launch`, or `stormdock launch`): it runs
// Command as its child and stops it when the agent stops renewing the lease.
type Config struct {
	// Lease is the lease file the node's keeper renews (package leasefile).
	Lease string
	// TTL is how old the lease may get before the worker is stopped.
	TTL time.Duration
	// Grace is how long the worker has to exit after SIGTERM before it is killed.
	Grace time.Duration
	// Check is how often the lease is looked at. Default TTL/10, between 20ms and 100ms: it
	// bounds how long a worker outlives its lease, the overlap with its replacement.
	Check   time.Duration
	Command []string
	// Clock is the boot clock leases are stamped on; nil: leasefile.Now. Tests set another.
	Clock leasefile.Clock
	// Stderr receives the launcher's own messages. Default os.Stderr.
	Stderr io.Writer
}

// ErrLeaseExpired is reported (with the worker's exit status) when the launcher stopped the
// worker because its lease lapsed.
var ErrLeaseExpired = errors.New("lease expired")

// ExitLeaseLapsed is the launcher's exit status when it stopped the worker because the
// lease lapsed (EX_TEMPFAIL of sysexits.h: a fault outside the worker, to be retried). A
// worker's program may exit with it too, so the status alone proves nothing: the agent
// counts such an exit as a lapse only when its own view of the lease (the keeper's record
// of when the lease was last lapsed, or the lease file) says the lease had lapsed when the
// worker ended (see agents.run.exitReason); otherwise it is a crash like any other.
const ExitLeaseLapsed = 75

// forwarded are the signals the launcher passes on to the worker.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2}

// Run runs cfg.Command and returns its wait status once it has exited. Signals in
// forwarded reach the worker; ctx being done counts as a SIGTERM (the CLI cancels it on
// SIGTERM). When the lease lapses (see watch.lapsed) the worker gets SIGTERM, then after
// Grace SIGKILL for its whole process group, and Run returns its status with ErrLeaseExpired.
func Run(ctx context.Context, cfg Config) (syscall.WaitStatus, error) {
	if cfg.Lease == "" || cfg.TTL <= 0 || len(cfg.Command) == 0 {
		return 0, errors.New("launch: need a lease file, a ttl and a command")
	}
	if cfg.Check <= 0 {
		cfg.Check = min(max(cfg.TTL/10, 20*time.Millisecond), 100*time.Millisecond)
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if cfg.Clock == nil {
		cfg.Clock = leasefile.Now
	}
	lease := &watch{path: cfg.Lease, ttl: cfg.TTL, clock: cfg.Clock, boot: leasefile.BootID()}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// The worker starts with SIGHUP ignored: a live change of its configuration is told with
	// SIGHUP, and a worker that does not handle it (yet: one just starting, or one that never
	// will) would otherwise die of it. A Go worker that calls signal.Notify for SIGHUP gets it
	// (os/signal: a signal ignored at start is delivered once notified); others go on. The
	// launcher catches it again once the worker runs.
	signal.Ignore(syscall.SIGHUP)
	// A shared lock on the lease for as long as the worker may run: the node's keeper knows
	// every worker stopped once it can lock the node lease, which this lease is a link of.
	if f, err := os.Open(cfg.Lease); err == nil {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		defer f.Close()
	}

	// The lease's generation is read before the worker starts: a renewal in a new
	// generation right after the start must stop it too.
	lease.begin = cfg.Clock()
	_ = lease.lapsed()

	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	if self, err := os.Executable(); err == nil && cfg.Command[0] == self {
		// The agent's own binary (a job's `stormdock` command): through /proc/self/exe,
		// which a worker's user may run even where the binary's directory is out of its reach.
		cmd.Path = "/proc/self/exe"
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// A process group of its own, so that a lapsed lease can kill what the worker forked too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Start()
	signal.Notify(sigs, syscall.SIGHUP)
	if err != nil {
		return 0, fmt.Errorf("launch: %w", err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()

	check := time.NewTicker(cfg.Check)
	defer check.Stop()
	var kill <-chan time.Time
	ctxDone := ctx.Done()
	expired := false
	pid := cmd.Process.Pid
	for {
		select {
		case <-done:
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ok {
				return 0, fmt.Errorf("launch: wait: %w", waitErr)
			}
			if expired {
				return ws, ErrLeaseExpired
			}
			return ws, nil
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case <-ctxDone:
			ctxDone = nil
			_ = cmd.Process.Signal(syscall.SIGTERM)
		case <-check.C:
			if expired {
				continue
			}
			why := lease.lapsed()
			if why == "" {
				continue
			}
			expired = true
			fmt.Fprintf(cfg.Stderr, "stormdock launch: lease %s %s: stopping the worker (pid %d)\n", cfg.Lease, why, pid)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(cfg.Grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			fmt.Fprintf(cfg.Stderr, "stormdock launch: grace period %s over: killing the worker\n", cfg.Grace)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
}

// watch is the launcher's view of its lease.
type watch struct {
	path  string
	ttl   time.Duration
	clock leasefile.Clock
	boot  string        // this boot's id
	begin time.Duration // the worker's start, on the boot clock

	last leasefile.Record // the last record read
	have bool             // one was read; its generation is the worker's
	gen  uint64
}

// lapsed says why the lease has lapsed, "" while it has not: its last record is older than
// the ttl (on the boot clock), of another boot, or of another generation than the first one
// read (the keeper renewed it after a lapse this launcher did not see: the worker's time
// ended then). A lease that cannot be read (missing, or torn while rewritten) counts by the
// last record read, or from the worker's start: the agent creates it before the worker
// starts, so it goes missing only with the agent's state.
func (w *watch) lapsed() string {
	r, err := leasefile.Stamp(w.path, w.clock)
	if err == nil {
		if !w.have {
			w.have, w.gen = true, r.Gen
		}
		w.last = r
	}
	now := w.clock()
	switch {
	case !w.have:
		if now-w.begin > w.ttl {
			return fmt.Sprintf("not readable for %s (%v)", w.ttl, err)
		}
	case w.last.Gen != w.gen:
		return fmt.Sprintf("renewed after a lapse (generation %d, the worker's %d)", w.last.Gen, w.gen)
	case w.last.Lapsed(now, w.ttl, w.boot):
		if w.boot != "" && w.last.Boot != w.boot {
			return "stamped in another boot"
		}
		return fmt.Sprintf("not renewed for %s", w.ttl)
	}
	return ""
}

// describe says how the worker ended, for the launcher's own messages.
func describe(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit %d", ws.ExitStatus())
}

// ExitLike ends the process the way the worker ended: with its exit code, or killed by the
// same signal, so the driver sees the worker's own exit (128+signal, OOM kills included).
func ExitLike(ws syscall.WaitStatus) {
	if ws.Signaled() {
		sig := ws.Signal()
		signal.Reset(sig)
		_ = syscall.Kill(os.Getpid(), sig)
		time.Sleep(100 * time.Millisecond) // let the signal land
		os.Exit(128 + int(sig))
	}
	os.Exit(ws.ExitStatus())
}

// Main is the `launch` subcommand: it parses args (those after the subcommand's name), runs
// the worker until it ends and exits the way it did (ExitLike). It returns only on bad
// input, with the exit status to use: 1 for a bad or missing flag, 2 without a command (the
// message, on stderr, says what to give), 127 when the worker cannot start, and
// ExitLeaseLapsed once it stopped the worker for a lapsed lease. -h or --help prints the
// flags and returns 0.
func Main(args []string, stderr io.Writer) int {
	var cfg Config
	if err := cfg.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "usage: launch --lease FILE --ttl D [--grace D] -- COMMAND [ARGS...]\n%s\n", Usage())
			return 0
		}
		fmt.Fprintf(stderr, "stormdock launch: %v (see --help)\n", err)
		return 1
	}
	if len(cfg.Command) == 0 {
		fmt.Fprintln(stderr, "stormdock launch: no command given (flags first, then -- COMMAND)")
		return 2
	}
	cfg.Stderr = stderr
	// SIGTERM reaches the worker through Run's forwarding; the context is for callers that
	// stop the launcher themselves.
	ws, err := Run(context.Background(), cfg)
	if errors.Is(err, ErrLeaseExpired) {
		// Stopped by the launcher, not the worker's own end: say so to the agent.
		fmt.Fprintf(stderr, "stormdock launch: worker stopped for its lapsed lease (%s); exiting %d\n", describe(ws), ExitLeaseLapsed)
		return ExitLeaseLapsed
	}
	if err != nil {
		fmt.Fprintln(stderr, "stormdock launch: "+err.Error())
		return 127
	}
	ExitLike(ws)
	return 0 // not reached
}
