package multidc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/stormdock/stormdock/cluster"
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
	// records between the two are missing from the file (and the file no longer ends the
	// way its evidence says: the router refuses it).
	FsyncNever FsyncPolicy = "never"
)

// SinkEvidence is how a router recognises a sink file it wrote: the file's identity, its
// size at the router's last durable record and a hash of the bytes before that point. A
// file only grows by the router's own appends, so any evidence the router ever left stays
// true of its file; one that does not match was replaced, rewritten or is someone else's.
type SinkEvidence struct {
	// Dev is the device the router saw the file on, for the operator: a shared filesystem
	// has another on each host, so recognition does not rest on it.
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
	// Born is the file's birth time (statx btime, ns since the epoch) where the filesystem
	// keeps one: inode numbers are reused, so a file put where the router's was removed
	// may have its number.
	Born int64 `json:"born,omitempty"`
	Size int64 `json:"size"`
	// Tail is the hex SHA-256 of the tailBytes bytes (or fewer, the whole file) before Size.
	Tail string `json:"tail"`
	// Last is the offset of the record that ends at Size, -1 for none.
	Last int64 `json:"last"`
}

// tailBytes is how much of a sink file's end its evidence hashes: more than one record line
// usually is, so a rewritten last record shows.
const tailBytes = 4096

// sidecarName is where a FileSink keeps its evidence next to the file, for routers whose
// store does not outlive them (mem://): ".NAME.router". The directory is the tenant's sink
// directory, writable by the router's user alone.
func sidecarName(name string) string { return "." + name + ".router" }

// FileSink appends records to a file, one JSON object per line:
//
//	{"offset":12,"link":"dc-a","record":{...the record as the link sent it...}}
//
// The file records what was delivered: OpenFileSink recognises the file as its own by its
// evidence (SinkEvidence, in the router's record and next to the file), cuts off a torn
// last line (a write cut short by a crash) after the last durable record, and reads the
// offset of the last complete one, which the router continues after. A file that exists
// without matching evidence is refused and left untouched. Each batch is one pwrite at the
// end of the complete lines; a failed write is truncated away again. The file is flock'ed,
// so two routers cannot write it at once.
//
// The file is confined: it lies below SINKDIR/<tenant>, every component is opened with
// openat2(2) beneath that directory without following symlinks (the file itself
// included), and only missing directories below SINKDIR/<tenant> are made.
type FileSink struct {
	path   string
	policy FsyncPolicy
	name   string // the file's name in dir

	mu       sync.Mutex
	dir      *os.File // the file's directory, for the sidecar
	f        *os.File
	size     int64 // end of the last complete line
	last     int64 // offset of the last line, -1 for an empty file
	dirty    bool  // written since the last fsync
	broken   error
	buf      []byte
	dev, ino uint64
	born     int64
	ev       *SinkEvidence // as last made durable
}

// FileSinkOptions tune OpenFileSink.
type FileSinkOptions struct {
	Policy FsyncPolicy // default FsyncCheckpoint
	// Evidence is what the router's record says of the file (nil: nothing); the sidecar's
	// is tried too.
	Evidence *SinkEvidence
}

// errNoOpenat2 explains a kernel without openat2(2).
var errNoOpenat2 = errors.New("file sinks need openat2(2) (Linux 5.6 or later) to open files without following symlinks: run the router on a newer kernel or use an http sink")

const resolveConfined = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openat2 opens path beneath dirfd, refusing symlinks and magic links at every component.
func openat2(dirfd int, path string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Mode: uint64(mode), Resolve: resolveConfined}
	for range 100 {
		fd, err := unix.Openat2(dirfd, path, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.EAGAIN):
			// EAGAIN: a rename raced the lookup; the kernel asks to look again.
			continue
		case errors.Is(err, unix.ENOSYS):
			return -1, errNoOpenat2
		}
		return -1, err
	}
	return -1, unix.EAGAIN
}

// openatDir opens the directory name beneath dirfd; a symlink there is ELOOP (O_NOFOLLOW
// with O_DIRECTORY says ENOTDIR of it).
func openatDir(dirfd int, name string) (int, error) {
	fd, err := openat2(dirfd, name, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, unix.ELOOP
		}
	}
	return fd, err
}

// confinedErr words an openat2 error for the file sink's path.
func confinedErr(path string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("file sink %s: a symlink on the way (or the file itself is one): file sinks never follow symlinks: name a real file", path)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("file sink %s: leaves its sink directory (.. or a mount crossing): name a file below it", path)
	}
	return fmt.Errorf("file sink %s: %w", path, err)
}

