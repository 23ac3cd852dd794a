// Package process runs stormdock workers as host processes, each in a cgroup of its own that
// limits memory (no swap), cpu and pids, on cgroup v1 or v2 (github.com/containerd/cgroups/v3).
package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/isolation"
	"github.com/stormdock/stormdock/isolation/shim"
)

// Config configures a Driver. The zero value works for an agent running as root.
type Config struct {
	// CgroupParent is the cgroup, below the hierarchy root, that holds one cgroup per worker.
	// Default "/stormdock". Agents sharing a host need distinct parents or distinct worker ids.
	CgroupParent string
	// CgroupRoot is the cgroup v2 mount point. Default "/sys/fs/cgroup".
	CgroupRoot string
	// StateDir holds one state file per worker, so a restarted agent adopts its workers.
	// Default "/var/lib/stormdock/process".
	StateDir string
	// LogDir holds worker logs when the spec names none. Default StateDir/logs.
	LogDir string
	// PollInterval is how often adopted workers (not children of this process) are checked
	// for exit. Default 100ms.
	PollInterval time.Duration
	// LogCheckInterval is how often log sizes are checked against their cap. Default 1s.
	LogCheckInterval time.Duration
	// Unconfined runs workers without cgroups, in process groups of their own, for when no
	// cgroup hierarchy is writable (not root; a container without nested cgroups). Nothing
	// is limited then.
	Unconfined bool
	// Shim is the binary every worker starts as (see package shim). Default: stormdock-shim
	// beside the running binary, else the running binary itself, which is a shim too (this
	// package's init), at the cost of its whole package initialisation per start.
	Shim   string
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.CgroupParent == "" {
		c.CgroupParent = "/stormdock"
	}
	c.CgroupParent = path.Clean("/" + c.CgroupParent)
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/sys/fs/cgroup"
	}
	if c.StateDir == "" {
		c.StateDir = "/var/lib/stormdock/process"
	}
	if c.LogDir == "" {
		c.LogDir = filepath.Join(c.StateDir, "logs")
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 100 * time.Millisecond
	}
	if c.LogCheckInterval <= 0 {
		c.LogCheckInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Shim == "" {
		c.Shim = "/proc/self/exe"
		if exe, err := os.Executable(); err == nil {
			if p, ok := shim.Beside(exe); ok {
				c.Shim = p
			}
		}
	}
}

// Driver runs workers as cgroup-limited processes. It implements isolation.Driver.
type Driver struct {
	cfg Config
	h   hierarchy
	log *slog.Logger

	mu      sync.Mutex
	workers map[string]*worker
	closed  bool

	stop chan struct{}  // closed by Close: the housekeeper ends
	wg   sync.WaitGroup // the housekeeper

	// noCloneInto is set once the kernel refused clone3 with CLONE_INTO_CGROUP (before Linux
	// 5.7): shims are then moved into their cgroups after the fork.
	noCloneInto atomic.Bool
	// noSelfPlace is set once a shim did not place itself (v1): the driver moves shims then.
	noSelfPlace atomic.Bool
}

var _ isolation.Driver = (*Driver)(nil)

// worker is the driver's record of one worker. Fields other than done and once are guarded
// by Driver.mu.
type worker struct {
	st      state
	slot    slot      // nil once removed
	cmd     *exec.Cmd // nil for adopted workers: they are not our children
	adopted bool
	done    chan struct{} // closed once st.Exit is set and the cgroup is gone
	once    sync.Once
}

// New checks that the cgroup hierarchy is usable (it creates the parent cgroup) and returns a
// driver. Workers left by an earlier driver are taken over by Adopt.
func New(cfg Config) (*Driver, error) {
	cfg.defaults()
	for _, dir := range []string{cfg.StateDir, cfg.LogDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("process driver: %w", err)
		}
	}
	var h hierarchy
	var err error
	if cfg.Unconfined {
		h, err = newUnconfined(cfg.StateDir)
		cfg.Logger.Warn("workers run without cgroups: no memory, cpu or pids limits", "driver", "process")
	} else {
		h, err = detect(cfg.CgroupRoot)
	}
	if err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	if err := h.ensure(cfg.CgroupParent); err != nil {
		return nil, fmt.Errorf("process driver: %w", cgroupError(cfg.CgroupParent, err))
	}
	d := &Driver{
		cfg:     cfg,
		h:       h,
		log:     cfg.Logger.With("driver", "process"),
		workers: map[string]*worker{},
		stop:    make(chan struct{}),
	}
	d.wg.Add(1)
	go d.housekeep()
	d.log.Debug("ready", "cgroup_version", h.version(), "parent", cfg.CgroupParent, "state_dir", cfg.StateDir, "shim", cfg.Shim)
	return d, nil
}

