package process

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// dropTo makes the shim the worker's user ("uid:gid:group,..."), with no new privileges,
// before the worker's program runs, as the docker driver's containers do.
//
// no_new_privs is an attribute of each thread, inherited by the threads and processes a
// thread makes and kept across exec. The shim's thread is locked (for good: it runs main,
// as in a Go program init may arrange) and gets it first, so the program exec'd from it, or
// the children a program run in place (the lease launcher) starts from its main goroutine,
// inherit it. Where the runtime can, every other thread gets it too. Setuid and friends
// change every thread's credentials (Go does that since 1.16).
func dropTo(spec string) error {
	uid, gid, groups, err := parseUserSpec(spec)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 && !errors.Is(e, syscall.ENOTSUP) {
		return fmt.Errorf("no_new_privs on every thread: %w", e)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("setgid %d: %w", gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	if syscall.Getuid() != uid || syscall.Geteuid() != uid || syscall.Getgid() != gid || syscall.Getegid() != gid {
		return fmt.Errorf("still uid %d/%d gid %d/%d after the drop", syscall.Getuid(), syscall.Geteuid(), syscall.Getgid(), syscall.Getegid())
	}
	return nil
}

// parseUserSpec reads "uid:gid:g1,g2" (groups may be empty).
func parseUserSpec(spec string) (uid, gid int, groups []int, err error) {
	parts := strings.Split(spec, ":")
	if len(parts) != 3 {
		return 0, 0, nil, fmt.Errorf("bad user %q: want uid:gid:groups", spec)
	}
	num := func(s string) (int, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		return int(n), err
	}
	if uid, err = num(parts[0]); err != nil {
		return 0, 0, nil, fmt.Errorf("bad uid in %q", spec)
	}
	if gid, err = num(parts[1]); err != nil {
		return 0, 0, nil, fmt.Errorf("bad gid in %q", spec)
	}
	groups = []int{}
	if parts[2] != "" {
		for _, g := range strings.Split(parts[2], ",") {
			n, err := num(g)
			if err != nil {
				return 0, 0, nil, fmt.Errorf("bad group in %q", spec)
			}
			groups = append(groups, n)
		}
	}
	return uid, gid, groups, nil
}
