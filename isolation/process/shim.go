package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/stormdock/stormdock/isolation"
)

// The shim closes the gap between fork and cgroup placement. Go cannot stop a child between
// fork and exec, so the driver starts its own binary (/proc/self/exe) in shim mode: the shim
// blocks on a pipe until the driver has moved it into the worker's cgroup, then execs the
// worker's program in place, keeping its pid. No instruction of the worker's program runs,
// and no child of it can be forked, outside the limits. A second, close-on-exec pipe carries
// an exec failure back, so Start reports "no such file" synchronously and returns only once
// the worker's program is running.
//
// Any binary that imports this package can act as the shim; init below does it before main.
const (
	shimEnv = "_STORMDOCK_ISOLATION_SHIM"
	// shimUserEnv carries "uid:gid[:group,...]" when the worker runs as another user: the
	// shim drops to it once placed, just before the program runs (see dropTo).
	shimUserEnv = "_STORMDOCK_ISOLATION_USER"
	shimMagic   = "exec-after-placement-v1"
	shimArg0    = "stormdock-shim"

	// fds of the two pipes in the shim (os/exec maps ExtraFiles from 3 up).
	shimGoFD     = 3
	shimStatusFD = 4

	// exitShimAbort is the shim's status when the driver gave up before releasing it.
	exitShimAbort = 125
	// exitShimExec is the shim's status when exec of the worker's program failed.
	exitShimExec = 127
)

func init() {
	if os.Getenv(shimEnv) == shimMagic {
		runShim()
	}
}

// runShim waits for the go-ahead and execs os.Args[1] with argv os.Args[2:]. It returns only
// when the program is this binary itself, which then runs in place.
func runShim() {
	syscall.CloseOnExec(shimGoFD)
	syscall.CloseOnExec(shimStatusFD)
	goAhead := os.NewFile(shimGoFD, "shim-go")
	status := os.NewFile(shimStatusFD, "shim-status")
	var b [1]byte
	if n, _ := goAhead.Read(b[:]); n != 1 {
		// The driver closed the pipe without a byte: it could not place us. Run nothing.
		os.Exit(exitShimAbort)
	}
	if len(os.Args) < 3 {
		fmt.Fprintf(status, "shim: no program given")
		os.Exit(exitShimExec)
	}
	// Whether the program is this binary is decided before the drop: as the worker's user
	// the agent's own directory may be out of reach.
	self := sameExecutable(os.Args[1])
	if u := os.Getenv(shimUserEnv); u != "" {
		os.Unsetenv(shimUserEnv)
		if err := dropTo(u); err != nil {
			fmt.Fprintf(status, "run as %s: %v", u, err)
			os.Exit(exitShimExec)
		}
	}
	if self {
		// The program is this very binary (the agent's lease launcher): run it in place
		// rather than start a second Go runtime, which costs tens of milliseconds of cpu per
		// worker. Closing the status pipe tells the driver the program runs, as the
		// close-on-exec of a successful exec would; main then sees the program's argv.
		os.Unsetenv(shimEnv)
		goAhead.Close()
		status.Close()
		os.Args = os.Args[2:]
		return
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, shimEnv+"=") || strings.HasPrefix(kv, shimUserEnv+"=")
	})
	err := syscall.Exec(os.Args[1], os.Args[2:], env)
	fmt.Fprintf(status, "exec %s: %v", os.Args[1], err)
	os.Exit(exitShimExec)
}

// sameExecutable reports whether path is the binary this process runs.
func sameExecutable(path string) bool {
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return false
	}
	other, err := os.Stat(path)
	return err == nil && os.SameFile(self, other)
}

// launchOpts is what launch runs and where.
type launchOpts struct {
	path string   // resolved program path
	argv []string // argv, argv[0] included
	env  []string
	dir  string
	out  *os.File        // stdout and stderr
	user *isolation.User // who the program runs as; nil: the driver's user
	// place moves the started shim into its cgroup; the program runs only if it succeeds.
	place func(pid int) error
}

// errExec marks a failure of the worker's program to exec (as opposed to a driver failure).
var errExec = errors.New("exec worker program")

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
	env := append(slices.Clip(o.env), shimEnv+"="+shimMagic)
	if u := o.user; u != nil {
		spec := fmt.Sprintf("%d:%d:", u.UID, u.GID)
		for i, g := range u.Groups {
			if i > 0 {
				spec += ","
			}
			spec += strconv.FormatUint(uint64(g), 10)
		}
		env = append(env, shimUserEnv+"="+spec)
	}
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       append([]string{shimArg0, o.path}, o.argv...),
		Env:        env,
		Dir:        o.dir,
		Stdout:     o.out,
		Stderr:     o.out,
		ExtraFiles: []*os.File{goR, stW},
		// A process group of its own: a Ctrl-C meant for the agent's terminal must not reach
		// workers, which are stopped with their grace period instead.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = cmd.Start()
	goR.Close()
	stW.Close()
	if err != nil {
		goW.Close()
		stR.Close()
		return nil, fmt.Errorf("start shim: %w", err)
	}
	if err := o.place(cmd.Process.Pid); err != nil {
		goW.Close() // the shim sees EOF and exits without running the program
		stR.Close()
		_ = cmd.Wait()
		return nil, err
	}
	_, werr := goW.Write([]byte{1})
	goW.Close()
	// EOF without data: the status pipe closed on a successful exec (or the shim died, which
	// the caller's wait reports).
	msg, rerr := io.ReadAll(stR)
	stR.Close()
	if werr != nil || rerr != nil || len(msg) > 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		switch {
		case len(msg) > 0:
			return nil, fmt.Errorf("%w: %s", errExec, msg)
		case werr != nil:
			return nil, fmt.Errorf("release shim: %w", werr)
		default:
			return nil, fmt.Errorf("read shim status: %w", rerr)
		}
	}
	return cmd, nil
}
