package clusterbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stormdock/stormdock/internal/profiling"
)

// Profiles are the master's Go profiles the run took (with the admin token, from its
// /debug/pprof/): a heap profile when each phase settled, a cpu profile over each event.
// Read them with `go tool pprof -top FILE` (heap: -sample_index=inuse_space).
type Profiles struct {
	Dir string `json:"dir"`
	// Heap is the heap profile taken when the master's live heap was largest (its peak
	// among the phases), and HeapBytes that heap.
	Heap      string        `json:"heap,omitempty"`
	HeapBytes int64         `json:"heapBytes,omitempty"`
	Files     []ProfileFile `json:"files"`
	Errors    []string      `json:"errors,omitempty"`
	cpu       chan cpuResult
}

// ProfileFile is one profile: what it covers, its file, and for a heap profile the master's
// live heap (bytes in heap objects, after a collection) and resident memory when taken.
type ProfileFile struct {
	What      string `json:"what"`
	Kind      string `json:"kind"` // heap or cpu
	File      string `json:"file"`
	HeapBytes int64  `json:"heapBytes,omitempty"`
	RSSBytes  int64  `json:"rssBytes,omitempty"`
	// Memory is the runtime's memory by class when a heap profile was taken.
	Memory  string  `json:"memory,omitempty"`
	Seconds float64 `json:"seconds,omitempty"` // a cpu profile's span
}

type cpuResult struct {
	f   ProfileFile
	err error
}

// fetch writes the master's GET path (with the admin token) to file.
func (m *master) fetch(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// heapBytes reads the master's live heap from its runtime figures, and where the rest of
// the memory it holds from the system goes (memoryClasses).
func (m *master) heapBytes(ctx context.Context) (int64, string, error) {
	rt, err := m.runtime(ctx)
	if err != nil {
		return 0, "", err
	}
	for _, s := range rt.Metrics {
		if s.Name == "/gc/heap/live:bytes" && s.Value != nil {
			return int64(*s.Value), memoryClasses(rt), nil
		}
	}
	return 0, "", fmt.Errorf("%sruntime has no /gc/heap/live:bytes", profiling.Prefix)
}

// memoryClasses says what the Go runtime holds of the system's memory, by class: the gap
// between a live heap and the process's RSS.
func memoryClasses(rt profiling.Runtime) string {
	v := map[string]int64{}
	for _, s := range rt.Metrics {
		if s.Value != nil {
			v[s.Name] = int64(*s.Value)
		}
	}
	return fmt.Sprintf("heap objects %s (goal %s), free heap %s, released %s, stacks %s, runtime %s, mapped in all %s, %d goroutines",
		mib(v["/memory/classes/heap/objects:bytes"]), mib(v["/gc/heap/goal:bytes"]),
		mib(v["/memory/classes/heap/free:bytes"]+v["/memory/classes/heap/unused:bytes"]), mib(v["/memory/classes/heap/released:bytes"]),
		mib(v["/memory/classes/heap/stacks:bytes"]+v["/memory/classes/os-stacks:bytes"]),
		mib(v["/memory/classes/metadata/other:bytes"]+v["/memory/classes/metadata/mspan/inuse:bytes"]+v["/memory/classes/metadata/mspan/free:bytes"]+
			v["/memory/classes/metadata/mcache/inuse:bytes"]+v["/memory/classes/metadata/mcache/free:bytes"]+v["/memory/classes/other:bytes"]+v["/memory/classes/profiling/buckets:bytes"]),
		mib(v["/memory/classes/total:bytes"]), rt.Goroutines)
}

// runtime reads the master's runtime figures.
func (m *master) runtime(ctx context.Context) (profiling.Runtime, error) {
	var rt profiling.Runtime
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.url+profiling.Prefix+"runtime", nil)
	if err != nil {
		return rt, err
	}
	req.Header.Set("Authorization", "Bearer "+m.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return rt, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&rt); err != nil {
		return rt, fmt.Errorf("read %sruntime: %w", profiling.Prefix, err)
	}
	return rt, nil
}

// slug makes a phase's name a file name.
func slug(what string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(what))
}

// heapProfile takes a heap profile of the master now (the figures of its last collection).
func (r *run) heapProfile(ctx context.Context, what string) {
	p := r.rep.Profiles
	if p == nil {
		return
	}
	f := ProfileFile{What: what, Kind: "heap", File: filepath.Join(p.Dir, "heap-"+slug(what)+".pb.gz")}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.master.fetch(ctx, profiling.Prefix+"pprof/heap?gc=1", f.File); err != nil {
		p.Errors = append(p.Errors, fmt.Sprintf("heap profile %s: %v", what, err))
		return
	}
	f.HeapBytes, f.Memory, _ = r.master.heapBytes(ctx)
	if u, err := procUsage(r.master.pid); err == nil {
		f.RSSBytes = u.rss
	}
	p.Files = append(p.Files, f)
	if f.HeapBytes > p.HeapBytes {
		p.Heap, p.HeapBytes = f.File, f.HeapBytes
	}
	r.logf("heap profile %s: live heap %s, master RSS %s: %s; %s", what, mib(f.HeapBytes), mib(f.RSSBytes), f.File, f.Memory)
}

// startCPU starts a cpu profile of the master over the next span (an event and its
// settling); endCPU waits for it.
func (r *run) startCPU(ctx context.Context, what string) {
	p := r.rep.Profiles
	if p == nil {
		return
	}
	span := r.cfg.ProfileSpan
	f := ProfileFile{What: what, Kind: "cpu", File: filepath.Join(p.Dir, "cpu-"+slug(what)+".pb.gz"), Seconds: span.Seconds()}
	p.cpu = make(chan cpuResult, 1)
	go func() {
		err := r.master.fetch(ctx, fmt.Sprintf("%spprof/profile?seconds=%d", profiling.Prefix, int(span.Seconds())), f.File)
		p.cpu <- cpuResult{f, err}
	}()
}

func (r *run) endCPU() {
	p := r.rep.Profiles
	if p == nil || p.cpu == nil {
		return
	}
	res := <-p.cpu
	p.cpu = nil
	if res.err != nil {
		p.Errors = append(p.Errors, fmt.Sprintf("cpu profile %s: %v", res.f.What, res.err))
		return
	}
	p.Files = append(p.Files, res.f)
	r.logf("cpu profile %s (%.0fs): %s", res.f.What, res.f.Seconds, res.f.File)
}
