package healthcheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// writeScript puts an executable shell script in dir. Tests write every script before running
// anything: an executable written while another goroutine forks can fail with ETXTBSY.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// alive reports whether pid is a live process (a zombie is dead).
func alive(pid int) bool {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read pids: %v", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, n)
	}
	return pids
}

func waitDead(t *testing.T, pids []int) {
	t.Helper()
	testenv.EventuallyWith(t, fmt.Sprintf("processes %v gone", pids), 3*time.Second, func() (bool, string) {
		for _, pid := range pids {
			if alive(pid) {
				return false, fmt.Sprintf("process %d still alive", pid)
			}
		}
		return true, ""
	})
}

func TestRunScript(t *testing.T) {
	dir := t.TempDir()
	ok := writeScript(t, dir, "ok", "echo all good")
	errLine := writeScript(t, dir, "error-line", "echo checking\necho WARN not this\necho 'ERROR disk /data full'\nexit 0")
	nonzero := writeScript(t, dir, "nonzero", "echo something broke >&2\nexit 3")
	warn := writeScript(t, dir, "warn", "echo 'WARN swap in use'")
	hang := writeScript(t, dir, "hang", "sleep 100 &\necho $! > "+filepath.Join(dir, "hang.child")+"\necho $$ > "+filepath.Join(dir, "hang.pid")+"\nwait")
	leftover := writeScript(t, dir, "leftover", "sleep 100 &\necho $! > "+filepath.Join(dir, "leftover.child")+"\necho fine")
	noexec := filepath.Join(dir, "badshebang")
	if err := os.WriteFile(noexec, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		path     string
		status   ScriptStatus
		out      string
		exit     int
		timedOut bool
	}{
		{ok, ScriptOK, "", 0, false},
		{errLine, ScriptError, "ERROR disk /data full", 0, false},
		{nonzero, ScriptError, "exit status 3: something broke", 3, false},
		{warn, ScriptWarn, "WARN swap in use", 0, false},
		{hang, ScriptError, "timed out after 300ms, killed", -1, true},
		{leftover, ScriptOK, "", 0, false},
		{noexec, ScriptError, "cannot run", -1, false},
	} {
		t.Run(filepath.Base(tc.path), func(t *testing.T) {
			start := time.Now()
			r := RunScript(ctx, tc.path, 300*time.Millisecond)
			if r.Status != tc.status || !strings.Contains(r.Output, tc.out) || r.ExitCode != tc.exit || r.TimedOut != tc.timedOut {
				t.Errorf("got %v %q exit %d timedOut %v; want %v %q exit %d timedOut %v",
					r.Status, r.Output, r.ExitCode, r.TimedOut, tc.status, tc.out, tc.exit, tc.timedOut)
			}
			if r.Name != filepath.Base(tc.path) {
				t.Errorf("name %q", r.Name)
			}
			if took := time.Since(start); took > 300*time.Millisecond+waitDelay+3*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
	// The hung script and its child were killed as a group; so was the leftover child of a
	// script that exited.
	waitDead(t, append(readPids(t, filepath.Join(dir, "hang.pid")), readPids(t, filepath.Join(dir, "hang.child"))...))
	waitDead(t, readPids(t, filepath.Join(dir, "leftover.child")))
}

func TestTrimOutput(t *testing.T) {
	long := strings.Repeat("é", 300)
	got := trimOutput("ERROR " + long + "\nsecond line")
	if len(got) > maxOutput || !strings.HasSuffix(got, "...") || strings.ContainsRune(got, '\n') || !strings.HasPrefix(got, "ERROR é") {
		t.Errorf("trimOutput: %d bytes %q", len(got), got)
	}
	if !strings.Contains(trimOutput("a\nb"), "a b") {
		t.Error("lines not joined")
	}
}

// TestScriptRunner runs a directory of real scripts on a short period: each gets its verdict,
// the hung one is killed every time and never runs twice at once, and stopping the runner
// leaves no process behind.
func TestScriptRunner(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	writeScript(t, dir, "10-ok", "exit 0")
	writeScript(t, dir, "20-warn", "echo WARN load high")
	writeScript(t, dir, "30-error", "echo ERROR nfs mount gone")
	writeScript(t, dir, "40-hang", strings.Join([]string{
		"pidfile=" + filepath.Join(state, "pid"),
		`if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then echo overlap >> ` + filepath.Join(state, "overlaps") + "; fi",
		`echo $$ > "$pidfile"`,
		"echo $$ >> " + filepath.Join(state, "starts"),
		"sleep 100 &",
		"echo $! >> " + filepath.Join(state, "children"),
		"wait",
	}, "\n"))
	if err := os.WriteFile(filepath.Join(dir, "50-not-executable"), []byte("#!/bin/sh\necho ERROR\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".hidden"), []byte("#!/bin/sh\necho ERROR\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failures := map[string]int{}
	r := &ScriptRunner{Dir: dir, Interval: 50 * time.Millisecond, Timeout: 300 * time.Millisecond,
		OnResult: func(res ScriptResult) {
			mu.Lock()
			defer mu.Unlock()
			if res.Status == ScriptError {
				failures[res.Name]++
			}
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// Wait until the hung script has been killed at least twice.
	testenv.EventuallyWith(t, "the hung script killed twice", 5*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return failures["40-hang"] >= 2, fmt.Sprintf("killed %d times", failures["40-hang"])
	})
	got := map[string]ScriptResult{}
	for _, res := range r.Results() {
		got[res.Name] = res
	}
	if len(got) != 4 {
		t.Errorf("results for %d scripts, want 4 (not the non-executable or hidden ones): %v", len(got), got)
	}
	for name, want := range map[string]ScriptStatus{"10-ok": ScriptOK, "20-warn": ScriptWarn, "30-error": ScriptError, "40-hang": ScriptError} {
		if got[name].Status != want {
			t.Errorf("%s: %v (%q), want %v", name, got[name].Status, got[name].Output, want)
		}
	}
	if !got["40-hang"].TimedOut {
		t.Errorf("40-hang not reported as timed out: %+v", got["40-hang"])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup
	elapsed := time.Since(start)

	if _, err := os.Stat(filepath.Join(state, "overlaps")); err == nil {
		t.Error("the hung script ran twice at once")
	}
	starts := readPids(t, filepath.Join(state, "starts"))
	// Without the guard it would start every 50ms; with it at most once per timeout.
	if max := int(elapsed/(300*time.Millisecond)) + 1; len(starts) > max {
		t.Errorf("hung script started %d times in %v, want at most %d", len(starts), elapsed, max)
	}
	waitDead(t, append(starts, readPids(t, filepath.Join(state, "children"))...))

	// A script removed from the directory takes its verdict with it.
	r2 := &ScriptRunner{Dir: dir, Interval: 30 * time.Millisecond, Timeout: time.Second}
	if err := os.Remove(filepath.Join(dir, "40-hang")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "30-error")); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- r2.Run(ctx2) }()
	defer cancel2()
	testenv.EventuallyWith(t, "results of the 2 scripts left", 3*time.Second, func() (bool, string) {
		res := r2.Results()
		return len(res) == 2, fmt.Sprintf("%+v", res)
	})
	cancel2()
	<-done2
	if res := r2.Results(); len(res) != 2 || res[0].Name != "10-ok" || res[1].Name != "20-warn" {
		t.Errorf("after removal: %+v", res)
	}
}

func TestScriptRunnerMissingDir(t *testing.T) {
	r := &ScriptRunner{Dir: filepath.Join(t.TempDir(), "nope"), Interval: 10 * time.Millisecond, Timeout: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(r.Results()) != 0 {
		t.Errorf("results from a missing directory: %v", r.Results())
	}
	if err := r.Run(context.Background()); err == nil {
		t.Error("second Run: no error")
	}
}
