package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stormdock/stormdock/isolation"
)

// A worker's log is LOGDIR/ID.log, with the older part ID.log.1 once capLog rotated it.
// When the worker starts again, both move to ID.previous.log and ID.previous.log.1 (the run
// before replaced), so that the output of a run that crashed can be read after the restart:
// a worker's logs take at most four times its cap.

// previousPath is where a log goes when its worker starts again.
func previousPath(logPath string) string {
	return logPath[:len(logPath)-len(".log")] + ".previous.log"
}

// rotatePrevious keeps the log of the run that ended as the previous one.
func rotatePrevious(logPath string) error {
	fi, err := os.Stat(logPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		if _, err := os.Stat(logPath + ".1"); errors.Is(err, os.ErrNotExist) {
			return nil // a run that wrote nothing does not replace the previous one
		}
	}
	prev := previousPath(logPath)
	if err := os.Rename(logPath+".1", prev+".1"); errors.Is(err, os.ErrNotExist) {
		if err := os.Remove(prev + ".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else if err != nil {
		return err
	}
	return os.Rename(logPath, prev)
}

// logPath is where the worker's log is: as its state says, or in the log directory.
func (d *Driver) logPath(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[id]; w != nil && w.st.LogPath != "" {
		return w.st.LogPath
	}
	return filepath.Join(d.cfg.LogDir, id+".log")
}

// Logs implements isolation.LogReader.
func (d *Driver) Logs(ctx context.Context, id string, opts isolation.LogOptions) (io.ReadCloser, error) {
	if err := isolation.ValidateID(id); err != nil {
		return nil, err
	}
	p := d.logPath(id)
	if opts.Previous {
		p = previousPath(p)
		opts.Follow = false
	}
	files := []string{p + ".1", p}
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		if opts.Previous {
			return nil, fmt.Errorf("%w: worker %s has no run before its last restart on this node", isolation.ErrNoLogs, id)
		}
		if !opts.Follow {
			return nil, fmt.Errorf("%w: worker %s has written no log on this node", isolation.ErrNoLogs, id)
		}
	}
	// A read that does not follow ends where the files end now, and its tail is counted back
	// from there: a worker writing on while the reader counts or copies would otherwise make
	// a tail of n lines longer than n (the cgroup v2 VM saw 3 lines for a tail of 2).
	var ends []int64
	if !opts.Follow {
		ends = make([]int64, len(files))
		for i, f := range files {
			ends[i] = -1
			if st, err := os.Stat(f); err == nil {
				ends[i] = st.Size()
			}
		}
	}
	fi, off := 0, int64(0)
	if opts.Tail >= 0 {
		var err error
		if fi, off, err = tailStart(files, opts.Tail, ends); err != nil {
			return nil, err
		}
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		if opts.Follow {
			pw.CloseWithError(follow(ctx, pw, files, fi, off))
			return
		}
		pw.CloseWithError(copyFrom(ctx, pw, files, fi, off, ends))
	}()
	return &cancelReader{ReadCloser: pr, cancel: cancel}, nil
}

type cancelReader struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (r *cancelReader) Close() error {
	r.cancel()
	return r.ReadCloser.Close()
}

// tailStart finds where the last n lines of the files, read one after the other, begin: the
// index of a file and an offset in it. A last line without its newline counts as a line.
// The files are taken to end at ends (nil: where they end now; below 0: missing).
func tailStart(files []string, n int, ends []int64) (int, int64, error) {
	if n == 0 {
		if ends != nil {
			return len(files) - 1, max(ends[len(files)-1], 0), nil
		}
		last := files[len(files)-1]
		st, err := os.Stat(last)
		if err != nil {
			return len(files) - 1, 0, nil
		}
		return len(files) - 1, st.Size(), nil
	}
	buf := make([]byte, 64<<10)
	seen := 0
	trailing := true // the very last byte, if a newline, ends the last line: not counted
	for i := len(files) - 1; i >= 0; i-- {
		f, err := os.Open(files[i])
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return 0, 0, err
		}
		end := st.Size()
		if ends != nil {
			end = min(end, ends[i]) // a file missing then (-1) is read as empty
		}
		for end > 0 {
			start := max(end-int64(len(buf)), 0)
			chunk := buf[:end-start]
			if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
				f.Close()
				return 0, 0, err
			}
			for j := len(chunk) - 1; j >= 0; j-- {
				if chunk[j] != '\n' {
					trailing = false
					continue
				}
				if trailing {
					trailing = false
					continue
				}
				if seen++; seen == n {
					f.Close()
					return i, start + int64(j) + 1, nil
				}
			}
			end = start
		}
		f.Close()
	}
	return 0, 0, nil
}

// copyFrom writes the files from file i at offset off to ends (nil: their current ends; an
// end below 0: a file that was missing).
func copyFrom(ctx context.Context, w io.Writer, files []string, i int, off int64, ends []int64) error {
	for ; i < len(files); i++ {
		n := int64(1 << 62)
		if ends != nil {
			if ends[i] < 0 {
				off = 0
				continue
			}
			n = max(ends[i]-off, 0)
		}
		f, err := os.Open(files[i])
		if errors.Is(err, os.ErrNotExist) {
			off = 0
			continue
		}
		if err != nil {
			return err
		}
		_, err = io.Copy(w, io.NewSectionReader(f, off, n))
		f.Close()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		off = 0
	}
	return nil
}

