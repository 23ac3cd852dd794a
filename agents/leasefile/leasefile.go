// Package leasefile is the lease file that fences a node's workers: the node's keeper renews
// it with a stamp on the machine's boot clock, and each worker's launcher stops its worker
// once that stamp is older than the lease's ttl, or once the lease is of another generation.
package leasefile

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Why the boot clock (CLOCK_BOOTTIME) and not the wall clock or CLOCK_MONOTONIC:
//
//   - the wall clock steps: set back, it makes a lease that stopped being renewed look fresh
//     for as long as the step; set forward (NTP after a long drift, a VM resumed and synced),
//     it makes every lease on the node look lapsed at once;
//   - CLOCK_MONOTONIC never steps, but it stops while the machine is suspended (a laptop's
//     sleep, a VM saved and resumed): after a long suspend a lease would look as fresh as when
//     the machine stopped, while the store expired the node's session long ago and the
//     masters moved its workers;
//   - CLOCK_BOOTTIME is CLOCK_MONOTONIC plus the time spent suspended: it never steps back,
//     and a resumed machine sees every lease it had as old as it really is, lapsed if the
//     session it stood for has likely expired. It is one clock for the whole machine: the
//     keeper, the agent and every launcher, containers included (they share the kernel; a
//     time namespace could offset it, and stormdock makes none), read the same value.
//
// The clock restarts at every boot: a record says which boot it belongs to, and a record of
// another boot is lapsed.

// Clock reads a boot clock: the time since the machine booted, suspend included.
type Clock func() time.Duration

// Now reads CLOCK_BOOTTIME.
func Now() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// Linux has had CLOCK_BOOTTIME since 2.6.39; nothing runs stormdock without it.
		panic(fmt.Sprintf("leasefile: clock_gettime(CLOCK_BOOTTIME): %v", err))
	}
	return time.Duration(ts.Nano())
}

// Wall converts a time of the boot clock now into wall-clock time, for people and for the
// files' modification times that older launchers read. It is an estimate (the wall clock may
// step at any moment): never compare it with anything.
func Wall(t time.Duration, now Clock) time.Time {
	return time.Now().Add(t - now())
}

// Record is what a lease file holds.
type Record struct {
	// Boot is the boot the Stamp belongs to (the kernel's boot_id, 32 hex digits).
	Boot string
	// Gen is the lease's generation: the keeper starts a new one whenever it renews a lease
	// that had lapsed, and a launcher stops its worker once the lease is not of the
	// generation it started under. So a lapse stops every worker of the node even when the
	// keeper renews the lease before a launcher looked (a machine resumed from suspend: every
	// process wakes at once).
	Gen uint64
	// Stamp is a time of the boot clock: the lease runs out at Stamp + ttl.
	Stamp time.Duration
}

// Lapsed reports whether the record is lapsed at now (a time of the boot clock) for a lease
// of ttl: its stamp is older than ttl, or it is of another boot than boot. A boot that is not
// known (boot "", or a record written where it could not be read) is not compared.
func (r Record) Lapsed(now, ttl time.Duration, boot string) bool {
	if boot != "" && r.Boot != unknownBoot && r.Boot != boot {
		return true
	}
	return now-r.Stamp > ttl
}

// Size is the length of every record: a record is rewritten in place, never grown, so that
// renewing a lease needs no free space on a full disk.
const Size = 96

const magic = "sdlease1"

// unknownBoot is the boot id of a record whose writer could not read its own.
const unknownBoot = "00000000000000000000000000000000"

// Errors of Parse and Read.
var (
	// ErrEmpty: the file holds no record; an older keeper renews only its modification time.
	ErrEmpty = errors.New("leasefile: no record")
	// ErrCorrupt: the file holds something else than a record.
	ErrCorrupt = errors.New("leasefile: not a lease record")
)

// Marshal encodes r in Size bytes:
//
//	sdlease1 BOOT GEN STAMP CRC
//
// BOOT 32 hex digits, GEN 16 hex digits, STAMP 19 decimal digits (nanoseconds), CRC the
// IEEE CRC-32 of what comes before it (8 hex digits), then spaces and a newline.
func (r Record) Marshal() []byte {
	b := make([]byte, 0, Size)
	boot := r.Boot
	if len(boot) != 32 || !isHex(boot) {
		boot = unknownBoot
	}
	b = fmt.Appendf(b, "%s %s %016x %019d", magic, boot, r.Gen, max(r.Stamp, 0))
	b = fmt.Appendf(b, " %08x", crc32.ChecksumIEEE(b))
	for len(b) < Size-1 {
		b = append(b, ' ')
	}
	return append(b, '\n')
}

