package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/shim"
)

// The shim closes the gap between fork and cgroup placement (the protocol is in package
// shim). Go cannot stop a child between fork and exec, so the driver starts a shim that
// blocks on a pipe until the driver has moved it into the worker's cgroup, then execs the
// worker's program in place, keeping its pid. No instruction of the worker's program runs,
// and no child of it can be forked, outside the limits. A second, close-on-exec pipe carries
// an exec failure back, so Start reports "no such file" synchronously and returns only once
// the worker's program is running. Where the kernel can start a process inside a cgroup
// (cgroup v2, clone3 with CLONE_INTO_CGROUP, Linux 5.7) the shim is born there and released
// at once: there is no move after fork. The shim runs as the driver's user until it drops to
// the worker's, so its own environment is the protocol's alone; the worker's comes on a memfd
// and is its program's only.
//
// The shim is Config.Shim, by default stormdock-shim beside the running binary. Without one,
// the running binary is its own shim: the init below hands it over to the shim package.
func init() { shim.Run() }

// launchOpts is what launch runs and where.
type launchOpts struct {
	shim string   // the shim binary
	path string   // resolved program path
	argv []string // argv, argv[0] included
	env  []string
	dir  string
	out  *os.File        // stdout and stderr
	user *isolation.User // who the program runs as; nil: the driver's user
	// cgroupFD, when >= 0, is the worker's cgroup directory (v2): the shim is cloned into it.
	cgroupFD int
	// selfPlace, when set, are the tasks files the shim moves itself into (v1).
	selfPlace []string
	// place moves the started shim into its cgroup; the program runs only if it succeeds.
	// Not called when the shim was cloned into its cgroup.
	place func(pid int) error
	// phase records the end of a step of the start, for the trace in the driver's log.
	phase func(name string)
}

// errExec marks a failure of the worker's program to exec (as opposed to a driver failure).
var errExec = errors.New("exec worker program")

// errCloneInto marks a failure of clone3 with CLONE_INTO_CGROUP, after which nothing runs:
// the caller may start the shim again without it.
var errCloneInto = errors.New("clone into cgroup")

// errSelfPlace marks a shim that did not place itself (it cannot, or it does not speak that
// part of the protocol), after which nothing of the worker ran: the caller may start it again
// and move it itself.
var errSelfPlace = errors.New("shim did not place itself")

// launch starts the shim, places it, releases it, and returns once the program runs.
func launch(o launchOpts) (*exec.Cmd, error) {
	goR, goW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("shim pipe: %w", err)
	}
	stR, stW, err := os.Pipe()
	if err != nil {
		goR.Close()
		goW.Close()
		return nil, fmt.Errorf("shim pipe: %w", err)
	}
	magic := shim.Magic
	if o.selfPlace != nil {
		magic = shim.MagicSelf
	}
	// The shim's own environment is the protocol's alone: it runs as the driver's user until
	// the drop, and nothing of the worker's (LD_PRELOAD for a cgo-linked shim's loader,
	// GODEBUG for its runtime) may steer it. The worker's comes on EnvFD.
	env := []string{shim.Env + "=" + magic}
	if o.selfPlace != nil {
		env = append(env, shim.PlaceEnv+"="+strings.Join(o.selfPlace, shim.PlaceSep))
	}
	if u := o.user; u != nil {
		env = append(env, shim.UserEnv+"="+shim.UserSpec(u.UID, u.GID, u.Groups))
	}
	envF, err := envFile(o.env)
	if err != nil {
		goR.Close()
		goW.Close()
		stR.Close()
		stW.Close()
		return nil, err
	}
	cmd := &exec.Cmd{
		Path:       o.shim,
		Args:       append([]string{shim.Arg0, o.path}, o.argv...),
		Env:        env,
		Dir:        o.dir,
		Stdout:     o.out,
		Stderr:     o.out,
		ExtraFiles: []*os.File{goR, stW, envF},
		// A process group of its own: a Ctrl-C meant for the agent's terminal must not reach
		// workers, which are stopped with their grace period instead.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if o.cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, o.cgroupFD
	}
	err = cmd.Start()
	goR.Close()
	stW.Close()
	envF.Close()
	if err != nil {
		goW.Close()
		stR.Close()
		if o.cgroupFD >= 0 {
			return nil, fmt.Errorf("%w: %w", errCloneInto, err)
		}
		return nil, fmt.Errorf("start shim %s: %w", o.shim, err)
	}
	o.phase("fork")
	if o.cgroupFD < 0 && o.selfPlace == nil {
		if err := o.place(cmd.Process.Pid); err != nil {
			goW.Close() // the shim sees EOF and exits without running the program
			stR.Close()
			_ = cmd.Wait()
			return nil, err
		}
		o.phase("place")
	}
	_, werr := goW.Write([]byte{1})
	goW.Close()
	if o.selfPlace != nil && werr == nil {
		var b [1]byte
		if n, _ := io.ReadFull(stR, b[:]); n != 1 || b[0] != shim.Placed {
			msg, _ := io.ReadAll(stR)
			stR.Close()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("%w: %s", errSelfPlace, strings.TrimSpace(string(b[:n])+string(msg)))
		}
		o.phase("place")
	}
	// Exec, then EOF: the status pipe closed on a successful exec (or the program died,
	// which the caller's wait reports). EOF without Exec: the shim ended without running
	// anything, as one that does not speak this protocol does.
	msg, rerr := io.ReadAll(stR)
	stR.Close()
	execd := len(msg) > 0 && msg[0] == shim.Exec
	if execd {
		msg = msg[1:]
	}
	if werr != nil || rerr != nil || len(msg) > 0 || !execd {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		switch {
		case len(msg) > 0:
			return nil, fmt.Errorf("%w: %s", errExec, msg)
		case rerr != nil:
			return nil, fmt.Errorf("read shim status: %w", rerr)
		case !execd:
			// Whether or not the go-ahead reached it (a shim gone before fails the write).
			return nil, fmt.Errorf("shim %s ended (%v) without running the program: it does not speak protocol %s (a stormdock-shim of another version?): install the stormdock-shim built with this stormdock beside it",
				o.shim, cmd.ProcessState, magic)
		default:
			return nil, fmt.Errorf("release shim: %w", werr)
		}
	}
	o.phase("exec")
	return cmd, nil
}

// envFile is the worker's environment as the shim reads it on shim.EnvFD: a memfd written
// whole before the shim starts, so that neither side waits for the other, whatever its size.
// The protocol's variables are the driver's alone (who the worker runs as, which files the
// shim writes as root): the worker's environment loses any of them here.
func envFile(env []string) (*os.File, error) {
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, shim.EnvPrefix) })
	for _, kv := range env {
		if strings.IndexByte(kv, 0) >= 0 {
			return nil, fmt.Errorf("%w: environment entry %q holds a NUL byte: remove it", errExec, kv)
		}
	}
	fd, err := unix.MemfdCreate("stormdock-worker-env", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("worker environment file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "worker-env")
	if _, err := f.Write(shim.EncodeEnv(env)); err != nil {
		f.Close()
		return nil, fmt.Errorf("write worker environment: %w", err)
	}
	return f, nil
}

// phases times the steps of one start for the driver's debug log: where a start's time goes.
type phases struct {
	last  time.Time
	steps []any // name, duration pairs for slog
}

func newPhases() *phases { return &phases{last: time.Now()} }

func (p *phases) mark(name string) {
	now := time.Now()
	p.steps = append(p.steps, name, now.Sub(p.last).Round(time.Microsecond).String())
	p.last = now
}