// CgroupVersion is 1 or 2, as detected at start-up; 0 when unconfined.
func (d *Driver) CgroupVersion() int { return d.h.version() }

// CgroupPath is the cgroup (below the hierarchy root) a worker with this id runs in.
func (d *Driver) CgroupPath(id string) string { return path.Join(d.cfg.CgroupParent, id) }

// cgroupError turns a failure to create a cgroup into an error that says what to do.
func cgroupError(name string, err error) error {
	if errors.Is(err, isolation.ErrUnavailable) {
		return err // says what to do already
	}
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, unix.EROFS) {
		return fmt.Errorf("%w: cannot create cgroup %s (%v): run the agent as root, or set the cgroup parent to a cgroup delegated to uid %d",
			isolation.ErrUnavailable, name, err, os.Geteuid())
	}
	return fmt.Errorf("create cgroup %s: %w", name, err)
}

// Start implements isolation.Starter.
func (d *Driver) Start(ctx context.Context, spec isolation.Spec) (isolation.Worker, error) {
	if err := spec.Validate(); err != nil {
		return isolation.Worker{}, err
	}
	if spec.ImageCommand {
		return isolation.Worker{}, fmt.Errorf("%w: worker %s asks for its image's own command, and process workers have no image: give the program to run", isolation.ErrInvalidSpec, spec.ID)
	}
	if err := ctx.Err(); err != nil {
		return isolation.Worker{}, err
	}
	prog, err := resolve(spec)
	if err != nil {
		return isolation.Worker{}, err
	}
	w := &worker{done: make(chan struct{})}
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		return isolation.Worker{}, isolation.ErrClosed
	case d.workers[spec.ID] != nil:
		d.mu.Unlock()
		return isolation.Worker{}, fmt.Errorf("%w: %s", isolation.ErrExists, spec.ID)
	}
	d.workers[spec.ID] = w // reserve the id while starting
	d.mu.Unlock()

	st, sl, cmd, err := d.start(spec, prog)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		delete(d.workers, spec.ID)
		return isolation.Worker{}, err
	}
	w.st, w.slot, w.cmd = st, sl, cmd
	go d.reap(w)
	return w.view(), nil
}