// follow writes the files from file i at offset off, then what the worker appends to the
// last one. The last is copied and then followed through one descriptor, from where the copy
// ended: a line written between the copy and the follow is neither lost nor sent twice (a
// follow that began at the file's end then lost it, and the driver suite waited in vain for
// a worker's first line in the cgroup v2 VM).
func follow(ctx context.Context, w io.Writer, files []string, i int, off int64) error {
	live := files[len(files)-1]
	if i < len(files)-1 {
		if err := copyFrom(ctx, w, files[:len(files)-1], i, off, nil); err != nil {
			return err
		}
		off = 0
	}
	f, err := os.Open(live)
	if errors.Is(err, os.ErrNotExist) {
		return followFile(ctx, w, live, nil, 0) // the worker has not written yet
	}
	if err != nil {
		return err
	}
	n, err := io.Copy(w, io.NewSectionReader(f, off, 1<<62))
	if err != nil {
		f.Close()
		return err
	}
	return followFile(ctx, w, live, f, off+n)
}

// followPoll is how often a followed log is checked for what the worker wrote.
const followPoll = 100 * time.Millisecond

// followFile writes what is appended to path until ctx is done: from offset from of start,
// path opened by the caller (which followFile closes), or with start nil (path did not
// exist) from the start of path once it does. A restart of the worker moves the file away (rotatePrevious): the rest of the old one
// is written, then the new one from its start. When capLog truncates the file, what was
// written after the last read is found again in path.1, after the last bytes sent.
func followFile(ctx context.Context, w io.Writer, path string, start *os.File, from int64) error {
	var f *os.File
	var ino uint64
	var off int64
	var last []byte // the newest bytes sent, to find our place in path.1 after a rotation
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	send := func(b []byte) error {
		if len(b) == 0 {
			return nil
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		last = append(last, b...)
		if len(last) > 4096 {
			last = last[len(last)-4096:]
		}
		return nil
	}
	open := func() {
		nf, err := os.Open(path)
		if err != nil {
			return
		}
		st, err := nf.Stat()
		if err != nil {
			nf.Close()
			return
		}
		if f != nil {
			f.Close()
		}
		f, ino, off = nf, st.Sys().(*syscall.Stat_t).Ino, 0
	}
	if start != nil {
		st, err := start.Stat()
		if err != nil {
			start.Close()
			return err
		}
		f, ino, off = start, st.Sys().(*syscall.Stat_t).Ino, from
		// What the caller sent before from is where a rotation finds our place again.
		last = make([]byte, min(from, 4096))
		if _, err := f.ReadAt(last, from-int64(len(last))); err != nil {
			last = nil
		}
	} else {
		open()
	}
	buf := make([]byte, 64<<10)
	readMore := func() error {
		for f != nil {
			n, err := f.ReadAt(buf, off)
			if n > 0 {
				off += int64(n)
				if err := send(buf[:n]); err != nil {
					return err
				}
			}
			if err != nil || n < len(buf) {
				return nil
			}
		}
		return nil
	}
	t := time.NewTicker(followPoll)
	defer t.Stop()
	for {
		if err := readMore(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		st, err := os.Stat(path)
		switch {
		case err != nil:
			continue // between a rotation and the new run's file
		case f == nil || st.Sys().(*syscall.Stat_t).Ino != ino:
			if err := readMore(); err != nil { // the end of the run that ended
				return err
			}
			open()
		case st.Size() < off || !continues(f, off, last):
			// capLog moved the file's content to path.1 and truncated it (and the worker
			// may have written past our offset since: the bytes before it tell).
			if old, err := os.ReadFile(path + ".1"); err == nil {
				// Our place is after the last bytes sent; when they are not in path.1 at
				// all, everything in it is new (and what was before it is lost).
				rest := old
				tail := last[max(len(last)-64, 0):]
				if i := bytes.LastIndex(old, tail); len(tail) > 0 && i >= 0 {
					rest = old[i+len(tail):]
				}
				if err := send(rest); err != nil {
					return err
				}
			}
			off = 0
		}
	}
}

// continues reports whether the file still holds, just before off, the last bytes sent
// from it: a truncated file that grew past off again does not.
func continues(f *os.File, off int64, last []byte) bool {
	k := int64(min(64, len(last)))
	if f == nil || k == 0 || off < k {
		return true
	}
	b := make([]byte, k)
	if _, err := f.ReadAt(b, off-k); err != nil {
		return false
	}
	return bytes.Equal(b, last[int64(len(last))-k:])
}

// Discard implements isolation.Discarder: the previous run's log goes; the last run's stays
// where it is, as before there were previous runs.
func (d *Driver) Discard(_ context.Context, id string) error {
	if err := isolation.ValidateID(id); err != nil {
		return err
	}
	prev := previousPath(d.logPath(id))
	for _, p := range []string{prev, prev + ".1"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return nil
}
