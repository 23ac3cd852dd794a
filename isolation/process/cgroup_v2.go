package process

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/isolation"
)

// v2 is the unified hierarchy mounted at root.
//
// It runs on this project's CI in the cgroup v2 virtual machine of scripts/vmtest.
type v2 struct {
	root string
}

func newV2(root string) *v2 { return &v2{root: root} }

func (h *v2) version() int { return 2 }

// v2Controllers are what a worker's cgroup limits with; its parent must enable them for
// its children (cgroup.subtree_control), and so must every cgroup above, up to the root.
var v2Controllers = []string{"cpu", "memory", "pids"}

// ensure creates parent and enables the controllers from the root down to it, writing only
// where they are not enabled yet. On a systemd host the levels above a delegated subtree
// (Delegate=yes) already enable them and belong to root: an agent given a cgroup parent
// inside its subtree reads them and writes nothing outside it, as systemd asks of delegates.
// (The library's NewManager writes cgroup.subtree_control at every level, the root's too.)
func (h *v2) ensure(parent string) error {
	dir := h.root
	if err := h.enable(dir); err != nil {
		return err
	}
	for _, part := range strings.Split(strings.Trim(path.Clean("/"+parent), "/"), "/") {
		if part == "" {
			continue
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return h.denied(dir, err)
		}
		if err := h.enable(dir); err != nil {
			return err
		}
	}
	return nil
}

// rel is dir as a cgroup path, as the flags and errors name cgroups.
func (h *v2) rel(dir string) string {
	r, err := filepath.Rel(h.root, dir)
	if err != nil || r == "." {
		return "/"
	}
	return "/" + r
}

// denied explains a refused mkdir below dir's parent.
func (h *v2) denied(dir string, err error) error {
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("%w: cannot create cgroup %s (%v): run the agent as root, or set the cgroup parent to a cgroup delegated to uid %d (systemd: Delegate=yes on the agent's unit, the cgroup parent inside the unit's cgroup)",
			isolation.ErrUnavailable, h.rel(dir), err, os.Geteuid())
	}
	return fmt.Errorf("create cgroup %s: %w", h.rel(dir), err)
}

// enable makes dir give the worker controllers to its children.
func (h *v2) enable(dir string) error {
	have, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", h.rel(dir), err)
	}
	var missing []string
	for _, c := range v2Controllers {
		if !slices.Contains(strings.Fields(string(have)), c) {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", h.rel(dir), err)
	}
	for _, c := range missing {
		if !slices.Contains(strings.Fields(string(avail)), c) {
			above := h.rel(filepath.Dir(dir))
			return fmt.Errorf("%w: the %s controller is not available in cgroup %s (its cgroup.controllers: %q): enable it in the cgroup above as root (echo +%s > %s), or with systemd delegate it (Delegate=yes)",
				isolation.ErrUnavailable, c, h.rel(dir), strings.TrimSpace(string(avail)), c, filepath.Join(h.root, above, "cgroup.subtree_control"))
		}
	}
	req := "+" + strings.Join(missing, " +")
	err = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(req), 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EBUSY):
		// The "no internal processes" rule: only the root may hold processes and enable
		// controllers for children at once.
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		return fmt.Errorf("%w: cgroup %s holds processes (pids %s) and cgroup v2 lets a cgroup enable controllers for its children only while it holds none: run the agent in a leaf cgroup of its own (systemd: DelegateSubgroup=agent; else mkdir %s and echo the agent's pid > %s) and set the cgroup parent below %s but outside that leaf, e.g. %s",
			isolation.ErrUnavailable, h.rel(dir), strings.Join(strings.Fields(string(procs)), ","),
			filepath.Join(dir, "agent"), filepath.Join(dir, "agent", "cgroup.procs"), h.rel(dir), path.Join(h.rel(dir), "workers"))
	case errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%w: cannot enable %s for the children of cgroup %s (%v): enable it there as root (echo %q > %s), or set the cgroup parent to a cgroup delegated to uid %d (systemd: Delegate=yes)",
			isolation.ErrUnavailable, strings.Join(missing, " and "), h.rel(dir), err, req, filepath.Join(dir, "cgroup.subtree_control"), os.Geteuid())
	default:
		return fmt.Errorf("enable %s for the children of cgroup %s: %w", req, h.rel(dir), err)
	}
}