// resolve finds the program the way a shell would, with the worker's PATH.
func resolve(spec isolation.Spec) (string, error) {
	name := spec.Command[0]
	if strings.Contains(name, "/") {
		return name, nil
	}
	p := spec.Env["PATH"]
	if p == "" {
		p = defaultPath
	}
	for _, dir := range filepath.SplitList(p) {
		c := filepath.Join(dir, name)
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: command %q of worker %s not found in PATH %s: give a full path", isolation.ErrInvalidSpec, name, spec.ID, p)
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// start does the work of Start for a reserved id; on error it leaves nothing behind.
func (d *Driver) start(spec isolation.Spec, prog string) (st state, sl slot, cmd *exec.Cmd, err error) {
	ph := newPhases()
	if _, err := os.Stat(statePath(d.cfg.StateDir, spec.ID)); err == nil {
		return st, nil, nil, fmt.Errorf("%w: %s has a state file from an earlier agent in %s: call Adopt before Start",
			isolation.ErrExists, spec.ID, d.cfg.StateDir)
	}
	cg := d.CgroupPath(spec.ID)
	if old, ok, err := d.h.load(cg); err != nil {
		return st, nil, nil, fmt.Errorf("inspect cgroup %s: %w", cg, err)
	} else if ok {
		// A cgroup without a state file: left by a crash between cleanup steps. If it still
		// runs something, that is a worker we know nothing about: refuse to duplicate it.
		if ps, _ := old.procs(); len(ps) > 0 {
			return st, nil, nil, fmt.Errorf("%w: cgroup %s already holds pids %v but has no state file: stop them or pick another id",
				isolation.ErrExists, cg, ps)
		}
		if err := old.remove(); err != nil {
			return st, nil, nil, fmt.Errorf("remove stale cgroup %s: %w", cg, err)
		}
	}
	logDir := spec.LogDir
	if logDir == "" {
		logDir = d.cfg.LogDir
	}
	if err := os.MkdirAll(logDir, 0o750); err != nil {
		return st, nil, nil, fmt.Errorf("log dir: %w", err)
	}
	st = state{Spec: spec, Cgroup: cg, LogPath: filepath.Join(logDir, spec.ID+".log")}
	if err := writeState(d.cfg.StateDir, st); err != nil {
		return st, nil, nil, err
	}
	ph.mark("state")
	defer func() {
		if err != nil {
			if sl != nil {
				_ = sl.killAll(context.Background())
				_ = sl.remove()
			}
			_ = removeState(d.cfg.StateDir, spec.ID)
		}
	}()
	sl, err = d.h.create(cg, limits{memory: spec.MemoryBytes, milliCPU: spec.MilliCPU, pids: spec.PidsLimit()})
	if err != nil {
		return st, nil, nil, cgroupError(cg, err)
	}
	ph.mark("cgroup")
	if err := rotatePrevious(st.LogPath); err != nil {
		d.log.Warn("keep the previous run's log", "id", spec.ID, "err", err)
	}
	out, err := openLog(st.LogPath, spec.User)
	if err != nil {
		return st, sl, nil, err
	}
	defer out.Close() // the worker has its own descriptor
	env := spec.Environ()
	if spec.Env["PATH"] == "" {
		env = append(env, "PATH="+defaultPath)
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	o := launchOpts{
		shim: d.cfg.Shim, path: prog, argv: spec.Command, env: env, dir: dir, out: out, user: spec.User, cgroupFD: -1,
		place: func(pid int) error {
			if err := sl.add(pid); err != nil {
				return fmt.Errorf("move pid %d into cgroup %s: %w", pid, cg, err)
			}
			return nil
		},
		phase: ph.mark,
	}
	if into, ok := sl.(cloneTarget); ok && !d.noCloneInto.Load() {
		var fd int
		if fd, err = into.openDir(); err != nil {
			return st, sl, nil, fmt.Errorf("open cgroup %s: %w", cg, err)
		}
		o.cgroupFD = fd
		cmd, err = launch(o)
		unix.Close(fd)
		if errors.Is(err, errCloneInto) {
			// Nothing ran. A kernel without CLONE_INTO_CGROUP says so once: move after fork
			// from now on. Any other refusal falls back for this start only.
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EINVAL) {
				d.noCloneInto.Store(true)
			}
			d.log.Info("clone into cgroup refused: moving the shim after the fork", "id", spec.ID, "err", err)
			o.cgroupFD = -1
			cmd, err = launch(o)
		}
	} else if sp, ok := sl.(selfPlaced); ok && d.selfPlacing() && !slices.ContainsFunc(sp.tasksFiles(), func(f string) bool {
		return strings.Contains(f, shim.PlaceSep)
	}) {
		o.selfPlace = sp.tasksFiles()
		cmd, err = launch(o)
		if errors.Is(err, errSelfPlace) {
			// Nothing of the worker ran. A shim that cannot place itself (one of another
			// version, a cgo build) will not later either: move shims from now on.
			d.noSelfPlace.Store(true)
			d.log.Info("the shim did not move itself into its cgroup: the driver moves shims from now on (a few ms more per start)",
				"id", spec.ID, "shim", d.cfg.Shim, "err", err)
			o.selfPlace = nil
			cmd, err = launch(o)
		}
	} else {
		cmd, err = launch(o)
	}
	if err != nil {
		if errors.Is(err, errExec) {
			return st, sl, nil, fmt.Errorf("%w: worker %s: %v", isolation.ErrInvalidSpec, spec.ID, err)
		}
		return st, sl, nil, fmt.Errorf("start worker %s: %w", spec.ID, err)
	}
	st.PID = cmd.Process.Pid
	st.Started = time.Now()
	if p, err := readProc(st.PID); err == nil {
		st.StartTicks = p.start
	}
	if err = writeState(d.cfg.StateDir, st); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return st, sl, nil, err
	}
	ph.mark("record")
	d.log.Info("worker started", "id", spec.ID, "pid", st.PID, "cgroup", cg)
	d.log.Debug("start phases", append([]any{"id", spec.ID, "clone_into_cgroup", o.cgroupFD >= 0, "self_placed", o.selfPlace != nil}, ph.steps...)...)
	return st, sl, cmd, nil
}

// selfPlacing reports whether shims move themselves into their cgroups (v1): stormdock-shim
// does, unless one did not before. A stormdock binary as the shim (none installed beside it)
// is moved by the driver and runs the lease launcher in place: placing itself, it would have
// to exec itself afresh for the launcher (see package shim), and its start costs several
// times stormdock-shim's.
func (d *Driver) selfPlacing() bool {
	return filepath.Base(d.cfg.Shim) == shim.Name && !d.noSelfPlace.Load()
}

// reap waits for a child worker to exit. After Close it only reaps: the worker belongs to the
// next driver then, which sees the exit by polling.
func (d *Driver) reap(w *worker) {
	err := w.cmd.Wait()
	select {
	case <-d.stop:
		return
	default:
	}
	ex := isolation.Exit{At: time.Now(), Code: isolation.ExitUnknown}
	if ps := w.cmd.ProcessState; ps != nil {
		ws := ps.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			ex.Signal = ws.Signal()
			ex.Code = 128 + int(ex.Signal)
		case ws.Exited():
			ex.Code = ws.ExitStatus()
		}
	} else if err != nil {
		d.log.Warn("wait for worker", "id", w.st.Spec.ID, "err", err)
	}
	d.finish(w, ex)
}

