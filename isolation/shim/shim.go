// Package shim is the worker side of the process driver's start protocol: the first program
// of every process worker, which waits until the driver has placed it in the worker's
// cgroup, drops to the worker's user and then runs the worker's program.
//
// It imports nothing but the standard library and golang.org/x/sys/unix, because it runs
// once per worker start: the separate stormdock-shim binary (cmd/stormdock-shim) is this
// package and the lease launcher, and starts in about a millisecond of cpu, where the whole
// stormdock binary pays several for its package initialisation. The stormdock binary can
// still act as the shim (the process driver's init calls Run), for a stormdock run with no
// stormdock-shim beside it (go run).
//
// The protocol: the driver starts the shim with Env=Magic in its environment, argv [Arg0,
// program, argv...], the read end of the go-ahead pipe as fd GoFD, the write end of the
// status pipe as fd StatusFD (both pipes close-on-exec on the driver's side) and the worker's
// environment as fd EnvFD. The shim's own environment is fixed and minimal: the protocol's
// variables (Env, PlaceEnv, UserEnv) and nothing of the worker's, because the shim runs as
// the driver's user (root) until the drop, and a tenant's LD_PRELOAD, LD_AUDIT,
// LD_LIBRARY_PATH (read by the dynamic loader of a cgo-linked shim, the stormdock binary),
// GODEBUG, GOTRACEBACK or GOMAXPROCS (read by the Go runtime) would steer a process running
// as root. EnvFD is a file (a memfd) holding the worker's environment from offset 0 to its
// end: KEY=VALUE entries, each ended by a NUL byte. The shim reads it whole and uses it only
// for the worker's program: the environment of its exec, or, for the lease launcher run in
// place, the process's environment, installed after the drop.
//
// The shim blocks reading one byte from GoFD, which the driver writes once the shim is in
// its cgroup (or at once, when the kernel started it there: CLONE_INTO_CGROUP); EOF without
// a byte means the driver could not place it, and the shim exits ExitAbort running nothing.
// Released, it reads the worker's environment, drops to the user in UserEnv, if any, writes
// Exec to StatusFD and execs the program in place, keeping its pid; an exec failure is
// written to StatusFD after it and the shim exits ExitExec (a failure before, without Exec).
// The status pipe closes on the successful exec (close-on-exec): Exec and then EOF tell the
// driver that the program runs; EOF without Exec, that the shim ended before trying, which
// is what a binary that does not know Magic does (an older stormdock-shim, which knew only
// the "-v1" values and took its environment for the worker's: it prints its usage and exits,
// running nothing), so the driver refuses the start. So no instruction of the worker's
// program, and no child of it, ever runs outside its cgroup, as the driver's user, or with
// another environment than its own.
//
// With Env=MagicSelf (cgroup v1) the shim places itself once released: its main thread
// writes "0" into the tasks file of the worker's cgroup in every hierarchy (PlaceEnv), then
// writes Placed to StatusFD and goes on as above, but always by exec, from that thread: the
// exec ends the process's other threads, still outside, so the program runs as one thread,
// inside, from its first instruction (the lease launcher too, exec'd afresh rather than run
// in place). The kernel moves the calling thread for "0" without its global threadgroup
// lock, whose writer waits for an RCU grace period (and every fork on the machine with it):
// the driver's own write of the shim's pid into cgroup.procs costs 5 to 15ms of wall time
// here when nothing moved just before, the shim's writes a tenth of a millisecond. The drop
// to the worker's user is that thread's alone too, for the same reason. A binary that does
// not know MagicSelf is no shim for it and runs nothing of the worker; the driver, seeing no
// Placed, moves it itself. A failure to place itself is written to StatusFD (without
// Placed) and runs nothing.
package shim

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The protocol's constants, shared by both sides.
const (
	// EnvPrefix begins every variable of the protocol: a worker's environment has none (the
	// driver removes them).
	EnvPrefix = "_STORMDOCK_ISOLATION_"
	// Env marks a process started as a shim; its value is Magic. The "-v2" values mark the
	// protocol in which the worker's environment comes on EnvFD: a shim that knows only
	// "-v1" (whose own environment was the worker's) does not take them for its own.
	Env   = "_STORMDOCK_ISOLATION_SHIM"
	Magic = "exec-after-placement-v2"
	// MagicSelf asks the shim to place itself (cgroup v1) into the tasks files in PlaceEnv,
	// separated by PlaceSep.
	MagicSelf = "place-self-then-exec-v2"
	PlaceEnv  = "_STORMDOCK_ISOLATION_PLACE"
	PlaceSep  = ":"
	// Placed is written to StatusFD by a shim that placed itself.
	Placed = 'P'
	// Exec is written to StatusFD right before the worker's program runs (exec, or the
	// launcher in place): a shim that ends without it ran nothing of the worker.
	Exec = 'X'
	// UserEnv carries "uid:gid:group,..." (groups may be empty) when the worker runs as
	// another user than the driver: the shim drops to it once placed (see Drop).
	UserEnv = "_STORMDOCK_ISOLATION_USER"
	// Arg0 is the shim's argv[0].
	Arg0 = "stormdock-shim"

	// GoFD and StatusFD are the pipes' descriptors in the shim, EnvFD the file of the
	// worker's environment (os/exec maps ExtraFiles from 3 up).
	GoFD     = 3
	StatusFD = 4
	EnvFD    = 5
	// MaxEnv bounds what the shim reads from EnvFD (the kernel's own bound on an exec's
	// arguments and environment is about a quarter of the stack limit, 2MiB by default).
	MaxEnv = 32 << 20

	// ExitAbort is the shim's status when the driver gave up before releasing it.
	ExitAbort = 125
	// ExitExec is the shim's status when the worker's program could not be run.
	ExitExec = 127
)

