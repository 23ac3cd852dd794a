package healthcheck

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// testCgroup is a real parent memory cgroup with a limit, made for one test and removed after
// it, with the workers' cgroups under it: /stormdock-hc-test-<rand>/<worker>.
type testCgroup struct {
	mode Mode
	root string // /sys/fs/cgroup
	rel  string // /stormdock-hc-test-<rand>
	kids []string
}

func (c *testCgroup) dir(rel string) string {
	if c.mode == ModeV1 {
		return filepath.Join(c.root, "memory", rel)
	}
	return filepath.Join(c.root, rel)
}

func writeFile(t testing.TB, path, value string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(value), 0); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func newTestCgroup(t testing.TB, limit uint64) *testCgroup {
	t.Helper()
	testenv.Cgroups(t)
	c := &testCgroup{root: "/sys/fs/cgroup", mode: DetectMode("/sys/fs/cgroup")}
	if c.mode == ModeNone {
		testenv.Missing(t, "no cgroup memory controller under /sys/fs/cgroup")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	c.rel = "/stormdock-hc-test-" + hex.EncodeToString(b[:])
	dir := c.dir(c.rel)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create test cgroup: %v", err)
	}
	t.Cleanup(func() { c.remove(t) })
	lim := strconv.FormatUint(limit, 10)
	if c.mode == ModeV1 {
		writeFile(t, filepath.Join(dir, "memory.limit_in_bytes"), lim)
		// No swap either, so that pressure is real and the OOM killer the only way out.
		if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
			writeFile(t, filepath.Join(dir, "memory.memsw.limit_in_bytes"), lim)
		}
	} else {
		writeFile(t, filepath.Join(dir, "memory.max"), lim)
		if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
			writeFile(t, filepath.Join(dir, "memory.swap.max"), "0")
		}
		writeFile(t, filepath.Join(dir, "cgroup.subtree_control"), "+memory")
	}
	return c
}

func (c *testCgroup) child(t *testing.T, name string) string {
	t.Helper()
	rel := c.rel + "/" + name
	if err := os.Mkdir(c.dir(rel), 0o755); err != nil {
		t.Fatalf("create worker cgroup: %v", err)
	}
	c.kids = append(c.kids, rel)
	return rel
}

func (c *testCgroup) remove(t testing.TB) {
	// The processes are gone by now (their cleanups ran first); rmdir can still see EBUSY for
	// a moment while the kernel tears the last one down.
	for _, rel := range append(c.kids, c.rel) {
		testenv.EventuallyWith(t, "cgroup "+rel+" removed", 3*time.Second, func() (bool, string) {
			err := os.Remove(c.dir(rel))
			return err == nil || errors.Is(err, os.ErrNotExist), fmt.Sprint(err)
		})
	}
}

// oomKills is how many processes the kernel OOM-killed in the parent.
func (c *testCgroup) oomKills(t *testing.T) uint64 {
	t.Helper()
	file, key := "memory.oom_control", "oom_kill"
	if c.mode == ModeV2 {
		file = "memory.events"
	}
	data, err := os.ReadFile(filepath.Join(c.dir(c.rel), file))
	if err != nil {
		t.Fatal(err)
	}
	v, ok := keyValue(data, key)
	if !ok {
		t.Fatalf("no %s in %s", key, file)
	}
	return v
}

// limitHits is how often the parent hit its limit (v1 memory.failcnt, v2 "max" events).
func (c *testCgroup) limitHits(t *testing.T) uint64 {
	t.Helper()
	if c.mode == ModeV1 {
		data, err := os.ReadFile(filepath.Join(c.dir(c.rel), "memory.failcnt"))
		if err != nil {
			t.Fatal(err)
		}
		v, _ := ParseUsage(data)
		return v
	}
	data, err := os.ReadFile(filepath.Join(c.dir(c.rel), "memory.events"))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := keyValue(data, "max")
	return v
}

// allocWorker is a re-executed test binary in its own worker cgroup, allocating on command.
type allocWorker struct {
	name    string
	cgroup  string
	prio    int
	request uint64
	cmd     *exec.Cmd
	in      io.WriteCloser
	replies chan string
	done    chan struct{}
}

func startWorker(t *testing.T, c *testCgroup, name string, prio int, request uint64) *allocWorker {
	t.Helper()
	w := &allocWorker{name: name, cgroup: c.child(t, name), prio: prio, request: request,
		replies: make(chan string, 16), done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(os.Environ(), allocEnv+"=1")
	w.cmd.Stderr = os.Stderr
	var err error
	if w.in, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case w.replies <- sc.Text():
			default: // nobody listens (a "grow" cut short): never block the exit
			}
		}
		_ = w.cmd.Wait()
		close(w.done)
	}()
	t.Cleanup(w.kill)
	w.expect(t, "ready")
	// Into the worker cgroup before it allocates anything: v1 does not move charges.
	writeFile(t, filepath.Join(c.dir(w.cgroup), "cgroup.procs"), strconv.Itoa(w.cmd.Process.Pid))
	return w
}

func (w *allocWorker) expect(t *testing.T, prefix string) {
	t.Helper()
	select {
	case r := <-w.replies:
		if !strings.HasPrefix(r, prefix) {
			t.Fatalf("%s: reply %q, want %q", w.name, r, prefix)
		}
	case <-w.done:
		t.Fatalf("%s: exited before %q", w.name, prefix)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no %q in 10s", w.name, prefix)
	}
}

func (w *allocWorker) send(t *testing.T, format string, args ...any) {
	t.Helper()
	if _, err := fmt.Fprintf(w.in, format+"\n", args...); err != nil {
		t.Fatalf("%s: %v", w.name, err)
	}
}

// set makes the worker hold mib MiB and waits until it does.
func (w *allocWorker) set(t *testing.T, mib int) {
	t.Helper()
	w.send(t, "set %d", mib)
	w.expect(t, "ok")
}

func (w *allocWorker) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

func (w *allocWorker) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}
