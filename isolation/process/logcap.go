package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/isolation"
)

// openLog opens a worker's log for appending. The worker writes to it directly, not through a
// pipe to the agent: a pipe would break (SIGPIPE) when the agent restarts, while the file
// outlives the agent with the worker.
//
// With a user (the worker's), the file is that user's, 0600: what a worker writes (its
// errors, its environment if it prints it) is for its own tenant, through the agent, alone.
// The worker writes through the descriptor it is given either way.
func openLog(path string, u *isolation.User) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open worker log: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("open worker log: %w", err)
	}
	if u != nil {
		if err := f.Chown(int(u.UID), int(u.GID)); err != nil && !errors.Is(err, os.ErrPermission) {
			f.Close()
			return nil, fmt.Errorf("open worker log: %w", err)
		}
	}
	return f, nil
}

// capLog keeps a log near max bytes: once it is larger, its newest max bytes move to path.1
// (replacing the previous one) and path is truncated. The worker holds path with O_APPEND, so
// its next write lands at the new end of file. What it writes while the log is copied is
// copied too; for the last copy and the truncation it is paused (p, the worker's cgroup
// freezer), so nothing it writes is lost. Without a freezer, output written in the instant
// between the last copy and the truncation is lost, as with logrotate's copytruncate.
func capLog(path string, max int64, p pauser) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() <= max {
		return err
	}
	tmp := path + ".1.tmp"
	old, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		old.Close()
		os.Remove(tmp)
		return fmt.Errorf("rotate %s: %w", path, err)
	}
	// Keep the newest max bytes of the old content, plus whatever the worker writes while
	// they are copied: the loop ends when a stat finds nothing new.
	copied := fi.Size() - max
	catchUp := func() error {
		for {
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			if fi.Size() <= copied {
				return nil
			}
			if _, err := io.Copy(old, io.NewSectionReader(f, copied, fi.Size()-copied)); err != nil {
				return err
			}
			copied = fi.Size()
		}
	}
	if err := catchUp(); err != nil {
		return fail(err)
	}
	// A worker that writes fast, or one the machine starved for a moment, writes again
	// between the last stat and the truncation: paused, it cannot.
	if p != nil {
		ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
		err := p.pause(ctx)
		cancel()
		if err == nil {
			defer p.resume()
		}
	}
	// path.1 is in place before the truncation: a follower that sees the file shrink reads
	// the rest there (followFile). The copy goes on through the open descriptor, so the
	// unpaused gap is one stat to one truncate.
	if err := os.Rename(tmp, path+".1"); err != nil {
		old.Close()
		os.Remove(tmp)
		return fmt.Errorf("rotate %s: %w", path, err)
	}
	if err := catchUp(); err != nil {
		old.Close()
		return fmt.Errorf("rotate %s: %w", path, err)
	}
	if err := f.Truncate(0); err != nil {
		old.Close()
		return fmt.Errorf("rotate %s: %w", path, err)
	}
	if err := old.Close(); err != nil {
		return fmt.Errorf("rotate %s: %w", path, err)
	}
	return nil
}

// pauseTimeout bounds how long capLog waits for a worker to freeze: a process in an
// uninterruptible sleep holds the freezer up, and the log is then rotated unpaused.
const pauseTimeout = time.Second