// Active reports whether this process was started as a shim.
func Active() bool { v := os.Getenv(Env); return v == Magic || v == MagicSelf }

// Run does the shim's part when this process was started as one (Active) and does nothing
// otherwise. It waits for the go-ahead and execs os.Args[1] with argv os.Args[2:]; it
// returns only when that program is this very binary (the lease launcher, run in place
// rather than started as a second process) and the whole process was placed by the driver:
// os.Args is then the program's argv, and the process runs as the worker's user already.
func Run() {
	if !Active() {
		return
	}
	// The main thread does all of it: with MagicSelf it alone is placed and dropped.
	runtime.LockOSThread()
	syscall.CloseOnExec(GoFD)
	syscall.CloseOnExec(StatusFD)
	syscall.CloseOnExec(EnvFD)
	var b [1]byte
	if n, _ := syscall.Read(GoFD, b[:]); n != 1 {
		// The driver closed the pipe without a byte: it could not place us. Run nothing.
		os.Exit(ExitAbort)
	}
	selfPlaced := os.Getenv(Env) == MagicSelf
	if selfPlaced {
		if err := placeThread(os.Getenv(PlaceEnv)); err != nil {
			fail("place in cgroup: " + err.Error())
		}
		_, _ = syscall.Write(StatusFD, []byte{Placed})
	}
	if len(os.Args) < 3 {
		fail("shim: no program given")
	}
	env, err := readEnv(EnvFD)
	if err != nil {
		fail("worker environment: " + err.Error())
	}
	syscall.Close(EnvFD)
	prog := os.Args[1]
	// Decided before the drop: as the worker's user the driver's own directory may be out of
	// reach. Any other program the worker's user must be able to reach and run, as it could
	// by itself: the drop comes first.
	self := sameExecutable(prog)
	if self && !selfPlaced {
		// Best effort (see showEnv): what the host sees, not what the launcher gets.
		_ = showEnv(env)
	}
	if u := os.Getenv(UserEnv); u != "" {
		os.Unsetenv(UserEnv)
		drop := Drop
		if selfPlaced {
			drop = dropThread
		}
		if err := drop(u); err != nil {
			fail("run as " + u + ": " + err.Error())
		}
	}
	if self && !selfPlaced {
		// The worker's environment becomes the process's, now that it runs as the worker's
		// user: what the launcher reads and gives its child. What the runtime read at its
		// start (GOMAXPROCS, GOTRACEBACK) stays the shim's; GODEBUG takes effect on Setenv.
		os.Clearenv()
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			if err := os.Setenv(k, v); err != nil {
				fail("worker environment: " + strconv.Quote(k) + ": " + err.Error())
			}
		}
		// Exec and closing the status pipe tell the driver the program runs, as the
		// close-on-exec of a successful exec would; main then sees the program's argv.
		_, _ = syscall.Write(StatusFD, []byte{Exec})
		syscall.Close(GoFD)
		syscall.Close(StatusFD)
		os.Args = os.Args[2:]
		return
	}
	if self {
		// This binary again, afresh: through /proc/self/exe, which the worker's user may run
		// wherever the binary's directory is.
		prog = "/proc/self/exe"
	}
	_, _ = syscall.Write(StatusFD, []byte{Exec})
	err = syscall.Exec(prog, os.Args[2:], env)
	fail("exec " + os.Args[1] + ": " + err.Error())
}