// finish records an exit: it kills what is left of the worker (children outlive their parent),
// reads the OOM counter while the cgroup still exists, removes the cgroup and writes the exit
// into the state file, where Stop or a later Adopt finds it.
func (d *Driver) finish(w *worker, ex isolation.Exit) {
	w.once.Do(func() {
		d.mu.Lock()
		sl, id := w.slot, w.st.Spec.ID
		d.mu.Unlock()
		if sl != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := sl.killAll(ctx); err != nil {
				d.log.Warn("kill leftover processes", "id", id, "err", err)
			}
			cancel()
			if n, err := sl.oomKills(); err != nil {
				d.log.Warn("read oom counter", "id", id, "err", err)
			} else if n > 0 {
				ex.OOMKilled = true
			}
			if err := sl.remove(); err != nil {
				d.log.Warn("remove cgroup", "id", id, "err", err)
			}
		}
		d.mu.Lock()
		w.slot = nil
		w.st.Exit = &ex
		st := w.st
		d.mu.Unlock()
		if err := writeState(d.cfg.StateDir, st); err != nil {
			d.log.Warn("record exit", "id", id, "err", err)
		}
		d.log.Info("worker ended", "id", id, "exit", ex.String())
		close(w.done)
	})
}

// housekeep polls adopted workers for exit and keeps logs under their caps.
func (d *Driver) housekeep() {
	defer d.wg.Done()
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	logs := time.NewTicker(d.cfg.LogCheckInterval)
	defer logs.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-poll.C:
			for _, w := range d.running(true) {
				d.mu.Lock()
				pid, ticks := w.st.PID, w.st.StartTicks
				d.mu.Unlock()
				if ok, err := alive(pid, ticks); err == nil && !ok {
					d.finish(w, isolation.Exit{Code: isolation.ExitUnknown, At: time.Now()})
				}
			}
		case <-logs.C:
			for _, w := range d.running(false) {
				d.mu.Lock()
				p, max := w.st.LogPath, w.st.Spec.LogLimit()
				pz, _ := w.slot.(pauser)
				d.mu.Unlock()
				if err := capLog(p, max, pz); err != nil {
					d.log.Warn("cap log", "path", p, "err", err)
				}
			}
		}
	}
}

// running lists running workers (only adopted ones if adoptedOnly).
func (d *Driver) running(adoptedOnly bool) []*worker {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*worker
	for _, w := range d.workers {
		if w.st.PID != 0 && w.st.Exit == nil && (w.adopted || !adoptedOnly) {
			out = append(out, w)
		}
	}
	return out
}

