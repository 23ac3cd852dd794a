package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
	"github.com/stormdock/stormdock/isolation"
)

// unconfined stands in for a cgroup hierarchy where none is writable (not root, or inside a
// container without nested cgroups): a worker's "slot" is its process group, which the
// shim starts in. Nothing is limited, OOM kills are not told apart, and a child that leaves
// the process group escapes Stop; the driver says so when it starts. The group's leader
// pid is kept in a file per worker so that a restarted driver finds it again.
type unconfined struct {
	dir string // one file per worker: the process group id
}

func newUnconfined(stateDir string) (*unconfined, error) {
	dir := filepath.Join(stateDir, "groups")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("process driver: %w", err)
	}
	return &unconfined{dir: dir}, nil
}

func (h *unconfined) version() int              { return 0 }
func (h *unconfined) ensure(string) error       { return nil }
func (h *unconfined) removeParent(string) error { return nil }
func (h *unconfined) file(name string) string {
	return filepath.Join(h.dir, strings.ReplaceAll(strings.Trim(name, "/"), "/", "_"))
}
func (h *unconfined) create(name string, _ limits) (slot, error) {
	return &group{file: h.file(name)}, nil
}

func (h *unconfined) load(name string) (slot, bool, error) {
	b, err := os.ReadFile(h.file(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, false, fmt.Errorf("process group file %s: %w", h.file(name), err)
	}
	return &group{file: h.file(name), pgid: pgid}, true, nil
}

// group is a worker's process group.
type group struct {
	file string
	pgid int
}

func (g *group) add(pid int) error {
	if g.pgid == 0 {
		g.pgid = pid
		return os.WriteFile(g.file, []byte(strconv.Itoa(pid)), 0o640)
	}
	return syscall.Setpgid(pid, g.pgid)
}

// procs scans /proc for the members of the group.
func (g *group) procs() ([]int, error) {
	if g.pgid == 0 {
		return nil, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command, which may hold spaces, start past the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(g.pgid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

func (g *group) killAll(ctx context.Context) error {
	if g.pgid == 0 {
		return nil
	}
	for {
		_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		p, err := g.procs()
		if err != nil || len(p) == 0 {
			return err
		}
		if err := ctxtime.Sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
}

func (g *group) oomKills() (uint64, error) { return 0, nil }

// usage adds up the members' resident memory and cpu time from /proc.
func (g *group) usage() (isolation.Usage, error) {
	pids, err := g.procs()
	if err != nil {
		return isolation.Usage{}, err
	}
	u := isolation.Usage{At: time.Now()}
	page := uint64(os.Getpagesize())
	for _, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid)); err == nil {
			if f := strings.Fields(string(b)); len(f) > 1 {
				rss, _ := strconv.ParseUint(f[1], 10, 64)
				u.MemoryBytes += rss * page
			}
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			i := strings.LastIndexByte(string(b), ')')
			if f := strings.Fields(string(b[i+1:])); len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				u.CPU += time.Duration(ut+st) * time.Second / 100 // USER_HZ
			}
		}
	}
	return u, nil
}

// limits reports none: nothing is enforced without a cgroup.
func (g *group) limits() (isolation.Limits, error) { return isolation.Limits{}, nil }

func (g *group) remove() error {
	err := os.Remove(g.file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
