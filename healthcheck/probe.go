package healthcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Probe reads the node's memory state once. *Prober is the real one; tests of the monitor
// logic may give their own.
type Probe interface {
	Probe() (Sample, error)
}

// Sources of the used fraction that a Sample reports.
const (
	SourceNode   = "node"
	SourceCgroup = "cgroup"
)

// Sample is one probe of the node.
type Sample struct {
	// At is when the probe had read everything.
	At time.Time
	// Node is /proc/meminfo; NodeUsed its used fraction.
	Node     NodeMemory
	NodeUsed float64
	// Cgroup is the workers' parent cgroup, when it exists (CgroupPresent). CgroupUsed is
	// its working set over its limit, 0 when it has no limit.
	CgroupPresent bool
	Cgroup        CgroupMemory
	CgroupUsed    float64
	// Used = max(NodeUsed, CgroupUsed): the node is as short of memory as the tighter of the
	// machine and the budget the operator gave the workers. Source says which one it was.
	Used   float64
	Source string
	// PSI is /proc/pressure/memory when the kernel has it (HasPSI). It is reported, not
	// used to throttle: it says that tasks are stalling, not how much room is left.
	PSI    PSI
	HasPSI bool
	// CgroupPSI is the parent cgroup's own memory.pressure (cgroup v2 only: HasCgroupPSI):
	// stalls of the workers alone, reclaim at their limits included, which the node's
	// figure dilutes among everything else the machine runs.
	CgroupPSI    PSI
	HasCgroupPSI bool
	Load         LoadAvg
}

// ProbeOptions say where the files are. Zero values are the real machine's.
type ProbeOptions struct {
	// ProcRoot is where procfs is mounted; default /proc.
	ProcRoot string
	// CgroupRoot is where cgroupfs is mounted; default /sys/fs/cgroup.
	CgroupRoot string
	// CgroupParent is the cgroup that holds the workers' cgroups, relative to the hierarchy
	// root (e.g. /stormdock); empty means node-level probes only.
	CgroupParent string
	// Mode forces a cgroup mode; ModeNone means detect it under CgroupRoot.
	Mode Mode
	// Now stamps samples; default time.Now.
	Now func() time.Time
}

// Prober reads memory state from procfs and cgroupfs. It is safe for concurrent use (the
// monitor and the eviction loop share one). A probe reuses one buffer and parses in place:
// its only allocations are the system calls' path strings, a few dozen bytes.
type Prober struct {
	mode     Mode
	parent   string
	now      func() time.Time
	root     string
	meminfo  string
	pressure string
	loadavg  string
	files    cgroupFiles
	// v2 limits of the parent's ancestors: v1 sums them up for us in
	// hierarchical_memory_limit, v2 does not.
	ancestorMax []string

	mu          sync.Mutex
	buf         []byte
	noPSI       bool
	noCgroupPSI bool
}

