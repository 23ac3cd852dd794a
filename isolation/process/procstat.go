package process

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procInfo is what /proc/PID/stat says about a process that matters here.
type procInfo struct {
	state byte   // R, S, D, Z, ...
	start uint64 // start time in clock ticks since boot: with the pid it names one process
}

// errNoProcess: no process has the pid (or it is a different process now).
var errNoProcess = errors.New("no such process")

// readProc reads /proc/PID/stat.
func readProc(pid int) (procInfo, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return procInfo{}, errNoProcess
		}
		return procInfo{}, fmt.Errorf("read /proc/%d/stat: %w", pid, err)
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procInfo{}, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return procInfo{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procInfo{}, fmt.Errorf("parse /proc/%d/stat starttime: %w", pid, err)
	}
	return procInfo{state: f[0][0], start: start}, nil
}

// alive reports whether pid still names the process that started at start ticks and has not
// exited (a zombie has exited: it only waits to be reaped).
func alive(pid int, start uint64) (bool, error) {
	p, err := readProc(pid)
	if errors.Is(err, errNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return p.start == start && p.state != 'Z' && p.state != 'X', nil
}
