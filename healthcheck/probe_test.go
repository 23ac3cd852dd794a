package healthcheck

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestDetectMode(t *testing.T) {
	for root, want := range map[string]Mode{
		"testdata/cgroupv1": ModeV1, "testdata/cgroupv2": ModeV2, "testdata/proc": ModeNone, "testdata/nonexistent": ModeNone,
	} {
		if got := DetectMode(root); got != want {
			t.Errorf("DetectMode(%s) = %v, want %v", root, got, want)
		}
	}
	// A v2 mount whose root does not offer memory (hybrid's "unified") is not v2 for us.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := DetectMode(dir); got != ModeNone {
		t.Errorf("v2 without memory: %v", got)
	}
}

func TestProbeFixtures(t *testing.T) {
	node := 1 - 104858.0/1048576 // testdata/proc/meminfo: 90% used
	at := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name, root, parent string
		present            bool
		cg                 CgroupMemory
		cgUsed, used       float64
		source             string
	}{
		// 220 MiB usage - 20 MiB inactive file = 200 MiB of 256 MiB = 78%: node (90%) wins.
		{name: "v1", root: "testdata/cgroupv1", parent: "/stormdock-node1", present: true,
			cg: CgroupMemory{Limit: 256 << 20, Usage: 220 << 20, InactiveFile: 20 << 20}, cgUsed: 200.0 / 256, used: node, source: SourceNode},
		{name: "v2", root: "testdata/cgroupv2", parent: "stormdock-node1", present: true,
			cg: CgroupMemory{Limit: 256 << 20, Usage: 220 << 20, InactiveFile: 20 << 20}, cgUsed: 200.0 / 256, used: node, source: SourceNode},
		// The parent has no limit of its own but its ancestor /agents has 128 MiB: 96/128.
		{name: "v2-ancestor", root: "testdata/cgroupv2", parent: "/agents/node2", present: true,
			cg: CgroupMemory{Limit: 128 << 20, Usage: 96 << 20}, cgUsed: 0.75, used: node, source: SourceNode},
		{name: "v2-unlimited", root: "testdata/cgroupv2", parent: "/unlimited", present: true,
			cg: CgroupMemory{Usage: 96 << 20}, cgUsed: 0, used: node, source: SourceNode},
		// The driver has not created the parent yet: node level only, no error.
		{name: "v1-absent", root: "testdata/cgroupv1", parent: "/not-yet", used: node, source: SourceNode},
		{name: "no-parent", root: "testdata/cgroupv1", used: node, source: SourceNode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProber(ProbeOptions{ProcRoot: "testdata/proc", CgroupRoot: tc.root, CgroupParent: tc.parent,
				Now: func() time.Time { return at }})
			if err != nil {
				t.Fatal(err)
			}
			s, err := p.Probe()
			if err != nil {
				t.Fatal(err)
			}
			if !s.At.Equal(at) || s.Node.Total != 1<<30 || !near(s.NodeUsed, node) {
				t.Errorf("node part: %+v", s)
			}
			if s.CgroupPresent != tc.present || s.Cgroup != tc.cg || !near(s.CgroupUsed, tc.cgUsed) {
				t.Errorf("cgroup part: present %v %+v used %v; want %v %+v %v", s.CgroupPresent, s.Cgroup, s.CgroupUsed, tc.present, tc.cg, tc.cgUsed)
			}
			if !near(s.Used, tc.used) || s.Source != tc.source {
				t.Errorf("used %v (%s), want %v (%s)", s.Used, s.Source, tc.used, tc.source)
			}
			if !s.HasPSI || !near(s.PSI.SomeAvg10, 37.52) || s.Load.Load1 != 3.21 {
				t.Errorf("psi/load: %+v %+v", s.PSI, s.Load)
			}
			// The parent's own pressure: v2's memory.pressure, where the fixture has one.
			wantPSI := tc.name == "v2"
			if s.HasCgroupPSI != wantPSI || wantPSI && (!near(s.CgroupPSI.SomeAvg10, 12.5) || s.CgroupPSI.FullTotal != 2950000) {
				t.Errorf("cgroup psi: %v %+v, want present=%v", s.HasCgroupPSI, s.CgroupPSI, wantPSI)
			}
		})
	}
}

// A parent cgroup tighter than the machine decides: copy the fixtures and lower the node's
// use so that the cgroup's 78% is the larger.
func TestProbeCgroupWins(t *testing.T) {
	for _, mode := range []string{"cgroupv1", "cgroupv2"} {
		t.Run(mode, func(t *testing.T) {
			proc := t.TempDir()
			if err := os.WriteFile(filepath.Join(proc, "meminfo"), []byte("MemTotal: 1000 kB\nMemAvailable: 900 kB\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "loadavg"), []byte("0.00 0.00 0.00 1/1 1\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := NewProber(ProbeOptions{ProcRoot: proc, CgroupRoot: filepath.Join("testdata", mode), CgroupParent: "/stormdock-node1"})
			if err != nil {
				t.Fatal(err)
			}
			s, err := p.Probe()
			if err != nil {
				t.Fatal(err)
			}
			if s.HasPSI {
				t.Error("no pressure file, yet HasPSI")
			}
			if !near(s.NodeUsed, 0.1) || !near(s.Used, 200.0/256) || s.Source != SourceCgroup {
				t.Errorf("used %v from %s (node %v)", s.Used, s.Source, s.NodeUsed)
			}
			w, err := p.Cgroup("/stormdock-node1/w-1")
			if err != nil {
				t.Fatal(err)
			}
			if w.WorkingSet() != 124<<20 {
				t.Errorf("worker working set %d, want %d", w.WorkingSet(), 124<<20)
			}
			if _, err := p.Cgroup("/stormdock-node1/w-nope"); err == nil {
				t.Error("missing worker cgroup: no error")
			}
		})
	}
}

func TestProberErrors(t *testing.T) {
	if _, err := NewProber(ProbeOptions{ProcRoot: t.TempDir()}); err == nil {
		t.Error("no meminfo: no error")
	}
	if _, err := NewProber(ProbeOptions{ProcRoot: "testdata/proc", CgroupRoot: t.TempDir(), CgroupParent: "/x"}); err == nil {
		t.Error("cgroup parent without a memory controller: no error")
	}
	// A corrupt cgroup file is an error, not a silent zero.
	root := t.TempDir()
	for name, content := range map[string]string{
		"memory/memory.usage_in_bytes": "1\n", "memory/p/memory.limit_in_bytes": "100\n",
		"memory/p/memory.usage_in_bytes": "garbage\n", "memory/p/memory.stat": "total_inactive_file 0\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewProber(ProbeOptions{ProcRoot: "testdata/proc", CgroupRoot: root, CgroupParent: "/p"}); err == nil {
		t.Error("corrupt memory.usage_in_bytes: no error")
	}
}

// TestProbeReal reads this machine's files: the numbers must agree with what the kernel says
// through other means.
func TestProbeReal(t *testing.T) {
	if _, err := os.Stat("/proc/meminfo"); err != nil {
		testenv.Missing(t, "/proc/meminfo: %v", err)
	}
	p, err := NewProber(ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Probe()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseMeminfo(raw)
	if err != nil {
		t.Fatal(err)
	}
	if s.Node.Total != m.Total || s.Node.Total == 0 || !(s.NodeUsed > 0 && s.NodeUsed < 1) {
		t.Errorf("real probe: %+v", s)
	}
	if _, err := os.Stat("/proc/pressure/memory"); err == nil && !s.HasPSI {
		t.Error("/proc/pressure/memory exists but the probe did not read it")
	}
}
