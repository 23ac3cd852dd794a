package healthcheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// Mode is the cgroup layout whose memory controller the prober reads.
type Mode int

const (
	// ModeNone: no memory controller found; only node-level probes run.
	ModeNone Mode = iota
	// ModeV1: the legacy hierarchy, one mount per controller (<root>/memory/...). Hybrid
	// systems (a v2 mount at <root>/unified with no controllers) are v1 for memory.
	ModeV1
	// ModeV2: the unified hierarchy (<root>/cgroup.controllers lists "memory").
	ModeV2
)

func (m Mode) String() string {
	switch m {
	case ModeV1:
		return "v1"
	case ModeV2:
		return "v2"
	default:
		return "none"
	}
}

// DetectMode finds how the memory controller is mounted under root (normally /sys/fs/cgroup).
// It looks at files rather than asking containerd/cgroups' Mode() so that it works on any
// root, fixture directories included.
func DetectMode(root string) Mode {
	if ctrl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		for _, f := range bytes.Fields(ctrl) {
			if string(f) == "memory" {
				return ModeV2
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "memory", "memory.usage_in_bytes")); err == nil {
		return ModeV1
	}
	return ModeNone
}

// unlimited is where limits stop meaning anything: v1 reports "no limit" as
// PAGE_COUNTER_MAX*PAGE_SIZE (9223372036854771712), v2 as "max".
const unlimited = 1 << 62

// CgroupMemory is one memory cgroup's limit and use, in bytes.
type CgroupMemory struct {
	// Limit is the smallest limit that applies (v1: memory.limit_in_bytes and the
	// hierarchical limit from ancestors; v2: memory.max), or 0 if there is none.
	Limit uint64
	// Usage is memory.usage_in_bytes (v1) or memory.current (v2): page cache included.
	Usage uint64
	// InactiveFile is page cache the kernel reclaims first (total_inactive_file in v1,
	// inactive_file in v2).
	InactiveFile uint64
}

// WorkingSet is usage without inactive page cache, as docker stats and the kubelet count it:
// what cannot be reclaimed without pain.
func (c CgroupMemory) WorkingSet() uint64 {
	if c.InactiveFile >= c.Usage {
		return 0
	}
	return c.Usage - c.InactiveFile
}

// UsedFraction is WorkingSet/Limit in [0, 1], or 0 for a cgroup without a limit.
func (c CgroupMemory) UsedFraction() float64 {
	if c.Limit == 0 {
		return 0
	}
	return min(1, float64(c.WorkingSet())/float64(c.Limit))
}

// ParseLimit reads memory.limit_in_bytes (v1) or memory.max (v2): a byte count or "max". It
// returns 0 for no limit.
func ParseLimit(data []byte) (uint64, error) {
	b := trimSpace(data)
	if string(b) == "max" {
		return 0, nil
	}
	v, ok := parseUint(b)
	if !ok {
		return 0, fmt.Errorf("memory limit: bad value %q", b)
	}
	if v >= unlimited {
		return 0, nil
	}
	return v, nil
}

// ParseUsage reads memory.usage_in_bytes (v1) or memory.current (v2).
func ParseUsage(data []byte) (uint64, error) {
	b := trimSpace(data)
	v, ok := parseUint(b)
	if !ok {
		return 0, fmt.Errorf("memory usage: bad value %q", b)
	}
	return v, nil
}

// MemoryStat is what the prober needs from a memory.stat file.
type MemoryStat struct {
	InactiveFile uint64
	// HierarchicalLimit is v1's hierarchical_memory_limit (the tightest limit of the cgroup
	// and its ancestors), 0 if absent or unlimited. v2 has no such line.
	HierarchicalLimit uint64
}

// ParseMemoryStat reads memory.stat: total_inactive_file and hierarchical_memory_limit for
// v1 (the total_ value covers the cgroup's descendants, which is where the workers are),
// inactive_file for v2 (already hierarchical there).
func ParseMemoryStat(data []byte, mode Mode) (MemoryStat, error) {
	var s MemoryStat
	switch mode {
	case ModeV1:
		v, ok := keyValue(data, "total_inactive_file")
		if !ok {
			return MemoryStat{}, fmt.Errorf("memory.stat: no total_inactive_file")
		}
		s.InactiveFile = v
		if l, ok := keyValue(data, "hierarchical_memory_limit"); ok && l < unlimited {
			s.HierarchicalLimit = l
		}
	case ModeV2:
		v, ok := keyValue(data, "inactive_file")
		if !ok {
			return MemoryStat{}, fmt.Errorf("memory.stat: no inactive_file")
		}
		s.InactiveFile = v
	default:
		return MemoryStat{}, fmt.Errorf("memory.stat: no cgroup mode")
	}
	return s, nil
}

// cgroupFiles are the files that describe one memory cgroup, as absolute paths computed
// once rather than joined on every probe. pressure is v2's memory.pressure ("" on v1).
type cgroupFiles struct {
	dir, limit, usage, stat, pressure string
}

func newCgroupFiles(root string, mode Mode, cgroup string) cgroupFiles {
	switch mode {
	case ModeV1:
		dir := filepath.Join(root, "memory", filepath.Clean("/"+cgroup))
		return cgroupFiles{dir: dir, limit: filepath.Join(dir, "memory.limit_in_bytes"),
			usage: filepath.Join(dir, "memory.usage_in_bytes"), stat: filepath.Join(dir, "memory.stat")}
	case ModeV2:
		dir := filepath.Join(root, filepath.Clean("/"+cgroup))
		return cgroupFiles{dir: dir, limit: filepath.Join(dir, "memory.max"),
			usage: filepath.Join(dir, "memory.current"), stat: filepath.Join(dir, "memory.stat"),
			pressure: filepath.Join(dir, "memory.pressure")}
	}
	return cgroupFiles{}
}
