package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/isolation"
)

// v1 is the legacy hierarchy: one mount per controller.
type v1 struct {
	dirs map[cgroup1.Name]string // controller -> mount root
	swap bool                    // memory.memsw.* exist (swap accounting on)
}

// allowMissing lets cgroup1.New skip controllers that are not mounted. The library's default
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
	_, err = os.Stat(filepath.Join(h.dirs[cgroup1.Memory], "memory.memsw.limit_in_bytes"))
	h.swap = err == nil
	return h, nil
}

func (h *v1) version() int { return 1 }

func (h *v1) ensure(parent string) error {
	_, err := cgroup1.New(cgroup1.StaticPath(parent), &specs.LinuxResources{}, allowMissing)
	return err
}

func (h *v1) removeParent(parent string) error {
	cg, err := cgroup1.Load(cgroup1.StaticPath(parent), allowMissing)
	if err != nil {
		return err
	}
	return cg.Delete()
}

func (h *v1) create(name string, l limits) (slot, error) {
	mem, quota, period, shares, pids := l.memory, l.cpuQuota(), uint64(cpuPeriod.Microseconds()), sharesFor(l.milliCPU), l.pids
	res := &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period, Shares: &shares},
		Pids:   &specs.LinuxPids{Limit: &pids},
	}
	if h.swap {
		// memsw counts memory plus swap: equal to the memory limit means no swap at all.
		res.Memory.Swap = &mem
	}
	cg, err := cgroup1.New(cgroup1.StaticPath(name), res, allowMissing)
	if err != nil {
		// New may have made some controllers' directories before failing.
		if old, lerr := cgroup1.Load(cgroup1.StaticPath(name), allowMissing); lerr == nil {
			_ = old.Delete()
		}
		return nil, err
	}
	return &v1slot{h: h, name: name, cg: cg}, nil
}

func (h *v1) load(name string) (slot, bool, error) {
	if _, err := os.Stat(filepath.Join(h.dirs[cgroup1.Memory], name)); errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(name), allowMissing)
	if err != nil {
		return nil, false, err
	}
	return &v1slot{h: h, name: name, cg: cg}, true, nil
}

type v1slot struct {
	h    *v1
	name string
	cg   cgroup1.Cgroup
}

func (s *v1slot) file(c cgroup1.Name, f string) string { return filepath.Join(s.h.dirs[c], s.name, f) }

func (s *v1slot) add(pid int) error { return s.cg.Add(cgroup1.Process{Pid: pid}) }

func (s *v1slot) procs() ([]int, error) {
	// Every controller sees the same processes once add has run; ask the pids controller,
	// which a worker never lacks.
	ps, err := s.cg.Processes(cgroup1.Pids, true)
	if err != nil {
		// Removed by a concurrent finish: nothing can run in it any more.
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Pid)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

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
		frozen := hasFreezer && s.cg.Freeze() == nil
		if frozen {
			ps, err = s.procs()
			if err != nil {
				_ = s.cg.Thaw()
				return err
			}
		}
		for _, p := range ps {
			_ = unix.Kill(p, unix.SIGKILL)
		}
		if frozen {
			if err := s.cg.Thaw(); err != nil && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
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

func (s *v1slot) remove() error {
	err := s.cg.Delete()
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil
	}
	return err
}
