package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"

	"github.com/stormdock/stormdock/isolation"
)

// v2 is the unified hierarchy mounted at root.
//
// This machine's CI runs cgroup v1 only; the v2 code follows the kernel's cgroup-v2
// interface and the library's manager but is not exercised by the tests here.
type v2 struct {
	root string
}

func newV2(root string) *v2 { return &v2{root: root} }

func (h *v2) version() int { return 2 }

func (h *v2) ensure(parent string) error {
	_, err := cgroup2.NewManager(h.root, parent, &cgroup2.Resources{})
	return err
}

func (h *v2) removeParent(parent string) error {
	m, err := cgroup2.Load(parent, cgroup2.WithMountpoint(h.root))
	if err != nil {
		return err
	}
	return m.Delete()
}

func (h *v2) create(name string, l limits) (slot, error) {
	mem, quota, period, pids := l.memory, l.cpuQuota(), uint64(cpuPeriod.Microseconds()), l.pids
	// cpu.weight from the v1 shares, with the conversion runc and systemd use.
	weight := 1 + ((sharesFor(l.milliCPU)-2)*9999)/262142
	res := &cgroup2.Resources{
		Memory: &cgroup2.Memory{Max: &mem},
		CPU:    &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &period), Weight: &weight},
		Pids:   &cgroup2.Pids{Max: pids},
	}
	m, err := cgroup2.NewManager(h.root, name, res)
	if err != nil {
		return nil, err
	}
	// memory.swap.max is separate from memory.max on v2: zero means no swap. It is absent
	// when swap accounting is off, and then there is no swap to forbid.
	noSwap := int64(0)
	if err := m.Update(&cgroup2.Resources{Memory: &cgroup2.Memory{Swap: &noSwap}}); err != nil && !errors.Is(err, os.ErrNotExist) {
		_ = m.Delete()
		return nil, fmt.Errorf("set memory.swap.max: %w", err)
	}
	return &v2slot{h: h, name: name, m: m}, nil
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

func (s *v2slot) add(pid int) error { return s.m.AddProc(uint64(pid)) }

func (s *v2slot) procs() ([]int, error) {
	ps, err := s.m.Procs(true)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
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
	// cgroup.kill (kernel 5.14+) kills the whole tree atomically; the library falls back to
	// freeze, kill, thaw on older kernels.
	if err := s.m.Kill(); err != nil {
		return err
	}
	return waitEmpty(ctx, s)
}

func (s *v2slot) oomKills() (uint64, error) {
	// oom_kill, not oom: oom counts limit hits that reclaim may have resolved.
	return readKey(s.file("memory.events"), "oom_kill")
}

func (s *v2slot) usage() (isolation.Usage, error) {
	m, err := s.m.Stat()
	if err != nil {
		return isolation.Usage{}, err
	}
	u := isolation.Usage{At: time.Now()}
	if mem := m.GetMemory(); mem != nil && mem.GetUsage() > mem.GetInactiveFile() {
		u.MemoryBytes = mem.GetUsage() - mem.GetInactiveFile()
	}
	if cpu := m.GetCPU(); cpu != nil {
		u.CPU = time.Duration(cpu.GetUsageUsec()) * time.Microsecond
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
