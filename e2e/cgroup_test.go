package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The memory controller's files, on cgroup v1 or v2 as the host has it: these tests run on
// this v1 host and in the v2 machine of scripts/vmtest.

func cgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

func cgroupVersion() string {
	if cgroupV2() {
		return "v2"
	}
	return "v1"
}

// memoryDir is the memory controller's directory of cgroup rel.
func memoryDir(rel string) string {
	if cgroupV2() {
		return filepath.Join("/sys/fs/cgroup", rel)
	}
	return filepath.Join("/sys/fs/cgroup/memory", rel)
}

// limitMemory makes cgroup rel with a memory limit and no swap; on v2 the cgroups above
// enable the memory controller for their children, as a systemd host's do.
func limitMemory(t *testing.T, rel string, limit int64) {
	t.Helper()
	v := []byte(strconv.FormatInt(limit, 10))
	if !cgroupV2() {
		dir := memoryDir(rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"} {
			if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil && !(os.IsNotExist(err) && f != "memory.limit_in_bytes") {
				t.Fatalf("limit cgroup %s: %v", rel, err)
			}
		}
		return
	}
	dir := "/sys/fs/cgroup"
	for _, part := range strings.Split(strings.Trim(rel, "/"), "/") {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
			t.Fatalf("enable memory in %s: %v", dir, err)
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.max"), v, 0o644); err != nil {
		t.Fatalf("limit cgroup %s: %v", rel, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644); err != nil && !os.IsNotExist(err) {
		t.Fatalf("no swap for cgroup %s: %v", rel, err)
	}
}

// cgroupKey reads "key value" from one of the memory controller's files of rel.
func cgroupKey(t *testing.T, rel, file, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(memoryDir(rel), file))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %s of cgroup %s", key, file, rel)
	return 0
}

// oomKills is how many processes the kernel's OOM killer took in rel (v1 memory.oom_control,
// v2 memory.events).
func oomKills(t *testing.T, rel string) int64 {
	if cgroupV2() {
		return cgroupKey(t, rel, "memory.events", "oom_kill")
	}
	return cgroupKey(t, rel, "memory.oom_control", "oom_kill")
}

// limitHits is how often rel's usage hit its limit (v1 memory.failcnt, v2 memory.events
// "max"): reclaim at the limit, not a kill.
func limitHits(t *testing.T, rel string) int64 {
	if cgroupV2() {
		return cgroupKey(t, rel, "memory.events", "max")
	}
	b, err := os.ReadFile(filepath.Join(memoryDir(rel), "memory.failcnt"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// memoryWatch polls a cgroup's memory use every 5 ms: when it first went above high, and
// when it last went below low after that.
type memoryWatch struct {
	crossed, below atomic.Int64 // unix nanos, 0 for not yet
	stop           chan struct{}
	peakFile       string // the kernel's high-water mark of the cgroup's memory
	high           int64
}

func watchMemory(t *testing.T, rel string, high, low int64) *memoryWatch {
	file := filepath.Join(memoryDir(rel), "memory.usage_in_bytes")
	if cgroupV2() {
		file = filepath.Join(memoryDir(rel), "memory.current")
	}
	w := &memoryWatch{stop: make(chan struct{}), high: high, peakFile: filepath.Join(memoryDir(rel), "memory.max_usage_in_bytes")}
	if cgroupV2() {
		w.peakFile = filepath.Join(memoryDir(rel), "memory.peak")
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		close(w.stop)
		<-done
	})
	go func() {
		defer close(done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			b, err := os.ReadFile(file)
			if err != nil {
				continue
			}
			u, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			now := time.Now().UnixNano()
			if u > high && w.crossed.Load() == 0 {
				w.crossed.Store(now)
			}
			if u > low {
				w.below.Store(0)
			} else if w.crossed.Load() != 0 && w.below.Load() == 0 {
				w.below.Store(now)
			}
		}
	}()
	return w
}

// since is how long after the crossing t came; it fails the test if memory never crossed.
// A crossing that no sample saw (the sampler starved of cpu, as under emulation, while
// memory went up and down between two samples) still shows in the kernel's high-water
// mark: then it crossed, at a time unknown, and since returns -1.
func (w *memoryWatch) since(t *testing.T, at time.Time, what string) time.Duration {
	t.Helper()
	c := w.crossed.Load()
	if c == 0 {
		b, err := os.ReadFile(w.peakFile)
		peak, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || peak <= w.high {
			t.Fatalf("%s before memory crossed the high mark (peak %d, high %d, %v)", what, peak, w.high, err)
		}
		t.Logf("memory crossed the high mark between two samples (peak %d, high %d): the lag is not measured", peak, w.high)
		return -1
	}
	return at.Sub(time.Unix(0, c))
}

func (w *memoryWatch) String() string {
	return fmt.Sprintf("crossed %d, below %d", w.crossed.Load(), w.below.Load())
}