// shownEnv is the block /proc/PID/environ shows for the launcher run in place (showEnv):
// kept for the life of the process.
var shownEnv []byte

// mmMap is the kernel's struct prctl_mm_map (PR_SET_MM_MAP).
type mmMap struct {
	startCode, endCode, startData, endData, startBrk, brk, startStack uint64
	argStart, argEnd, envStart, envEnd                                uint64
	auxv                                                              uint64
	auxvSize, exeFD                                                   uint32
}

// showEnv makes the host's view of this process's environment (/proc/PID/environ, ps e) the
// worker's, for a program run in place: that view is the block the kernel gave the shim at
// its exec (the protocol's variables), whatever Setenv does later. PR_SET_MM_MAP moves it,
// without privileges, given the process's map as it is (/proc/self/stat); a kernel without
// it (CONFIG_CHECKPOINT_RESTORE) leaves the view the shim's, which holds nothing secret.
func showEnv(env []string) error {
	block := EncodeEnv(env)
	shownEnv = make([]byte, max(len(block), 1))
	copy(shownEnv, block)
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return err
	}
	// Fields after the command name, which ends with the last ')': the 3rd of stat is f[0].
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return errors.New("bad /proc/self/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	field := func(n int) uint64 { // n as in proc(5), from 1
		if n-3 >= len(f) {
			return 0
		}
		v, _ := strconv.ParseUint(f[n-3], 10, 64)
		return v
	}
	if len(f) < 52-3 {
		return errors.New("/proc/self/stat too short")
	}
	brk, _, _ := syscall.RawSyscall(syscall.SYS_BRK, 0, 0, 0)
	start := uint64(uintptr(unsafe.Pointer(&shownEnv[0])))
	m := mmMap{
		startCode: field(26), endCode: field(27), startStack: field(28),
		startData: field(45), endData: field(46), startBrk: field(47), brk: uint64(brk),
		argStart: field(48), argEnd: field(49),
		envStart: start, envEnd: start + uint64(len(block)),
		exeFD: ^uint32(0), // the same executable
	}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_MM, unix.PR_SET_MM_MAP, uintptr(unsafe.Pointer(&m)), unsafe.Sizeof(m), 0, 0); e != 0 {
		return e
	}
	return nil
}

