package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a server a test runs as a process (a database, a broker): in a process group of
// its own, so that a kill takes its children too, its output appended to a log file.
type Proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
}

// StartProc starts cmd, its output appended to logFile after a line saying when.
func StartProc(cmd *exec.Cmd, logFile string) (*Proc, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "==== starting at %s: %v\n", time.Now().Format("15:04:05.000"), cmd.Args)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Proc{cmd: cmd, log: logFile, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process's pid, its process group's too.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// WaitUp polls up until it returns nil, within Timeout(timeout); it fails, with the end of
// the log, when the process exits first or the time runs out (and then kills it).
func (p *Proc) WaitUp(timeout time.Duration, up func() error) error {
	deadline := time.Now().Add(Timeout(timeout))
	for {
		err := up()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited while starting: %s", LogTail(p.log))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop(syscall.SIGKILL, 0)
			return fmt.Errorf("not answering after %s (%v): %s", timeout, err, LogTail(p.log))
		}
	}
}

// Stop sends sig to the process group and waits for the process; after grace (0: at once
// for SIGKILL, else never) it kills the group. It then waits for the group's last process
// (a server's children outlive it for a moment), so that a restart finds nothing of it.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) {
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, sig)
	_ = syscall.Kill(-pid, syscall.SIGCONT) // a paused one too
	if grace > 0 {
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			<-p.exited
		}
	} else {
		<-p.exited
	}
	for range 100 {
		if err := syscall.Kill(-pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogTail returns the last 3000 bytes of a log file.
func LogTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
