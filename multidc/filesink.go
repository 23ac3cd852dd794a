package multidc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// FsyncPolicy says when a FileSink forces its writes to disk.
type FsyncPolicy string

const (
	// FsyncCheckpoint (the default) syncs in Sync, which the router calls before every
	// checkpoint: at most one checkpoint interval of output (100 ms by default) sits in the
	// page cache, and the checkpoint never covers data that is not on disk.
	FsyncCheckpoint FsyncPolicy = "checkpoint"
	// FsyncAlways syncs after every batch: nothing written is lost to a power failure, at
	// the cost of one fsync per batch.
	FsyncAlways FsyncPolicy = "always"
	// FsyncNever leaves it to the kernel. A killed router loses nothing (the data is in the
	// page cache), but a power failure may cut the file below the checkpoint, and then the
	// records between the two are missing from the file.
	FsyncNever FsyncPolicy = "never"
)

// FileSink appends records to a file, one JSON object per line:
//
//	{"offset":12,"link":"dc-a","record":{...the record as the link sent it...}}
//
// The file itself records what was delivered: OpenFileSink cuts off a torn last line (a
// write cut short by a crash) and reads the offset of the last complete one, which the
// router continues after. Each batch is one pwrite at the end of the complete lines; a
// failed write is truncated away again. The file is flock'ed, so two routers cannot write it
// at once.
type FileSink struct {
	path   string
	policy FsyncPolicy

	mu     sync.Mutex
	f      *os.File
	size   int64 // end of the last complete line
	last   int64 // offset of the last line, -1 for an empty file
	dirty  bool  // written since the last fsync
	broken error
	buf    []byte
}

// OpenFileSink opens (creating it and its directory if needed) the file at path and
// recovers its end.
func OpenFileSink(path string, policy FsyncPolicy) (*FileSink, error) {
	switch policy {
	case FsyncCheckpoint, FsyncAlways, FsyncNever:
	default:
		return nil, fmt.Errorf("multidc: file sink %s: unknown fsync policy %q (checkpoint, always or never)", path, policy)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("multidc: file sink: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("multidc: file sink: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("multidc: file sink %s: in use by another router: %w", path, err)
	}
	s := &FileSink{path: path, policy: policy, f: f, last: -1}
	if err := s.recover(); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// recover finds the last complete line, truncates whatever follows it and reads its offset.
func (s *FileSink) recover() error {
	st, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("multidc: file sink %s: %w", s.path, err)
	}
	start, end, err := lastLine(s.f, st.Size())
	if err != nil {
		return fmt.Errorf("multidc: file sink %s: %w", s.path, err)
	}
	if end < st.Size() {
		// A torn line: the write that made it never completed, so the record was never
		// delivered and will be written again.
		if err := s.f.Truncate(end); err != nil {
			return fmt.Errorf("multidc: file sink %s: cut torn line: %w", s.path, err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("multidc: file sink %s: %w", s.path, err)
		}
	}
	s.size = end
	if end == 0 {
		return nil
	}
	line := make([]byte, end-1-start)
	if _, err := s.f.ReadAt(line, start); err != nil {
		return fmt.Errorf("multidc: file sink %s: read last line: %w", s.path, err)
	}
	var v struct {
		Offset *int64 `json:"offset"`
	}
	if err := json.Unmarshal(line, &v); err != nil || v.Offset == nil || *v.Offset < 0 {
		// A complete but foreign line: refuse, rather than guess where output stands.
		return fmt.Errorf("multidc: file sink %s: last line (at byte %d) is not a router record: %.100q", s.path, start, line)
	}
	s.last = *v.Offset
	return nil
}

// lastLine returns the start and end (after its newline) of the last complete line among
// the first size bytes of f; end is 0 when there is none.
func lastLine(f *os.File, size int64) (start, end int64, err error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	end = -1
	for pos := size; pos > 0; {
		n := min(int64(chunk), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return 0, 0, fmt.Errorf("read tail: %w", err)
		}
		b := buf[:n]
		for {
			i := bytes.LastIndexByte(b, '\n')
			if i < 0 {
				break
			}
			if end < 0 {
				end = pos + int64(i) + 1
				b = b[:i]
				continue
			}
			return pos + int64(i) + 1, end, nil
		}
	}
	if end < 0 {
		return 0, 0, nil
	}
	return 0, end, nil
}

// LastOffset returns the offset of the file's last record, -1 if it has none.
func (s *FileSink) LastOffset(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, nil
}

// Write appends recs, which must be contiguous and above the file's last offset: the sink
// refuses to write an offset twice or out of order, whatever its caller does. (A gap above
// the last offset is allowed: it is how a checkpoint ahead of the file shows, see Router.)
func (s *FileSink) Write(_ context.Context, recs []Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return s.broken
	}
	if len(recs) == 0 {
		return nil
	}
	prev := s.last
	for i, r := range recs {
		if r.Offset <= prev || (i > 0 && r.Offset != prev+1) {
			return fmt.Errorf("multidc: file sink %s: offset %d after %d: out of order or repeated", s.path, r.Offset, prev)
		}
		prev = r.Offset
	}
	b := s.buf[:0]
	for _, r := range recs {
		b = appendLine(b, r)
	}
	s.buf = b
	n, err := s.f.WriteAt(b, s.size)
	if err != nil {
		if terr := s.f.Truncate(s.size); terr != nil {
			s.broken = fmt.Errorf("%w: file %s: write failed (%v) and could not be undone: %v", ErrSinkBroken, s.path, err, terr)
			return s.broken
		}
		return fmt.Errorf("multidc: file sink %s: write: %w", s.path, err)
	}
	s.size += int64(n)
	s.last = recs[len(recs)-1].Offset
	s.dirty = true
	if s.policy == FsyncAlways {
		return s.syncLocked()
	}
	return nil
}

// Sync fsyncs the file unless the policy is FsyncNever.
func (s *FileSink) Sync(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.policy == FsyncNever {
		return nil
	}
	return s.syncLocked()
}

func (s *FileSink) syncLocked() error {
	if !s.dirty {
		return nil
	}
	if err := s.f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty pages: what the file
		// holds is unknown until it is reopened.
		s.broken = fmt.Errorf("%w: file %s: fsync: %v", ErrSinkBroken, s.path, err)
		return s.broken
	}
	s.dirty = false
	return nil
}

// Close syncs (per the policy) and closes the file.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.policy != FsyncNever && s.broken == nil {
		err = s.syncLocked()
	}
	return errors.Join(err, s.f.Close())
}