// readEnv reads the worker's environment from fd (see EnvFD): NUL-ended KEY=VALUE entries,
// from offset 0 to the end. Entries without a name, or of the protocol, are refused: the
// driver writes neither.
func readEnv(fd int) ([]string, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, errors.New("fd " + strconv.Itoa(fd) + ": " + err.Error())
	}
	if st.Size < 0 || st.Size > MaxEnv {
		return nil, errors.New(strconv.FormatInt(st.Size, 10) + " bytes, more than " + strconv.Itoa(MaxEnv))
	}
	buf := make([]byte, st.Size)
	for off := 0; off < len(buf); {
		n, err := syscall.Pread(fd, buf[off:], int64(off))
		if err != nil {
			return nil, errors.New("read: " + err.Error())
		}
		if n == 0 {
			return nil, errors.New("truncated at " + strconv.Itoa(off) + " of " + strconv.Itoa(len(buf)) + " bytes")
		}
		off += n
	}
	if len(buf) == 0 {
		return []string{}, nil
	}
	if buf[len(buf)-1] != 0 {
		return nil, errors.New("the last entry is not ended by a NUL byte")
	}
	all := string(buf[:len(buf)-1])
	env := make([]string, 0, strings.Count(all, "\x00")+1)
	for kv := range strings.SplitSeq(all, "\x00") {
		if i := strings.IndexByte(kv, '='); i <= 0 {
			return nil, errors.New("bad entry " + strconv.Quote(kv) + ": want KEY=VALUE")
		}
		if strings.HasPrefix(kv, EnvPrefix) {
			return nil, errors.New("entry " + strconv.Quote(kv[:strings.IndexByte(kv, '=')]) + " is the protocol's")
		}
		env = append(env, kv)
	}
	return env, nil
}

// EncodeEnv is the content of EnvFD for env (see readEnv).
func EncodeEnv(env []string) []byte {
	n := 0
	for _, kv := range env {
		n += len(kv) + 1
	}
	b := make([]byte, 0, n)
	for _, kv := range env {
		b = append(b, kv...)
		b = append(b, 0)
	}
	return b
}

// placeThread moves the calling thread into the cgroups whose tasks files are listed in files
// (see MagicSelf).
func placeThread(files string) error {
	if files == "" {
		return errors.New("no cgroup given")
	}
	zero := []byte("0")
	for _, f := range strings.Split(files, PlaceSep) {
		fd, err := syscall.Open(f, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return errors.New("open " + f + ": " + err.Error())
		}
		_, err = syscall.Write(fd, zero)
		syscall.Close(fd)
		if err != nil {
			return errors.New("write " + f + ": " + err.Error())
		}
	}
	return nil
}

// dropThread makes the calling thread the user in spec, with no new privileges, and no other
// thread: the caller execs next, which ends the others (see MagicSelf).
func dropThread(spec string) error {
	uid, gid, groups, err := ParseUserSpec(spec)
	if err != nil {
		return err
	}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return errors.New("no_new_privs: " + e.Error())
	}
	gs := make([]uint32, len(groups))
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	var gp unsafe.Pointer
	if len(gs) > 0 {
		gp = unsafe.Pointer(&gs[0])
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(gs)), uintptr(gp), 0); e != 0 {
		return errors.New("setgroups: " + e.Error())
	}
	runtime.KeepAlive(gs)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return errors.New("setgid " + strconv.Itoa(gid) + ": " + e.Error())
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return errors.New("setuid " + strconv.Itoa(uid) + ": " + e.Error())
	}
	// An agent that is not root switches users by capabilities it holds as ambient ones
	// (root loses every capability with the switch itself): the worker must not inherit
	// them. EINVAL: a kernel without ambient capabilities, which then has none to drop.
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 && e != syscall.EINVAL {
		return errors.New("clear ambient capabilities: " + e.Error())
	}
	if syscall.Getuid() != uid || syscall.Geteuid() != uid || syscall.Getgid() != gid || syscall.Getegid() != gid {
		return errors.New("still uid " + strconv.Itoa(syscall.Getuid()) + "/" + strconv.Itoa(syscall.Geteuid()) +
			" gid " + strconv.Itoa(syscall.Getgid()) + "/" + strconv.Itoa(syscall.Getegid()) + " after the drop")
	}
	return nil
}

// fail reports why the program does not run to the driver and exits.
func fail(msg string) {
	_, _ = syscall.Write(StatusFD, []byte(msg))
	os.Exit(ExitExec)
}

