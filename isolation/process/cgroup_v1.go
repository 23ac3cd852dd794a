package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/isolation"
)

// v1 is the legacy hierarchy: one mount per controller.
type v1 struct {
	dirs map[cgroup1.Name]string // controller -> mount root
	swap bool                    // memory.memsw.* exist (swap accounting on)
	// worker are the mount roots a worker's cgroup is made in, each once (co-mounted
	// controllers share one): those whose controllers the driver uses, and the named systemd
	// hierarchy, so that a legacy systemd host sees workers outside the agent's unit. Each
	// costs a mkdir, a move of the shim and an rmdir; the others (cpuset, devices, blkio,
	// ...) limit nothing the driver sets, and a worker stays where the agent is in them.
	worker []string
}

// workerControllers are the v1 hierarchies a worker's cgroup is made in (see v1.worker).
var workerControllers = []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Pids, cgroup1.Freezer, cgroup1.SystemdDbus}

// allowMissing lets cgroup1.Load skip controllers that are not mounted. The library's default
// check insists on the devices controller, which some hosts (and all user namespaces) lack;
// the controllers this driver needs are checked in newV1 instead.
func allowMissing(c *cgroup1.InitConfig) error {
	c.InitCheck = cgroup1.AllowAny
	return nil
}

func newV1() (*v1, error) {
	subs, err := cgroup1.Default()
	if err != nil {
		return nil, fmt.Errorf("%w: list cgroup v1 controllers: %v", isolation.ErrUnavailable, err)
	}
	h := &v1{dirs: map[cgroup1.Name]string{}}
	for _, s := range subs {
		p, ok := s.(interface{ Path(string) string })
		if !ok {
			continue
		}
		dir := p.Path("/")
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			h.dirs[s.Name()] = dir
		}
	}
	for _, need := range []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Pids} {
		if _, ok := h.dirs[need]; !ok {
			return nil, fmt.Errorf("%w: cgroup v1 controller %q is not mounted under /sys/fs/cgroup: mount it (mount -t cgroup -o %s cgroup /sys/fs/cgroup/%s)",
				isolation.ErrUnavailable, need, need, need)
		}
	}
	var seen []string // real paths: co-mounted controllers are one hierarchy (cpu,cpuacct)
	for _, c := range workerControllers {
		dir, ok := h.dirs[c]
		if !ok {
			continue
		}
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			real = dir
		}
		if !slices.Contains(seen, real) {
			seen = append(seen, real)
			h.worker = append(h.worker, dir)
		}
	}
	_, err = os.Stat(filepath.Join(h.dirs[cgroup1.Memory], "memory.memsw.limit_in_bytes"))
	h.swap = err == nil
	return h, nil
}

func (h *v1) version() int { return 1 }

