package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Stop sends pid SIGSTOP and returns once every thread of it is stopped, as /proc shows:
// the signal is delivered asynchronously, and a test that acts on the process being
// silent must not race a thread still answering.
func Stop(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP pid %d: %v", pid, err)
	}
	EventuallyWith(t, fmt.Sprintf("every thread of pid %d stopped", pid), 10*time.Second, func() (bool, string) {
		return stopped(pid)
	})
}

// stopped reports whether every thread of pid is in the stopped state (T).
func stopped(pid int) (bool, string) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err.Error()
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(fmt.Sprintf("/proc/%d/task", pid), task.Name(), "stat"))
		if err != nil {
			return false, err.Error()
		}
		// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return false, "unreadable stat: " + s
		}
		if state := s[i+2]; state != 'T' && state != 't' {
			return false, fmt.Sprintf("thread %s in state %c", task.Name(), state)
		}
	}
	return true, ""
}