func (d *Driver) get(id string) (*worker, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, isolation.ErrClosed
	}
	w := d.workers[id]
	if w == nil || w.st.PID == 0 {
		return nil, fmt.Errorf("%w: %s", isolation.ErrNotFound, id)
	}
	return w, nil
}

// signal sends sig to the worker's main process. For an adopted worker the pid is checked
// against the recorded start time through a pidfd, so a reused pid is never signalled.
func (d *Driver) signal(w *worker, sig syscall.Signal) error {
	d.mu.Lock()
	cmd, pid, ticks := w.cmd, w.st.PID, w.st.StartTicks
	d.mu.Unlock()
	if cmd != nil {
		err := cmd.Process.Signal(sig)
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if ok, err := alive(pid, ticks); err != nil || !ok {
		return err
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", pid, err)
	}
	return nil
}

// Stop implements isolation.Stopper: SIGTERM to the main process, grace, then SIGKILL to every
// process in the cgroup (frozen first), then the cgroup and state file are removed.
func (d *Driver) Stop(ctx context.Context, id string, grace time.Duration) (isolation.Exit, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Exit{}, err
	}
	select {
	case <-w.done:
	default:
		// With no grace at all there is nothing to drain: go straight to the kill, so the exit
		// reads SIGKILL, not a SIGTERM that raced it.
		if grace > 0 {
			if err := d.signal(w, syscall.SIGTERM); err != nil {
				d.log.Warn("sigterm", "id", id, "err", err)
			}
		}
		t := time.NewTimer(grace)
		select {
		case <-w.done:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return isolation.Exit{}, fmt.Errorf("stop %s: %w", id, ctx.Err())
		case <-t.C:
			d.log.Info("grace period over, killing", "id", id, "grace", grace)
			d.mu.Lock()
			sl := w.slot
			d.mu.Unlock()
			if sl != nil {
				if err := sl.killAll(ctx); err != nil {
					return isolation.Exit{}, fmt.Errorf("kill %s: %w", id, err)
				}
			}
			// An adopted worker's exit is seen by the poller; don't wait for its next tick.
			if w.cmd == nil {
				d.finish(w, isolation.Exit{Code: 128 + int(syscall.SIGKILL), Signal: syscall.SIGKILL, At: time.Now()})
			}
		}
		select {
		case <-w.done:
		case <-ctx.Done():
			return isolation.Exit{}, fmt.Errorf("stop %s: %w", id, ctx.Err())
		}
	}
	d.mu.Lock()
	ex := *w.st.Exit
	delete(d.workers, id)
	d.mu.Unlock()
	if err := removeState(d.cfg.StateDir, id); err != nil {
		return ex, fmt.Errorf("remove state of %s: %w", id, err)
	}
	return ex, nil
}

// Signal implements isolation.Signaler: sig goes to the worker's main process (for an
// adopted worker, checked against its start time so that a reused pid is never signalled).
func (d *Driver) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	w, err := d.get(id)
	if err != nil {
		return err
	}
	select {
	case <-w.done:
		return nil
	default:
	}
	if err := d.signal(w, sig); err != nil {
		return fmt.Errorf("signal %s: %w", id, err)
	}
	return nil
}

// Wait implements isolation.Waiter.
func (d *Driver) Wait(ctx context.Context, id string) (isolation.Exit, error) {
	w, err := d.get(id)
	if err != nil {
		return isolation.Exit{}, err
	}
	select {
	case <-w.done:
		d.mu.Lock()
		defer d.mu.Unlock()
		return *w.st.Exit, nil
	case <-ctx.Done():
		return isolation.Exit{}, ctx.Err()
	}
}