// ensure makes the parent in every hierarchy a worker's cgroup is made in.
func (h *v1) ensure(parent string) error {
	for _, root := range h.worker {
		if err := os.MkdirAll(filepath.Join(root, parent), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (h *v1) removeParent(parent string) error {
	cg, err := cgroup1.Load(cgroup1.StaticPath(parent), allowMissing)
	if err != nil {
		return err
	}
	return cg.Delete()
}

// create makes the cgroup with plain mkdirs and writes of the limit files: the library's
// New reads the mount table and walks every hierarchy (cpuset's parents included) each time,
// several times the kernel's own cost.
func (h *v1) create(name string, l limits) (_ slot, err error) {
	s := &v1slot{h: h, name: name}
	defer func() {
		if err != nil {
			_ = s.remove()
		}
	}()
	for _, root := range h.worker {
		dir := filepath.Join(root, name)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, fs.ErrNotExist) {
			// The parent went (RemoveParent, an operator): make it again.
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	}
	writes := []struct {
		c     cgroup1.Name
		file  string
		value int64
	}{
		// The memory limit first: memsw (memory plus swap) may not be below it, and equal
		// to it means no swap at all.
		{cgroup1.Memory, "memory.limit_in_bytes", l.memory},
		{cgroup1.Memory, "memory.memsw.limit_in_bytes", l.memory},
		{cgroup1.Cpu, "cpu.cfs_period_us", cpuPeriod.Microseconds()},
		{cgroup1.Cpu, "cpu.cfs_quota_us", l.cpuQuota()},
		{cgroup1.Cpu, "cpu.shares", int64(sharesFor(l.milliCPU))},
		{cgroup1.Pids, "pids.max", l.pids},
	}
	for _, w := range writes {
		if w.file == "memory.memsw.limit_in_bytes" && !h.swap {
			continue
		}
		if err := os.WriteFile(s.file(w.c, w.file), []byte(strconv.FormatInt(w.value, 10)), 0); err != nil {
			return nil, fmt.Errorf("set %s: %w", w.file, err)
		}
	}
	return s, nil
}

func (h *v1) load(name string) (slot, bool, error) {
	if _, err := os.Stat(filepath.Join(h.dirs[cgroup1.Memory], name)); errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, err
	}
	return &v1slot{h: h, name: name}, true, nil
}

type v1slot struct {
	h    *v1
	name string
}

func (s *v1slot) file(c cgroup1.Name, f string) string { return filepath.Join(s.h.dirs[c], s.name, f) }

func (s *v1slot) tasksFiles() []string {
	out := make([]string, len(s.h.worker))
	for i, root := range s.h.worker {
		out[i] = filepath.Join(root, s.name, "tasks")
	}
	return out
}

// add moves the process into the cgroup in every hierarchy: one write of cgroup.procs each,
// which the kernel does under its cgroup lock (see cloneTarget for what that costs).
func (s *v1slot) add(pid int) error {
	b := []byte(strconv.Itoa(pid))
	for _, root := range s.h.worker {
		if err := os.WriteFile(filepath.Join(root, s.name, "cgroup.procs"), b, 0); err != nil {
			return err
		}
	}
	return nil
}

func (s *v1slot) procs() ([]int, error) {
	// Every worker hierarchy holds the same processes once add has run; ask the pids
	// controller's, which a worker never lacks, with any cgroups made below it.
	out, err := procsBelow(filepath.Join(s.h.dirs[cgroup1.Pids], s.name))
	if gone(err) {
		return nil, nil // removed by a concurrent finish: nothing can run in it any more
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// procsBelow lists the processes of the cgroup directory dir and of the cgroups below it.
func procsBelow(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.IsDir() {
			sub, err := procsBelow(filepath.Join(dir, e.Name()))
			if err != nil && !gone(err) {
				return nil, err
			}
			out = append(out, sub...)
		}
	}
	return out, nil
}

// freeze sets the cgroup's freezer state and waits until the kernel reports it: freezing
// takes effect asynchronously (FREEZING until every task stopped).
func (s *v1slot) freeze(state string) error {
	return s.freezeCtx(context.Background(), state)
}

func (s *v1slot) freezeCtx(ctx context.Context, state string) error {
	f := s.file(cgroup1.Freezer, "freezer.state")
	for {
		if err := os.WriteFile(f, []byte(state), 0); err != nil {
			return err
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == state {
			return nil
		}
		if err := ctxtime.Sleep(ctx, time.Millisecond); err != nil {
			return err
		}
	}
}

func (s *v1slot) pause(ctx context.Context) error {
	if _, ok := s.h.dirs[cgroup1.Freezer]; !ok {
		return errors.New("no freezer hierarchy")
	}
	if err := s.freezeCtx(ctx, "FROZEN"); err != nil {
		_ = s.freeze("THAWED")
		return fmt.Errorf("freeze cgroup %s: %w", s.name, err)
	}
	return nil
}

func (s *v1slot) resume() error { return s.freeze("THAWED") }

func (s *v1slot) killAll(ctx context.Context) error {
	_, hasFreezer := s.h.dirs[cgroup1.Freezer]
	for {
		ps, err := s.procs()
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			return nil
		}
		// Frozen, no process can fork a new one between reading the list and the kills; the
		// kills are delivered when the cgroup thaws.
		frozen := false
		if hasFreezer {
			err := s.freeze("FROZEN")
			if gone(err) {
				return nil // removed meanwhile (a finishing worker's reaper): nothing left to kill
			}
			frozen = err == nil
		}
		if frozen {
			ps, err = s.procs()
			if err != nil {
				_ = s.freeze("THAWED")
				return err
			}
		}
		for _, p := range ps {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if frozen {
			if err := s.freeze("THAWED"); err != nil && !gone(err) {
				return fmt.Errorf("thaw %s: %w", s.name, err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err = waitEmpty(wctx, s)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		// Without a freezer a fork between list and kill escapes one round: go again.
	}
}

func (s *v1slot) oomKills() (uint64, error) {
	// Read the file rather than Stat: kernels before 4.13 have no oom_kill line, and a
	// missing line must read as an error, not as "no OOM".
	return readKey(s.file(cgroup1.Memory, "memory.oom_control"), "oom_kill")
}

// usage reads the three files it needs rather than the library's full Stat, which reads
// every controller's statistics (blkio's among them): agents sample every worker often.
func (s *v1slot) usage() (isolation.Usage, error) {
	u := isolation.Usage{At: time.Now()}
	used, err := readInt(s.file(cgroup1.Memory, "memory.usage_in_bytes"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return u, cgroup1.ErrCgroupDeleted
		}
		return u, err
	}
	var inactive int64
	if b, err := os.ReadFile(s.file(cgroup1.Memory, "memory.stat")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "total_inactive_file "); ok {
				inactive, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				break
			}
		}
	}
	if used > inactive {
		u.MemoryBytes = uint64(used - inactive)
	}
	if _, ok := s.h.dirs[cgroup1.Cpuacct]; ok {
		if ns, err := readInt(s.file(cgroup1.Cpuacct, "cpuacct.usage")); err == nil {
			u.CPU = time.Duration(ns)
		}
	}
	return u, nil
}

func (s *v1slot) limits() (isolation.Limits, error) {
	var l isolation.Limits
	var err error
	if l.MemoryBytes, err = readInt(s.file(cgroup1.Memory, "memory.limit_in_bytes")); err != nil {
		return l, err
	}
	l.MemorySwapBytes = -1
	if s.h.swap {
		if l.MemorySwapBytes, err = readInt(s.file(cgroup1.Memory, "memory.memsw.limit_in_bytes")); err != nil {
			return l, err
		}
	}
	q, err := readInt(s.file(cgroup1.Cpu, "cpu.cfs_quota_us"))
	if err != nil {
		return l, err
	}
	p, err := readInt(s.file(cgroup1.Cpu, "cpu.cfs_period_us"))
	if err != nil {
		return l, err
	}
	l.CPUQuota, l.CPUPeriod = time.Duration(q)*time.Microsecond, time.Duration(p)*time.Microsecond
	if l.Pids, err = readInt(s.file(cgroup1.Pids, "pids.max")); err != nil {
		return l, err
	}
	return l, nil
}

// remove deletes the cgroup from every hierarchy. A killed process leaves its cgroups a
// moment after its exit is seen: a busy cgroup is tried again for a while (as the library
// did), a missing one is already gone.
func (s *v1slot) remove() error {
	var errs []error
	for _, root := range s.h.worker {
		dir := filepath.Join(root, s.name)
		delay := 10 * time.Millisecond
		for i := 0; ; i++ {
			err := removeTree(dir)
			if err == nil || gone(err) {
				break
			}
			if i == 4 {
				errs = append(errs, err)
				break
			}
			time.Sleep(delay)
			delay *= 2
		}
	}
	return errors.Join(errs...)
}

// removeTree removes a cgroup directory and any cgroups below it, deepest first (a cgroup
// directory's files go with it: rmdir, not unlink).
func removeTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil && !gone(err) {
				return err
			}
		}
	}
	return unix.Rmdir(dir)
}
