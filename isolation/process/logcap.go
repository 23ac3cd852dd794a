package process

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// openLog opens a worker's log for appending. The worker writes to it directly, not through a
// pipe to the agent: a pipe would break (SIGPIPE) when the agent restarts, while the file
// outlives the agent with the worker.
func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open worker log: %w", err)
	}
	return f, nil
}

// capLog keeps a log near max bytes: once it is larger, its newest max bytes move to path.1
// (replacing the previous one) and path is truncated. The worker holds path with O_APPEND, so
// its next write lands at the new end of file. Output written in the instant between the last
// copy and the truncation is lost, as with logrotate's copytruncate; the cap holds to within
// what the worker writes between two checks.
func capLog(path string, max int64) error {
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
	old, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	// Keep the newest max bytes of the old content, plus whatever the worker writes while
	// they are copied: the loop ends when a stat finds nothing new, which leaves only the gap
	// between that stat and the truncation to lose.
	copied := fi.Size() - max
	for {
		fi, err := f.Stat()
		if err != nil {
			old.Close()
			os.Remove(tmp)
			return err
		}
		if fi.Size() <= copied {
			break
		}
		if _, err := io.Copy(old, io.NewSectionReader(f, copied, fi.Size()-copied)); err != nil {
			old.Close()
			os.Remove(tmp)
			return fmt.Errorf("rotate %s: %w", path, err)
		}
		copied = fi.Size()
	}
	if err := old.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path+".1"); err != nil {
		return err
	}
	return f.Truncate(0)
}