// sameExecutable reports whether path is the binary this process runs.
func sameExecutable(path string) bool {
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return false
	}
	other, err := os.Stat(path)
	return err == nil && os.SameFile(self, other)
}

// UserSpec is the value of UserEnv for a user.
func UserSpec(uid, gid uint32, groups []uint32) string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(uint64(uid), 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(uint64(gid), 10))
	b.WriteByte(':')
	for i, g := range groups {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(g), 10))
	}
	return b.String()
}

// Drop makes this process the user in spec ("uid:gid:group,..."), with no new privileges,
// before the worker's program runs, as the docker driver's containers do.
//
// no_new_privs is an attribute of each thread, inherited by the threads and processes a
// thread makes and kept across exec. The calling thread is locked (for good: it runs main,
// as in a Go program init may arrange) and gets it first, so the program exec'd from it, or
// the children a program run in place (the lease launcher) starts from its main goroutine,
// inherit it. Where the runtime can, every other thread gets it too. Setuid and friends
// change every thread's credentials (Go does that since 1.16).
func Drop(spec string) error {
	uid, gid, groups, err := ParseUserSpec(spec)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return errors.New("no_new_privs: " + err.Error())
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 && !errors.Is(e, syscall.ENOTSUP) {
		return errors.New("no_new_privs on every thread: " + e.Error())
	}
	if err := syscall.Setgroups(groups); err != nil {
		return errors.New("setgroups: " + err.Error())
	}
	if err := syscall.Setgid(gid); err != nil {
		return errors.New("setgid " + strconv.Itoa(gid) + ": " + err.Error())
	}
	if err := syscall.Setuid(uid); err != nil {
		return errors.New("setuid " + strconv.Itoa(uid) + ": " + err.Error())
	}
	// See dropThread: an agent that is not root passes its capabilities as ambient ones.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return errors.New("clear ambient capabilities: " + err.Error())
	}
	if _, _, e := syscall.AllThreadsSyscall6(syscall.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 && !errors.Is(e, syscall.ENOTSUP) && e != syscall.EINVAL {
		return errors.New("clear ambient capabilities on every thread: " + e.Error())
	}
	if syscall.Getuid() != uid || syscall.Geteuid() != uid || syscall.Getgid() != gid || syscall.Getegid() != gid {
		return errors.New("still uid " + strconv.Itoa(syscall.Getuid()) + "/" + strconv.Itoa(syscall.Geteuid()) +
			" gid " + strconv.Itoa(syscall.Getgid()) + "/" + strconv.Itoa(syscall.Getegid()) + " after the drop")
	}
	return nil
}

// ParseUserSpec reads "uid:gid:g1,g2" (groups may be empty).
func ParseUserSpec(spec string) (uid, gid int, groups []int, err error) {
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		return 0, 0, nil, errors.New("bad user " + strconv.Quote(spec) + ": want uid:gid:groups")
	}
	num := func(s string) (int, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		return int(n), err
	}
	if uid, err = num(parts[0]); err != nil {
		return 0, 0, nil, errors.New("bad uid in " + strconv.Quote(spec))
	}
	if gid, err = num(parts[1]); err != nil {
		return 0, 0, nil, errors.New("bad gid in " + strconv.Quote(spec))
	}
	groups = []int{}
	if parts[2] != "" {
		for _, g := range strings.Split(parts[2], ",") {
			n, err := num(g)
			if err != nil {
				return 0, 0, nil, errors.New("bad group in " + strconv.Quote(spec))
			}
			groups = append(groups, n)
		}
	}
	return uid, gid, groups, nil
}

// Name is the file name of the stormdock-shim binary, installed beside stormdock.
const Name = "stormdock-shim"

// Beside returns the stormdock-shim in the directory of the binary at exe, if one is there
// and may be run.
func Beside(exe string) (string, bool) {
	if exe == "" {
		return "", false
	}
	i := strings.LastIndexByte(exe, '/')
	p := Name
	if i >= 0 {
		p = exe[:i+1] + Name
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", false
	}
	return p, true
}