// Parse decodes a record (see Marshal). Empty input is ErrEmpty; anything else that is not a
// whole, intact record is ErrCorrupt (a torn read of a record being rewritten among them).
func Parse(b []byte) (Record, error) {
	if len(b) == 0 {
		return Record{}, ErrEmpty
	}
	if len(b) != Size || b[Size-1] != '\n' {
		return Record{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	f := strings.Fields(string(b))
	if len(f) != 5 || f[0] != magic || len(f[1]) != 32 || len(f[2]) != 16 || len(f[3]) != 19 || len(f[4]) != 8 {
		return Record{}, fmt.Errorf("%w: %q", ErrCorrupt, bytes.TrimSpace(b))
	}
	body := b[:len(magic)+1+32+1+16+1+19]
	sum, err := strconv.ParseUint(f[4], 16, 32)
	if err != nil || uint32(sum) != crc32.ChecksumIEEE(body) {
		return Record{}, fmt.Errorf("%w: checksum", ErrCorrupt)
	}
	if !isHex(f[1]) {
		return Record{}, fmt.Errorf("%w: boot id %q", ErrCorrupt, f[1])
	}
	gen, err := strconv.ParseUint(f[2], 16, 64)
	if err != nil {
		return Record{}, fmt.Errorf("%w: generation %q", ErrCorrupt, f[2])
	}
	stamp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || stamp < 0 {
		return Record{}, fmt.Errorf("%w: stamp %q", ErrCorrupt, f[3])
	}
	return Record{Boot: f[1], Gen: gen, Stamp: time.Duration(stamp)}, nil
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// tornRetries is how often Read reads again a record that does not parse: the keeper
// rewrites it in place, and a read may see part of the old record and part of the new.
const tornRetries = 5

// Read reads the record of the lease file at path; see Parse for its errors.
func Read(path string) (Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	return ReadFrom(f)
}

// ReadFrom reads the record of an open lease file (from its start).
func ReadFrom(f io.ReaderAt) (Record, error) {
	buf := make([]byte, Size+1)
	var err error
	for range tornRetries {
		var n int
		n, err = f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return Record{}, err
		}
		var r Record
		if r, err = Parse(buf[:n]); err == nil || errors.Is(err, ErrEmpty) {
			return r, err
		}
	}
	return Record{}, err
}

// Stamp reads the lease file at path as a launcher or the agent sees it: its record, or, for
// a file without one (renewed by an older keeper), its modification time converted to the
// boot clock, as of this boot, in generation 0. The latter steps with the wall clock, as
// leases did before records.
func Stamp(path string, now Clock) (Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	r, err := ReadFrom(f)
	if !errors.Is(err, ErrEmpty) {
		return r, err
	}
	fi, err := f.Stat()
	if err != nil {
		return Record{}, err
	}
	return Record{Boot: BootID(), Stamp: now() - time.Since(fi.ModTime())}, nil
}

// Writer renews one lease file in place.
type Writer struct {
	f    *os.File
	path string
}

// OpenWriter opens the lease file at path for renewals, creating it (empty: lapsed) if missing.
func OpenWriter(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", path, err)
	}
	return &Writer{f: f, path: path}, nil
}

// Read reads the file's current record.
func (w *Writer) Read() (Record, error) { return ReadFrom(w.f) }

// Write rewrites the record in place, then sets the file's modification time to wall (what
// launchers older than records read). The first write of a file allocates its one block;
// later ones need no free space.
func (w *Writer) Write(r Record, wall time.Time) error {
	if _, err := w.f.WriteAt(r.Marshal(), 0); err != nil {
		return fmt.Errorf("renew lease %s: %w", w.path, err)
	}
	if err := os.Chtimes(w.path, wall, wall); err != nil {
		return fmt.Errorf("renew lease %s: %w", w.path, err)
	}
	return nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	id := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
	if len(id) != 32 || !isHex(id) {
		return ""
	}
	return id
})

// BootID is this boot's id (the kernel's boot_id without dashes), "" where it cannot be
// read: records are then not checked for their boot.
func BootID() string { return bootID() }
