package agents

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/coord"
)

// keeperLink is the agent's side of its keeper: the keeper's status, and a way to tell it
// that node.json changed.
type keeperLink interface {
	Status() KeeperStatus
	Notify()
}

// externalKeeper is a keeper in a process of its own, reached through its files and SIGUSR1.
type externalKeeper struct {
	dir string

	pid  int
	last KeeperStatus
}

// Status reads keeper.json. It is read every time, not cached by its modification time:
// two rewrites within one tick of the kernel's file clock leave the same time.
func (e *externalKeeper) Status() KeeperStatus {
	b, err := os.ReadFile(filepath.Join(e.dir, keeperStatusFile))
	if err != nil {
		return KeeperStatus{State: KeeperStarting}
	}
	var st KeeperStatus
	if json.Unmarshal(b, &st) == nil {
		e.last, e.pid = st, st.PID
	}
	return e.last
}

func (e *externalKeeper) Notify() {
	if e.pid > 0 {
		_ = syscall.Kill(e.pid, syscall.SIGUSR1)
	}
}

// KeeperArgs is the command line of a keeper process: `stormdock keeper ...`; ParseKeeperArgs
// reads it back, so the two cannot drift.
type KeeperArgs struct {
	Store          string
	Credentials    string // a file holding user:pass for the store
	TLS            coord.TLSFiles
	Node           string
	Host           string
	StateDir       string
	SessionTimeout time.Duration
	RestartGrace   time.Duration
	StoreSilence   time.Duration
	RejoinGrace    time.Duration
}

// Args is the argument list after the binary's name ("keeper" first).
func (k KeeperArgs) Args() []string {
	out := []string{"keeper", "--store", k.Store, "--node-id", k.Node, "--host", k.Host, "--state-dir", k.StateDir,
		"--session-timeout", k.SessionTimeout.String(), "--restart-grace", k.RestartGrace.String(),
		"--store-silence", k.StoreSilence.String()}
	if k.RejoinGrace > 0 {
		out = append(out, "--rejoin-grace", k.RejoinGrace.String())
	}
	if k.Credentials != "" {
		out = append(out, "--store-credentials-file", k.Credentials)
	}
	for _, f := range [][2]string{{"--store-ca", k.TLS.CA}, {"--store-cert", k.TLS.Cert}, {"--store-key", k.TLS.Key}} {
		if f[1] != "" {
			out = append(out, f[0], f[1])
		}
	}
	return out
}

// ParseKeeperArgs reads a keeper's arguments (those after "keeper").
func ParseKeeperArgs(args []string) (KeeperArgs, error) {
	var k KeeperArgs
	fs := flag.NewFlagSet("keeper", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&k.Store, "store", "", "")
	fs.StringVar(&k.Credentials, "store-credentials-file", "", "")
	fs.StringVar(&k.TLS.CA, "store-ca", "", "")
	fs.StringVar(&k.TLS.Cert, "store-cert", "", "")
	fs.StringVar(&k.TLS.Key, "store-key", "", "")
	fs.StringVar(&k.Node, "node-id", "", "")
	fs.StringVar(&k.Host, "host", "", "")
	fs.StringVar(&k.StateDir, "state-dir", "", "")
	fs.DurationVar(&k.SessionTimeout, "session-timeout", 0, "")
	fs.DurationVar(&k.RestartGrace, "restart-grace", 0, "")
	fs.DurationVar(&k.StoreSilence, "store-silence", 0, "")
	fs.DurationVar(&k.RejoinGrace, "rejoin-grace", 0, "")
	if err := fs.Parse(args); err != nil {
		return k, fmt.Errorf("keeper: %w", err)
	}
	if fs.NArg() > 0 {
		return k, fmt.Errorf("keeper: unexpected argument %q", fs.Arg(0))
	}
	if k.Store == "" || k.Node == "" || k.StateDir == "" || k.SessionTimeout <= 0 {
		return k, errors.New("keeper: --store, --node-id, --state-dir and --session-timeout are required")
	}
	return k, nil
}

// startKeeper makes sure a keeper process runs for the agent's state directory: it starts
// one unless one already holds the directory's keeper lock, and waits until the node is
// registered.
func (a *Agent) startKeeper(ctx context.Context) (*externalKeeper, error) {
	dir := a.cfg.StateDir
	link := &externalKeeper{dir: dir}
	unlock, err := flockFile(filepath.Join(dir, keeperLockFile), unix.LOCK_EX)
	switch {
	case err == nil:
		unlock()
		_ = os.Remove(filepath.Join(dir, keeperStatusFile)) // a dead keeper's
		args := KeeperArgs{Store: a.cfg.StoreURL, Credentials: a.cfg.StoreCredentialsFile, TLS: a.cfg.StoreTLS, Node: a.cfg.Node.ID,
			Host: a.cfg.Node.Host, StateDir: dir, SessionTimeout: a.cfg.SessionTimeout,
			RestartGrace: a.cfg.RestartGrace, StoreSilence: a.cfg.StoreSilence, RejoinGrace: a.cfg.RejoinGrace}
		logf, err := os.OpenFile(filepath.Join(dir, "keeper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("agent: keeper log: %w", err)
		}
		defer logf.Close()
		cmd := exec.Command(a.cfg.Self, args.Args()...)
		cmd.Stdout, cmd.Stderr = logf, logf
		// A session of its own: the keeper outlives the agent, and a signal to the agent's
		// process group (Ctrl-C, systemd's stop) does not reach it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("agent: start keeper: %w", err)
		}
		go func() { _ = cmd.Wait() }() // reaped while the agent lives; adopted by init after
		a.log.Info("keeper started", "pid", cmd.Process.Pid, "restart_grace", a.cfg.RestartGrace)
	case errors.Is(err, unix.EWOULDBLOCK):
		a.log.Info("keeper already running: its workers stayed up")
	default:
		return nil, fmt.Errorf("agent: keeper lock: %w", err)
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(a.cfg.SessionTimeout + 30*time.Second)
	for {
		st := link.Status()
		if st.Session != 0 {
			if st.Node != a.cfg.Node.ID || time.Duration(st.SessionTimeout) != a.cfg.SessionTimeout {
				return nil, fmt.Errorf("agent: the keeper running for %s (pid %d) holds node %s with session timeout %s; stop it (kill %d) to change the node's settings",
					dir, st.PID, st.Node, st.SessionTimeout, st.PID)
			}
			return link, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline:
			return nil, fmt.Errorf("agent: the keeper did not register node %s (see %s)", a.cfg.Node.ID, filepath.Join(dir, "keeper.log"))
		case <-t.C:
		}
	}
}
