package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
)

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, e := range es {
		ns = append(ns, e.Name())
	}
	return ns
}

func TestWriteFileReplacesWithMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	if err := os.WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A umask that would narrow the mode if it applied.
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	if err := WriteFile(p, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "new" {
		t.Fatalf("read %q, %v; want new", b, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", fi.Mode().Perm())
	}
	if got := names(t, dir); !slices.Equal(got, []string{"state.json"}) {
		t.Fatalf("directory holds %q, want only state.json", got)
	}
}

func TestFailedRenameLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	// A directory that is not empty cannot be renamed over.
	p := filepath.Join(dir, "busy")
	if err := os.MkdirAll(filepath.Join(p, "inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(p, []byte("data"), 0o600)
	if err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if got := names(t, dir); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("directory holds %q after a failed write, want only busy", got)
	}
}

func TestCleanupDropsUncommitted(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Create(p, 0o400)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("dropped")); err != nil {
		t.Fatal(err)
	}
	f.Cleanup()
	if got := names(t, dir); !slices.Equal(got, []string{"token"}) {
		t.Fatalf("directory holds %q after Cleanup, want only token", got)
	}
	if b, _ := os.ReadFile(p); string(b) != "kept" {
		t.Fatalf("path holds %q after Cleanup, want kept", b)
	}
	if err := f.Commit(); err == nil {
		t.Fatal("Commit after Cleanup succeeded")
	}
}

func TestCreateInMissingDirectory(t *testing.T) {
	_, err := Create(filepath.Join(t.TempDir(), "no", "such"), 0o600)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Create in a missing directory: %v, want ErrNotExist", err)
	}
}

func TestChown(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "owned")
	f, err := Create(p, 0o400)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Cleanup()
	// Our own ids need no privilege, and the owner is set before the file appears.
	if err := f.Chown(os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the path exists before Commit: %v", err)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || fi.Mode().Perm() != 0o400 {
		t.Fatalf("owner %d mode %v, want %d 0400", st.Uid, fi.Mode().Perm(), os.Getuid())
	}
}

// TestConcurrentWritersNeverTear has writers replace one path with contents of their own while
// a reader checks that every read is one whole content.
func TestConcurrentWritersNeverTear(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "shared")
	const writers, rounds = 4, 50
	contents := make([][]byte, writers)
	for i := range contents {
		// Bigger than a page, so that a torn write would show.
		contents[i] = bytes.Repeat([]byte{byte('a' + i)}, 64<<10)
	}
	if err := WriteFile(p, contents[0], 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var torn error
	var rwg sync.WaitGroup
	rwg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			b, err := os.ReadFile(p)
			if err != nil {
				torn = fmt.Errorf("read: %w", err)
				return
			}
			if !slices.ContainsFunc(contents, func(c []byte) bool { return bytes.Equal(b, c) }) {
				torn = fmt.Errorf("read %d bytes that are no writer's whole content", len(b))
				return
			}
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, writers*rounds)
	for i := range writers {
		wg.Go(func() {
			for range rounds {
				if err := WriteFile(p, contents[i], 0o600); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(done)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if torn != nil {
		t.Fatal(torn)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"shared"}) {
		t.Fatalf("directory holds %q, want only shared", got)
	}
}

func TestLinkReplaces(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "node")
	p := filepath.Join(dir, "worker")
	for _, f := range []string{node, p} {
		if err := os.WriteFile(f, []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Link(node, p); err != nil {
		t.Fatal(err)
	}
	a, err := os.Stat(node)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(a, b) {
		t.Fatal("the path is not a link of the target")
	}
	if got := names(t, dir); !slices.Equal(got, []string{"node", "worker"}) {
		t.Fatalf("directory holds %q, want node and worker", got)
	}
	if err := Link(filepath.Join(dir, "missing"), p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("link of a missing file: %v, want ErrNotExist", err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"node", "worker"}) {
		t.Fatalf("directory holds %q after a failed link, want node and worker", got)
	}
}