func (h *v2) removeParent(parent string) error {
	m, err := cgroup2.Load(parent, cgroup2.WithMountpoint(h.root))
	if err != nil {
		return err
	}
	return m.Delete()
}

// create makes the worker's cgroup with a mkdir and writes of its limit files. The parent and
// its controllers are set up by New (ensure); they are set up again only when the mkdir or a
// limit file says they went (RemoveParent, an operator).
func (h *v2) create(name string, l limits) (_ slot, err error) {
	dir := filepath.Join(h.root, name)
	err = os.Mkdir(dir, 0o755)
	if errors.Is(err, fs.ErrNotExist) {
		if err := h.ensure(path.Dir(name)); err != nil {
			return nil, err
		}
		err = os.Mkdir(dir, 0o755)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, h.denied(dir, err)
	}
	m, err := cgroup2.Load(name, cgroup2.WithMountpoint(h.root))
	if err != nil {
		_ = os.Remove(dir)
		return nil, err
	}
	s := &v2slot{h: h, name: name, m: m}
	err = s.setLimits(l)
	if errors.Is(err, fs.ErrNotExist) {
		// A controller's files are missing: the parent stopped giving it. Give it again.
		if err = h.ensure(path.Dir(name)); err == nil {
			err = s.setLimits(l)
		}
	}
	if err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("set limits of cgroup %s: %w", name, err)
	}
	return s, nil
}

// setLimits writes the limit files: memory.max, no swap (memory.swap.max, separate from
// memory.max on v2, absent when swap accounting is off, and then there is no swap to
// forbid), cpu.max, cpu.weight and pids.max.
func (s *v2slot) setLimits(l limits) error {
	// cpu.weight from the v1 shares, with the conversion runc and systemd use.
	weight := 1 + ((sharesFor(l.milliCPU)-2)*9999)/262142
	for _, w := range []struct{ file, value string }{
		{"memory.max", strconv.FormatInt(l.memory, 10)},
		{"memory.swap.max", "0"},
		{"cpu.max", strconv.FormatInt(l.cpuQuota(), 10) + " " + strconv.FormatInt(cpuPeriod.Microseconds(), 10)},
		{"cpu.weight", strconv.FormatUint(weight, 10)},
		{"pids.max", strconv.FormatInt(l.pids, 10)},
	} {
		err := os.WriteFile(s.file(w.file), []byte(w.value), 0)
		if w.file == "memory.swap.max" && errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(s.file("memory.max")); serr == nil {
				continue // no swap accounting
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", w.file, err)
		}
	}
	return nil
}

func (h *v2) load(name string) (slot, bool, error) {
	if _, err := os.Stat(filepath.Join(h.root, name)); errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	m, err := cgroup2.Load(name, cgroup2.WithMountpoint(h.root))
	if err != nil {
		return nil, false, err
	}
	return &v2slot{h: h, name: name, m: m}, true, nil
}

type v2slot struct {
	h    *v2
	name string
	m    *cgroup2.Manager
}

func (s *v2slot) file(f string) string { return filepath.Join(s.h.root, s.name, f) }

func (s *v2slot) openDir() (int, error) {
	return unix.Open(filepath.Join(s.h.root, s.name), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

func (s *v2slot) add(pid int) error {
	err := s.m.AddProc(uint64(pid))
	if errors.Is(err, fs.ErrPermission) {
		// Writing cgroup.procs needs write access to the common ancestor of the source and
		// destination cgroups too: an agent outside its delegated subtree cannot move in.
		return fmt.Errorf("%w: %v: cgroup v2 lets uid %d move a process only within a subtree it may write, so the agent itself must run inside the cgroup delegated to it (systemd: Delegate=yes, DelegateSubgroup=agent)",
			isolation.ErrUnavailable, err, os.Geteuid())
	}
	return err
}

// gone reports an error that means the cgroup was removed: its directory is gone (ENOENT),
// or it went while one of its files was open (ENODEV). A finishing worker's reaper removes
// the cgroup while Stop may still be reading it.
func gone(err error) bool { return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) }

func (s *v2slot) procs() ([]int, error) {
	ps, err := s.m.Procs(true)
	if err != nil {
		if gone(err) {
			return nil, nil // removed: nothing can run in it any more
		}
		return nil, err
	}
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = int(p)
	}
	return out, nil
}