// NewProber checks that the node files are readable and returns a prober.
func NewProber(o ProbeOptions) (*Prober, error) {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.CgroupRoot == "" {
		o.CgroupRoot = "/sys/fs/cgroup"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	p := &Prober{
		now:      o.Now,
		root:     o.CgroupRoot,
		meminfo:  filepath.Join(o.ProcRoot, "meminfo"),
		pressure: filepath.Join(o.ProcRoot, "pressure", "memory"),
		loadavg:  filepath.Join(o.ProcRoot, "loadavg"),
		buf:      make([]byte, 8192),
	}
	if o.CgroupParent != "" {
		p.parent = filepath.Clean("/" + o.CgroupParent)
		p.mode = o.Mode
		if p.mode == ModeNone {
			p.mode = DetectMode(o.CgroupRoot)
		}
		if p.mode == ModeNone {
			return nil, fmt.Errorf("probe: --cgroup-parent %s given but no cgroup memory controller under %s", p.parent, o.CgroupRoot)
		}
		p.files = newCgroupFiles(o.CgroupRoot, p.mode, p.parent)
		if p.mode == ModeV2 {
			for dir := filepath.Dir(p.parent); dir != "/"; dir = filepath.Dir(dir) {
				p.ancestorMax = append(p.ancestorMax, filepath.Join(o.CgroupRoot, dir, "memory.max"))
			}
		}
	}
	if _, err := p.Probe(); err != nil {
		return nil, err
	}
	return p, nil
}

// Mode is the cgroup mode the prober reads (ModeNone without a cgroup parent).
func (p *Prober) Mode() Mode { return p.mode }

// Parent is the cgroup parent, cleaned, or "".
func (p *Prober) Parent() string { return p.parent }

// Probe reads /proc/meminfo, /proc/pressure/memory, /proc/loadavg and the parent cgroup.
// A parent cgroup that does not exist yet (the isolation driver creates it) is not an error:
// the sample says CgroupPresent=false and the node level alone counts.
func (p *Prober) Probe() (Sample, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Sample{Source: SourceNode}
	data, err := p.read(p.meminfo)
	if err != nil {
		return Sample{}, fmt.Errorf("probe: %w", err)
	}
	if s.Node, err = ParseMeminfo(data); err != nil {
		return Sample{}, fmt.Errorf("probe %s: %w", p.meminfo, err)
	}
	s.NodeUsed = s.Node.UsedFraction()
	s.Used = s.NodeUsed

	if !p.noPSI {
		// Kernels without CONFIG_PSI have no file; psi=0 on the command line makes reads
		// fail with EOPNOTSUPP. Either way it will not change: stop asking.
		if data, err := p.read(p.pressure); err != nil {
			p.noPSI = true
		} else if s.PSI, err = ParsePSI(data); err == nil {
			s.HasPSI = true
		}
	}
	if data, err := p.read(p.loadavg); err == nil {
		s.Load, _ = ParseLoadavg(data)
	}

	if p.parent != "" {
		cg, err := p.cgroupLocked(p.files)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return Sample{}, fmt.Errorf("probe cgroup %s: %w", p.parent, err)
		default:
			s.CgroupPresent = true
			for _, f := range p.ancestorMax {
				if data, err := p.read(f); err == nil {
					if l, err := ParseLimit(data); err == nil && l > 0 && (cg.Limit == 0 || l < cg.Limit) {
						cg.Limit = l
					}
				}
			}
			s.Cgroup = cg
			s.CgroupUsed = cg.UsedFraction()
			if p.files.pressure != "" && !p.noCgroupPSI {
				// Kernels without PSI have no file, and psi=0 makes reads fail: stop asking
				// then. A file gone with its cgroup comes back with it.
				if data, err := p.read(p.files.pressure); err != nil {
					p.noCgroupPSI = !errors.Is(err, fs.ErrNotExist) || p.noPSI
				} else if s.CgroupPSI, err = ParsePSI(data); err == nil {
					s.HasCgroupPSI = true
				}
			}
			if s.CgroupUsed > s.Used {
				s.Used, s.Source = s.CgroupUsed, SourceCgroup
			}
		}
	}
	// Stamped once the files are read: the figures are as of no earlier than this, so a
	// hold measured from the first sample below a mark is never short, however long a
	// stalled probe took.
	s.At = p.now()
	return s, nil
}

// Cgroup reads the memory of any cgroup, given relative to the hierarchy root as the
// isolation driver names them (e.g. /stormdock/w-3): the agent uses it for the usage of each
// eviction candidate.
func (p *Prober) Cgroup(path string) (CgroupMemory, error) {
	if p.mode == ModeNone {
		return CgroupMemory{}, fmt.Errorf("cgroup %s: no cgroup memory controller", path)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cg, err := p.cgroupLocked(newCgroupFiles(p.root, p.mode, path))
	if err != nil {
		return CgroupMemory{}, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return cg, nil
}

func (p *Prober) cgroupLocked(f cgroupFiles) (CgroupMemory, error) {
	var cg CgroupMemory
	data, err := p.read(f.limit)
	if err != nil {
		return cg, err
	}
	if cg.Limit, err = ParseLimit(data); err != nil {
		return cg, fmt.Errorf("%s: %w", f.limit, err)
	}
	if data, err = p.read(f.usage); err != nil {
		return cg, err
	}
	if cg.Usage, err = ParseUsage(data); err != nil {
		return cg, fmt.Errorf("%s: %w", f.usage, err)
	}
	if data, err = p.read(f.stat); err != nil {
		return cg, err
	}
	st, err := ParseMemoryStat(data, p.mode)
	if err != nil {
		return cg, fmt.Errorf("%s: %w", f.stat, err)
	}
	cg.InactiveFile = st.InactiveFile
	if st.HierarchicalLimit > 0 && (cg.Limit == 0 || st.HierarchicalLimit < cg.Limit) {
		cg.Limit = st.HierarchicalLimit
	}
	return cg, nil
}

// read returns the whole of a small kernel file in p.buf, valid until the next read. Raw
// system calls instead of os.ReadFile: no *os.File, no fresh buffer, no stat per read.
func (p *Prober) read(path string) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	for err == syscall.EINTR {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(p.buf) {
			if len(p.buf) >= 1<<20 {
				return nil, &fs.PathError{Op: "read", Path: path, Err: errors.New("file larger than 1 MiB")}
			}
			p.buf = append(p.buf, make([]byte, len(p.buf))...)
		}
		m, err := syscall.Read(fd, p.buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return p.buf[:n], nil
		}
		n += m
	}
}
