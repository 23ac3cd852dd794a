package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/internal/testenv"
)

// stormdockBin is agents/testdata/stormdock: its `helper` is the test worker.
var stormdockBin string

func TestMain(m *testing.M) {
	var err error
	if stormdockBin, err = testenv.Build("./agents/testdata/stormdock"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// launch runs the launcher in-process around a helper worker in mode.
func launch(t *testing.T, ctx context.Context, lease string, ttl, grace time.Duration, mode string) (ws syscall.WaitStatus, dir string, err error) {
	t.Helper()
	dir = t.TempDir()
	t.Setenv("HELPER_DIR", dir)
	t.Setenv("HELPER_MODE", mode)
	t.Setenv("HELPER_CRASH_AFTER", "50ms")
	t.Setenv("STORMDOCK_JOB", "l")
	t.Setenv("STORMDOCK_WORKER", "0")
	ws, err = launcher.Run(ctx, launcher.Config{Lease: lease, TTL: ttl, Grace: grace, Command: []string{stormdockBin, "helper"}})
	return ws, dir, err
}

func touchLease(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lease")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func termFiles(dir string) int {
	ms, _ := filepath.Glob(filepath.Join(dir, "*.term"))
	return len(ms)
}

func TestRunStopsWorkerWhenLeaseLapses(t *testing.T) {
	lease := touchLease(t)
	begin := time.Now()
	// The ttl leaves the helper (a race-enabled test binary) time to set up its SIGTERM handler.
	ws, dir, err := launch(t, context.Background(), lease, time.Second, 5*time.Second, "run")
	took := time.Since(begin)
	if !errors.Is(err, launcher.ErrLeaseExpired) {
		t.Fatalf("err = %v, want ErrLeaseExpired", err)
	}
	if ws.ExitStatus() != 0 || termFiles(dir) != 1 {
		t.Errorf("worker did not drain: status %v, %d drain marks", ws, termFiles(dir))
	}
	if took < time.Second || took > 6*time.Second {
		t.Errorf("worker stopped after %s, want just past the 1s ttl", took)
	}
}

func TestRunKillsWorkerThatIgnoresSIGTERM(t *testing.T) {
	lease := touchLease(t)
	begin := time.Now()
	ws, _, err := launch(t, context.Background(), lease, time.Second, 300*time.Millisecond, "ignore-term")
	if !errors.Is(err, launcher.ErrLeaseExpired) {
		t.Fatalf("err = %v, want ErrLeaseExpired", err)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("status = %v, want killed by SIGKILL", ws)
	}
	if took := time.Since(begin); took < 1300*time.Millisecond {
		t.Errorf("killed after %s, before ttl+grace", took)
	}
}

func TestRunRunsWhileLeaseRenewed(t *testing.T) {
	lease := touchLease(t)
	ctx, cancel := context.WithCancel(context.Background())
	stopTouch := make(chan struct{})
	go func() {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		deadline := time.After(time.Second)
		for {
			select {
			case <-tk.C:
				now := time.Now()
				_ = os.Chtimes(lease, now, now)
			case <-deadline:
				cancel() // as the CLI does on SIGTERM
			case <-stopTouch:
				return
			}
		}
	}()
	defer close(stopTouch)
	begin := time.Now()
	ws, dir, err := launch(t, ctx, lease, time.Second, 5*time.Second, "run")
	if err != nil {
		t.Fatalf("err = %v, want nil (a renewed lease)", err)
	}
	if took := time.Since(begin); took < time.Second {
		t.Errorf("worker ended after %s, before the lease stopped being renewed", took)
	}
	if ws.ExitStatus() != 0 || termFiles(dir) != 1 {
		t.Errorf("SIGTERM not forwarded: status %v, %d drain marks", ws, termFiles(dir))
	}
}

func TestRunPassesExitStatus(t *testing.T) {
	ws, _, err := launch(t, context.Background(), touchLease(t), time.Minute, time.Second, "crash")
	if err != nil || ws.ExitStatus() != 3 {
		t.Errorf("status %v, err %v: want exit 3", ws, err)
	}
}

// A worker stopped for a lapsed lease ends the launcher with ExitLeaseLapsed, whatever the
// worker's own status, so that the agent can tell it from the worker's failure (and then
// check its own view of the lease: see agents' exit reason tests).
func TestMainExitsWithLapseStatus(t *testing.T) {
	lease := touchLease(t)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(lease, old, old); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HELPER_DIR", t.TempDir())
	t.Setenv("HELPER_MODE", "run")
	t.Setenv("STORMDOCK_JOB", "l")
	t.Setenv("STORMDOCK_WORKER", "0")
	var stderr strings.Builder
	code := launcher.Main([]string{"--lease", lease, "--ttl", "1s", "--grace", "5s", "--", stormdockBin, "helper"}, &stderr)
	if code != launcher.ExitLeaseLapsed {
		t.Fatalf("Main = %d, want %d (stderr: %s)", code, launcher.ExitLeaseLapsed, stderr.String())
	}
	if !strings.Contains(stderr.String(), "lapsed lease") {
		t.Errorf("stderr = %q, want it to say the lease lapsed", stderr.String())
	}
}
