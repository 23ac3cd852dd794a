package healthcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ScriptStatus is the verdict of one run of a health script.
type ScriptStatus int

const (
	ScriptOK ScriptStatus = iota
	// ScriptWarn: a line of output starts with WARN. The node is throttled.
	ScriptWarn
	// ScriptError: a line starts with ERROR, the script exited non-zero, could not start, or
	// hung past its timeout. The node is unhealthy.
	ScriptError
)

func (s ScriptStatus) String() string {
	switch s {
	case ScriptWarn:
		return "warn"
	case ScriptError:
		return "error"
	default:
		return "ok"
	}
}

// ScriptResult is the outcome of one run.
type ScriptResult struct {
	Name   string
	Status ScriptStatus
	// Output is the line that decided the status (or a short account of the failure), at
	// most maxOutput bytes, fit for a log line and the node's status record.
	Output   string
	ExitCode int
	TimedOut bool
	Started  time.Time
	Duration time.Duration
}

const (
	maxCapture = 64 << 10 // bytes of script output kept for parsing
	maxOutput  = 256      // bytes of it kept in a result
	// waitDelay bounds how long a run may outlive its script because something the script
	// started, and that escaped its process group, still holds the output pipe.
	waitDelay = 500 * time.Millisecond
)

// RunScript runs one health script in its own process group and judges it. Past timeout (or
// when ctx ends) the whole group is killed with SIGKILL, so a script's children die with it;
// leftovers of a script that exited are killed too. The script runs in its directory with
// the agent's environment.
func RunScript(ctx context.Context, path string, timeout time.Duration) ScriptResult {
	res := ScriptResult{Name: filepath.Base(path), Started: time.Now(), ExitCode: -1}
	fail := func(msg string) ScriptResult {
		res.Status, res.Output, res.Duration = ScriptError, trimOutput(msg), time.Since(res.Started)
		return res
	}
	// Our own pipe rather than exec's: exec would make Wait wait for every process holding
	// the pipe, so a script that exits but leaves a background child would count as hung.
	// Here Wait returns when the script does, and then its group is killed.
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail("cannot run: " + err.Error())
	}
	defer pr.Close()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, path)
	cmd.Dir = filepath.Dir(path)
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var killed atomic.Bool
	cmd.Cancel = func() error {
		killed.Store(true)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return fail("cannot run: " + err.Error())
	}
	out := &cappedBuffer{max: maxCapture}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(out, pr)
	}()
	err = cmd.Wait()
	// The group id is the script's pid, which the kernel does not hand out again while any
	// member of the group lives: killing it after the fact reaches only the script's leftovers.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	t := time.NewTimer(waitDelay)
	select {
	case <-copied:
	case <-t.C: // a leftover that left the group (setsid) still holds the pipe: stop reading
		pr.Close()
		<-copied
	}
	t.Stop()
	res.Duration = time.Since(res.Started)
	res.ExitCode = cmd.ProcessState.ExitCode()
	if killed.Load() && ctx.Err() == nil {
		res.TimedOut = true
		return fail(fmt.Sprintf("timed out after %v, killed", timeout))
	}
	status, line := judgeOutput(out.Bytes())
	res.Status, res.Output = status, line
	if err != nil {
		res.Status = ScriptError
		msg := err.Error()
		if line != "" {
			msg += ": " + line
		} else if last := lastLine(out.Bytes()); last != "" {
			msg += ": " + last
		}
		res.Output = trimOutput(msg)
	}
	return res
}

// judgeOutput applies Storm's rule: a line beginning with ERROR fails the node, one beginning
// with WARN (our addition) throttles it. ERROR wins over WARN wherever it stands.
func judgeOutput(out []byte) (ScriptStatus, string) {
	status, first := ScriptOK, ""
	for len(out) > 0 {
		var line []byte
		line, out = nextLine(out)
		switch {
		case bytes.HasPrefix(line, []byte("ERROR")):
			return ScriptError, trimOutput(string(line))
		case status == ScriptOK && bytes.HasPrefix(line, []byte("WARN")):
			status, first = ScriptWarn, trimOutput(string(line))
		}
	}
	return status, first
}

func lastLine(out []byte) string {
	out = trimSpace(out)
	if i := bytes.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	return trimOutput(string(out))
}