// OpenFileSink opens the file sink at path, which must lie strictly below
// SINKDIR/<tenant>/ (cluster.CheckSinkPath): an existing file only when its evidence says
// this router wrote it, else a new file (O_CREAT|O_EXCL), making the missing directories
// below SINKDIR/<tenant> (mode 0750).
func OpenFileSink(sinkDir, tenant, path string, opts FileSinkOptions) (*FileSink, error) {
	policy := opts.Policy
	if policy == "" {
		policy = FsyncCheckpoint
	}
	switch policy {
	case FsyncCheckpoint, FsyncAlways, FsyncNever:
	default:
		return nil, fmt.Errorf("multidc: file sink %s: unknown fsync policy %q (checkpoint, always or never)", path, policy)
	}
	if err := cluster.CheckSinkPath(sinkDir, tenant, path); err != nil {
		return nil, fmt.Errorf("multidc: %w", err)
	}
	base := cluster.TenantSinkDir(filepath.Clean(sinkDir), tenant)
	rel, err := filepath.Rel(base, path)
	if err != nil {
		return nil, fmt.Errorf("multidc: file sink %s: %w", path, err)
	}
	comps := strings.Split(rel, "/")
	// SINKDIR is the operator's; from there on nothing is followed.
	root, err := unix.Open(filepath.Clean(sinkDir), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("multidc: file sink %s: sink dir %s: %w", path, sinkDir, err)
	}
	cur, err := openatDir(root, tenant)
	unix.Close(root)
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("multidc: file sink %s: the tenant's sink directory %s does not exist (the agent makes it before it starts the router)", path, base)
	}
	if err != nil {
		return nil, fmt.Errorf("multidc: %w", confinedErr(path, err))
	}
	for _, c := range comps[:len(comps)-1] {
		next, err := openatDir(cur, c)
		if errors.Is(err, unix.ENOENT) {
			// mkdirat does not follow a symlink in the last place; whatever it finds
			// there, the openat2 after it refuses anything but a real directory.
			if merr := unix.Mkdirat(cur, c, 0o750); merr != nil && !errors.Is(merr, unix.EEXIST) {
				unix.Close(cur)
				return nil, fmt.Errorf("multidc: file sink %s: make directory %s: %w", path, c, merr)
			}
			next, err = openatDir(cur, c)
		}
		unix.Close(cur)
		if err != nil {
			return nil, fmt.Errorf("multidc: %w", confinedErr(path, err))
		}
		cur = next
	}
	dir := os.NewFile(uintptr(cur), filepath.Dir(path))
	name := comps[len(comps)-1]
	created := false
	fd, err := openat2(cur, name, unix.O_RDWR, 0)
	if errors.Is(err, unix.ENOENT) {
		fd, err = openat2(cur, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o640)
		created = err == nil
	}
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("multidc: %w", confinedErr(path, err))
	}
	f := os.NewFile(uintptr(fd), path)
	s := &FileSink{path: path, policy: policy, name: name, dir: dir, f: f, last: -1}
	if err := s.open(created, opts.Evidence); err != nil {
		f.Close()
		dir.Close()
		return nil, err
	}
	return s, nil
}