func (s *v2slot) killAll(ctx context.Context) error {
	// cgroup.kill (kernel 5.14+) kills the whole tree at once, forks racing it included.
	err := os.WriteFile(s.file("cgroup.kill"), []byte("1"), 0)
	switch {
	case err == nil:
	case errors.Is(err, syscall.ENODEV):
		return nil // removed meanwhile: nothing left to kill
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(filepath.Join(s.h.root, s.name)); errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
		// An older kernel: the library freezes, kills and thaws.
		if err := s.m.Kill(); err != nil && !gone(err) {
			return fmt.Errorf("kill cgroup %s: %w", s.name, err)
		}
	default:
		return fmt.Errorf("kill cgroup %s: %w", s.name, err)
	}
	return waitEmpty(ctx, s)
}

func (s *v2slot) pause(ctx context.Context) error {
	if err := os.WriteFile(s.file("cgroup.freeze"), []byte("1"), 0); err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", s.name, err)
	}
	// Freezing is asynchronous: cgroup.events says "frozen 1" once every process stopped.
	for {
		n, err := readKey(s.file("cgroup.events"), "frozen")
		if err == nil && n == 1 {
			return nil
		}
		if err == nil {
			if err = ctxtime.Sleep(ctx, time.Millisecond); err == nil {
				continue
			}
		}
		_ = s.resume()
		return fmt.Errorf("freeze cgroup %s: %w", s.name, err)
	}
}

func (s *v2slot) resume() error { return os.WriteFile(s.file("cgroup.freeze"), []byte("0"), 0) }

func (s *v2slot) oomKills() (uint64, error) {
	// oom_kill, not oom: oom counts limit hits that reclaim may have resolved.
	return readKey(s.file("memory.events"), "oom_kill")
}

// usage reads the three files it needs rather than the library's Stat, which reads every
// controller's files (io.stat, hugetlb, rdma and more): agents sample every worker often.
func (s *v2slot) usage() (isolation.Usage, error) {
	u := isolation.Usage{At: time.Now()}
	used, err := readInt(s.file("memory.current"))
	if err != nil {
		return u, err
	}
	// Page cache the kernel drops first is not the worker's working set (docker stats).
	if inactive, err := readKey(s.file("memory.stat"), "inactive_file"); err == nil && used > int64(inactive) {
		u.MemoryBytes = uint64(used) - inactive
	} else if err != nil && used > 0 {
		u.MemoryBytes = uint64(used)
	}
	if usec, err := readKey(s.file("cpu.stat"), "usage_usec"); err == nil {
		u.CPU = time.Duration(usec) * time.Microsecond
	}
	return u, nil
}

func (s *v2slot) limits() (isolation.Limits, error) {
	var l isolation.Limits
	var err error
	if l.MemoryBytes, err = readInt(s.file("memory.max")); err != nil {
		return l, err
	}
	l.MemorySwapBytes = -1
	if sw, err := readInt(s.file("memory.swap.max")); err == nil && sw >= 0 && l.MemoryBytes >= 0 {
		l.MemorySwapBytes = l.MemoryBytes + sw
	}
	b, err := os.ReadFile(s.file("cpu.max"))
	if err != nil {
		return l, err
	}
	var q, p int64
	f := strings.Fields(string(b))
	if len(f) == 2 && f[0] != "max" {
		if _, err := fmt.Sscan(f[0]+" "+f[1], &q, &p); err != nil {
			return l, fmt.Errorf("parse cpu.max %q: %w", b, err)
		}
	}
	l.CPUQuota, l.CPUPeriod = time.Duration(q)*time.Microsecond, time.Duration(p)*time.Microsecond
	if l.Pids, err = readInt(s.file("pids.max")); err != nil {
		return l, err
	}
	return l, nil
}

func (s *v2slot) remove() error { return s.m.Delete() }