// trimOutput keeps the start of s, on one line, at most maxOutput bytes of valid UTF-8.
func trimOutput(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\n", " "))
	if len(s) <= maxOutput {
		return s
	}
	return strings.ToValidUTF8(s[:maxOutput-3], "") + "..."
}

// cappedBuffer keeps the first max bytes written and drops the rest without failing the
// writer: a chatty script must not block on a full pipe or be killed by a write error.
type cappedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *cappedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Bytes()
}

// ScriptRunner runs every executable in a directory on a period. A script still running when
// its next turn comes is skipped, never started twice, so a hung script costs one process
// group until its timeout, not one per period.
type ScriptRunner struct {
	Dir      string
	Interval time.Duration
	Timeout  time.Duration
	Logger   *slog.Logger
	// OnResult, when set, is called after every finished run (metrics), from the run's
	// goroutine.
	OnResult func(ScriptResult)

	mu      sync.Mutex
	running map[string]bool
	results map[string]ScriptResult
	dirErr  string
	notify  chan struct{}
	started bool
}

// Updates is signalled (without blocking, coalescing) whenever a run finishes or a script
// disappears. It is valid before Run.
func (r *ScriptRunner) Updates() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.initLocked()
	return r.notify
}

func (r *ScriptRunner) initLocked() {
	if r.notify == nil {
		r.notify = make(chan struct{}, 1)
		r.running = map[string]bool{}
		r.results = map[string]ScriptResult{}
	}
}

// Results returns the latest result of every script present, by name.
func (r *ScriptRunner) Results() []ScriptResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ScriptResult, 0, len(r.results))
	for _, res := range r.results {
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b ScriptResult) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Run starts the scripts at once and then every Interval, until ctx ends; then it kills what
// still runs and returns when every run has ended.
func (r *ScriptRunner) Run(ctx context.Context) error {
	r.mu.Lock()
	r.initLocked()
	if r.started {
		r.mu.Unlock()
		return errors.New("script runner: Run called twice")
	}
	r.started = true
	r.mu.Unlock()
	if r.Interval <= 0 || r.Timeout <= 0 {
		return fmt.Errorf("script runner: interval %v and timeout %v must be positive", r.Interval, r.Timeout)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		r.tick(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (r *ScriptRunner) log() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

func (r *ScriptRunner) tick(ctx context.Context, wg *sync.WaitGroup) {
	names, err := listScripts(r.Dir)
	r.mu.Lock()
	defer r.mu.Unlock()
	// A missing or unreadable directory means no scripts (as in Storm), said once.
	if msg := errString(err); msg != r.dirErr {
		if err != nil {
			r.log().Warn("health scripts: cannot read directory; running none", "dir", r.Dir, "err", err)
		}
		r.dirErr = msg
	}
	changed := false
	for name := range r.results {
		if !slices.Contains(names, name) {
			delete(r.results, name)
			changed = true
		}
	}
	if changed {
		r.signal()
	}
	for _, name := range names {
		if r.running[name] {
			r.log().Debug("health script still running, skipping this turn", "script", name)
			continue
		}
		r.running[name] = true
		wg.Go(func() {
			res := RunScript(ctx, filepath.Join(r.Dir, name), r.Timeout)
			if ctx.Err() != nil { // killed because we stop, not the script's fault
				r.mu.Lock()
				delete(r.running, name)
				r.mu.Unlock()
				return
			}
			// Metrics first, so that whoever reacts to the signal sees them counted.
			if r.OnResult != nil {
				r.OnResult(res)
			}
			r.mu.Lock()
			delete(r.running, name)
			prev, had := r.results[name]
			r.results[name] = res
			r.signal()
			r.mu.Unlock()
			if !had || prev.Status != res.Status {
				r.log().Info("health script result", "script", name, "status", res.Status.String(),
					"output", res.Output, "exit", res.ExitCode, "timed_out", res.TimedOut, "took", res.Duration)
			}
		})
	}
}

func (r *ScriptRunner) signal() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// listScripts names the executable regular files (symlinks followed) in dir, skipping dot
// files (editor swap files, .keep), sorted.
func listScripts(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		names = append(names, e.Name())
	}
	return names, nil
}
