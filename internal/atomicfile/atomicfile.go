// Package atomicfile replaces files so that a reader, or a crash, finds the old content or the
// new and never part of either: a temporary file of its own beside the target, synced, renamed
// over it, and the directory synced so that the rename itself survives a crash.
package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// WriteFile replaces path with data, mode perm (exactly: the umask does not apply).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit()
}

// File is a replacement of a file being written. Nothing is visible at its path until
// Commit; Cleanup drops it. Callers defer Cleanup, which is a no-op after Commit.
type File struct {
	f    *os.File
	path string
	done bool
}

// Create starts a replacement of path, mode perm, in a temporary file of its own in path's
// directory: writers of the same path at the same moment never write into each other's.
func Create(path string, perm fs.FileMode) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("replace %s: %w", path, err)
	}
	// CreateTemp makes it 0600 whatever was asked; the mode is set on the file itself so that
	// the umask does not narrow it.
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("replace %s: %w", path, err)
	}
	return &File{f: f, path: path}, nil
}

// Write writes to the replacement.
func (f *File) Write(b []byte) (int, error) {
	n, err := f.f.Write(b)
	if err != nil {
		return n, fmt.Errorf("replace %s: %w", f.path, err)
	}
	return n, nil
}

// Chown gives the replacement its owner before it appears at its path.
func (f *File) Chown(uid, gid int) error {
	if err := f.f.Chown(uid, gid); err != nil {
		return fmt.Errorf("replace %s: %w", f.path, err)
	}
	return nil
}

// Commit syncs the replacement, renames it over the path and syncs the directory. On an
// error the path keeps what it had, and the temporary file is gone once Cleanup runs.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("replace %s: already committed or cleaned up", f.path)
	}
	err := f.f.Sync()
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.f.Name(), f.path)
	}
	if err != nil {
		f.remove()
		return fmt.Errorf("replace %s: %w", f.path, err)
	}
	f.done = true
	if err := syncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("replace %s: %w", f.path, err)
	}
	return nil
}

// Cleanup drops a replacement that was not committed.
func (f *File) Cleanup() {
	if !f.done {
		f.f.Close()
		f.remove()
	}
}

func (f *File) remove() {
	f.done = true
	_ = os.Remove(f.f.Name())
}

// Link makes path a hard link of oldname, replacing what path was: a reader of path never
// finds it missing.
func Link(oldname, path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	for range 100 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		tmp := filepath.Join(dir, "."+base+".tmp-"+hex.EncodeToString(b[:]))
		err := os.Link(oldname, tmp)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("link %s to %s: %w", path, oldname, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("link %s to %s: %w", path, oldname, err)
		}
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("link %s to %s: %w", path, oldname, err)
		}
		return nil
	}
	return fmt.Errorf("link %s to %s: no free temporary name", path, oldname)
}

// syncDir makes the directory's entries durable. Filesystems that cannot sync a directory
// say EINVAL (or ENOTSUP); their renames are as durable as they get.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	err = d.Sync()
	d.Close()
	if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
		return fmt.Errorf("sync directory: %w", err)
	}
	return nil
}