// open checks the file opened and recovers its end.
func (s *FileSink) open(created bool, ev *SinkEvidence) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.f.Fd()), &st); err != nil {
		return fmt.Errorf("multidc: file sink %s: %w", s.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: file sink %s is not a regular file: name another file", ErrSinkBroken, s.path)
	}
	if st.Nlink != 1 {
		// A hard link to a file elsewhere (someone else's) is not this router's file.
		return fmt.Errorf("%w: sink file %s has %d hard links and was not written by this router: move it away or name another file", ErrSinkBroken, s.path, st.Nlink)
	}
	if err := unix.Flock(int(s.f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("multidc: file sink %s: in use by another router: %w", s.path, err)
	}
	s.dev, s.ino = st.Dev, st.Ino
	var sx unix.Statx_t
	if err := unix.Statx(int(s.f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_BTIME, &sx); err == nil && sx.Mask&unix.STATX_BTIME != 0 {
		s.born = sx.Btime.Sec*1e9 + int64(sx.Btime.Nsec)
	}
	if created {
		// The evidence of the empty file, at once: a router that dies before its first
		// checkpoint finds its file its own.
		return s.saveEvidence()
	}
	cands := []*SinkEvidence{ev}
	if side, err := s.readSidecar(); err == nil {
		cands = append(cands, side)
	}
	var matched *SinkEvidence
	for _, c := range cands {
		if c != nil && s.matches(c, st.Size) {
			if matched == nil || c.Size > matched.Size {
				matched = c
			}
		}
	}
	if matched == nil {
		return fmt.Errorf("%w: sink file %s exists and was not written by this router (or was changed since its last write): move it away or name another file", ErrSinkBroken, s.path)
	}
	return s.recover(matched, st.Size)
}

// matches reports whether ev is true of the open file of size size.
func (s *FileSink) matches(ev *SinkEvidence, size int64) bool {
	// Dev is not compared: the standby router on another host sees a shared filesystem
	// under another device number (NFS's are per mount); the inode number, birth time and
	// tail are the file's wherever it is mounted.
	if ev.Ino != s.ino || ev.Born != s.born || ev.Size < 0 || ev.Size > size {
		return false
	}
	tail, err := s.tailHash(ev.Size)
	return err == nil && tail == ev.Tail
}

// tailHash hashes the tailBytes bytes before end.
func (s *FileSink) tailHash(end int64) (string, error) {
	start := max(0, end-tailBytes)
	b := make([]byte, end-start)
	if _, err := s.f.ReadAt(b, start); err != nil {
		return "", fmt.Errorf("read tail: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// recover continues after the evidence ev: the complete lines after ev.Size are the
// router's, written after its last durable record and before a crash; a torn line after
// them is cut, and nothing before ev.Size is ever touched.
func (s *FileSink) recover(ev *SinkEvidence, size int64) error {
	start, end, err := lastLine(s.f, size)
	if err != nil {
		return fmt.Errorf("multidc: file sink %s: %w", s.path, err)
	}
	if end <= ev.Size {
		// No complete line after the evidence: it is the end.
		start, end = -1, ev.Size
	}
	var line []byte
	if start >= 0 {
		line = make([]byte, end-1-start)
		if _, err := s.f.ReadAt(line, start); err != nil {
			return fmt.Errorf("multidc: file sink %s: read last line: %w", s.path, err)
		}
		var v struct {
			Offset *int64 `json:"offset"`
		}
		if err := json.Unmarshal(line, &v); err != nil || v.Offset == nil || *v.Offset <= ev.Last {
			// A complete line after the router's last record that is not one of its own.
			return fmt.Errorf("%w: sink file %s was changed after this router's last write (byte %d on: %.60q): move it away or name another file",
				ErrSinkBroken, s.path, ev.Size, line)
		}
		s.last = *v.Offset
	} else {
		s.last = ev.Last
	}
	if end < size {
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
	s.ev = ev
	if end != ev.Size {
		return s.saveEvidence()
	}
	return nil
}

// readSidecar reads the evidence kept next to the file.
func (s *FileSink) readSidecar() (*SinkEvidence, error) {
	fd, err := openat2(int(s.dir.Fd()), sidecarName(s.name), unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), sidecarName(s.name))
	defer f.Close()
	var ev SinkEvidence
	b := make([]byte, 4096)
	n, _ := f.Read(b)
	if err := json.Unmarshal(b[:n], &ev); err != nil {
		return nil, err
	}
	return &ev, nil
}

// evidence is the evidence of the file as it stands (size and last as written).
func (s *FileSink) evidence() (*SinkEvidence, error) {
	tail, err := s.tailHash(s.size)
	if err != nil {
		return nil, err
	}
	return &SinkEvidence{Dev: s.dev, Ino: s.ino, Born: s.born, Size: s.size, Tail: tail, Last: s.last}, nil
}

// saveEvidence writes the evidence of what the file holds now to the sidecar (atomically:
// a temporary file renamed over it) and keeps it for Evidence. Call it after the file's
// data is durable: evidence must never claim bytes a crash can take away.
func (s *FileSink) saveEvidence() error {
	ev, err := s.evidence()
	if err != nil {
		return fmt.Errorf("multidc: file sink %s: evidence: %w", s.path, err)
	}
	b, _ := json.Marshal(ev)
	dfd := int(s.dir.Fd())
	tmp := sidecarName(s.name) + ".tmp"
	fd, err := openat2(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("multidc: file sink %s: evidence: %w", s.path, confinedErr(s.path, err))
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(b)
	if werr == nil && s.policy != FsyncNever {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, sidecarName(s.name))
	}
	if werr == nil && s.policy != FsyncNever {
		werr = unix.Fsync(dfd)
	}
	if werr != nil {
		return fmt.Errorf("multidc: file sink %s: write evidence: %w", s.path, werr)
	}
	s.ev = ev
	return nil
}

// Evidence is the evidence of the file as last made durable (see SinkEvidence): the router
// keeps it in its record.
func (s *FileSink) Evidence() *SinkEvidence {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ev == nil {
		return nil
	}
	ev := *s.ev
	return &ev
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

// Sync fsyncs the file unless the policy is FsyncNever, and then records its evidence.
func (s *FileSink) Sync(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return s.broken
	}
	if s.policy == FsyncNever {
		if s.dirty {
			s.dirty = false
			return s.saveEvidence()
		}
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
	return s.saveEvidence()
}

// Close syncs (per the policy) and closes the file.
func (s *FileSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.broken == nil {
		if s.policy == FsyncNever {
			if s.dirty {
				err = s.saveEvidence()
			}
		} else {
			err = s.syncLocked()
		}
	}
	return errors.Join(err, s.f.Close(), s.dir.Close())
}