// Adopt implements isolation.Lister. Running workers are watched by polling their pid (they
// are not children of this process, so their exit status is not observable: it reads as
// isolation.ExitUnknown, with OOM kills still detected from the cgroup). Workers that ended
// while no driver watched are cleaned up and reported ended.
func (d *Driver) Adopt(ctx context.Context) ([]isolation.Worker, error) {
	sts, err := readStates(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	var out []isolation.Worker
	for _, st := range sts {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		d.mu.Lock()
		closed, known := d.closed, d.workers[st.Spec.ID] != nil
		d.mu.Unlock()
		if closed {
			return out, isolation.ErrClosed
		}
		if known {
			continue
		}
		w, err := d.adopt(ctx, st)
		if err != nil {
			return out, fmt.Errorf("adopt %s: %w", st.Spec.ID, err)
		}
		if w != nil {
			out = append(out, w.view())
		}
	}
	return out, nil
}

func (d *Driver) adopt(ctx context.Context, st state) (*worker, error) {
	sl, ok, err := d.h.load(st.Cgroup)
	if err != nil {
		return nil, err
	}
	if !ok {
		sl = nil
	}
	if st.PID == 0 {
		// The earlier driver died while starting this worker: nothing of it ever ran
		// outside the shim. Clean up and forget it.
		if sl != nil {
			if err := sl.killAll(ctx); err != nil {
				return nil, err
			}
			if err := sl.remove(); err != nil {
				return nil, err
			}
		}
		return nil, removeState(d.cfg.StateDir, st.Spec.ID)
	}
	w := &worker{st: st, slot: sl, adopted: true, done: make(chan struct{})}
	d.mu.Lock()
	d.workers[st.Spec.ID] = w
	d.mu.Unlock()
	if st.Exit != nil {
		w.once.Do(func() { close(w.done) })
		return w, nil
	}
	live, err := alive(st.PID, st.StartTicks)
	if err != nil {
		return nil, err
	}
	if !live {
		d.finish(w, isolation.Exit{Code: isolation.ExitUnknown, At: time.Now()})
	} else {
		d.log.Info("worker adopted", "id", st.Spec.ID, "pid", st.PID)
	}
	return w, nil
}

// List implements isolation.Lister.
func (d *Driver) List(ctx context.Context) ([]isolation.Worker, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]isolation.Worker, 0, len(d.workers))
	for _, w := range d.workers {
		if w.st.PID != 0 {
			out = append(out, w.view())
		}
	}
	slices.SortFunc(out, func(a, b isolation.Worker) int { return strings.Compare(a.Spec.ID, b.Spec.ID) })
	return out, nil
}

// view is the public snapshot of w; d.mu must be held.
func (w *worker) view() isolation.Worker {
	v := isolation.Worker{Spec: w.st.Spec, PID: w.st.PID, Started: w.st.Started, Adopted: w.adopted, LogPath: w.st.LogPath}
	if w.st.Exit != nil {
		ex := *w.st.Exit
		v.Exit = &ex
	}
	return v
}

// slotOf returns the cgroup of a running worker.
func (d *Driver) slotOf(id string) (slot, error) {
	w, err := d.get(id)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.slot == nil {
		return nil, fmt.Errorf("%w: %s has ended", isolation.ErrNotFound, id)
	}
	return w.slot, nil
}

// Usage implements isolation.Meter.
func (d *Driver) Usage(ctx context.Context, id string) (isolation.Usage, error) {
	sl, err := d.slotOf(id)
	if err != nil {
		return isolation.Usage{}, err
	}
	u, err := sl.usage()
	if err != nil {
		return u, fmt.Errorf("usage of %s: %w", id, err)
	}
	return u, nil
}

// Limits implements isolation.Meter: the values are read back from the cgroup's files.
func (d *Driver) Limits(ctx context.Context, id string) (isolation.Limits, error) {
	sl, err := d.slotOf(id)
	if err != nil {
		return isolation.Limits{}, err
	}
	l, err := sl.limits()
	if err != nil {
		return l, fmt.Errorf("limits of %s: %w", id, err)
	}
	return l, nil
}

// Processes lists the host pids in a running worker's cgroup.
func (d *Driver) Processes(ctx context.Context, id string) ([]int, error) {
	sl, err := d.slotOf(id)
	if err != nil {
		return nil, err
	}
	return sl.procs()
}

// Close implements isolation.Driver. Workers keep running. Children of this process are still
// reaped in the background when they exit (the kernel requires their parent to), but their
// exit is left for the next driver to find.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.stop)
	d.mu.Unlock()
	d.wg.Wait()
	return nil
}

// RemoveParent deletes the (empty) parent cgroup, for tests and for uninstalling.
func (d *Driver) RemoveParent() error { return d.h.removeParent(d.cfg.CgroupParent) }
