package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of size bytes on a new directory and returns its path: a disk that
// really fills up (ENOSPC from the kernel, not from a fake writer). It is unmounted when the
// test ends. It needs root: without it the test fails under CI and skips elsewhere.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	Root(t)
	dir, err := os.MkdirTemp("", "stormdock-tmpfs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+strconv.FormatInt(size, 10)+",mode=0755"); err != nil {
		os.Remove(dir)
		Missing(t, "mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		// MNT_DETACH: a file a test left open (a store's lock) does not keep it mounted.
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		os.Remove(dir)
	})
	return dir
}

// FillUp writes a filler file into dir until its file system has no space left, and returns
// the filler's path: removing it (or truncating it) frees the space again.
func FillUp(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, ".filler")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for _, n := range []int{4096, 1} { // whole pages, then the last bytes
		for {
			if _, err := f.Write(buf[:n]); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatal(fmt.Errorf("fill %s: %w", dir, err))
				}
				break
			}
		}
	}
	return p
}
