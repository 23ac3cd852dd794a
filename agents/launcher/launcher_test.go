package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/launcher"
	"github.com/stormdock/stormdock/agents/leasefile"
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

// bootClock is a boot clock the test moves.
type bootClock struct{ now atomic.Int64 }

func (c *bootClock) Now() time.Duration { return time.Duration(c.now.Load()) }

// launchOn runs the launcher in-process on clock, around a helper worker that runs until
// SIGTERM, in the background; the result comes on the channel.
func launchOn(t *testing.T, lease string, ttl time.Duration, clock leasefile.Clock) (dir string, done <-chan error) {
	t.Helper()
	dir = t.TempDir()
	t.Setenv("HELPER_DIR", dir)
	t.Setenv("HELPER_MODE", "run")
	t.Setenv("STORMDOCK_JOB", "l")
	t.Setenv("STORMDOCK_WORKER", "0")
	ch := make(chan error, 1)
	go func() {
		_, err := launcher.Run(context.Background(), launcher.Config{Lease: lease, TTL: ttl, Grace: 5 * time.Second,
			Command: []string{stormdockBin, "helper"}, Clock: clock, Check: 10 * time.Millisecond})
		ch <- err
	}()
	return dir, ch
}

// recordedLease is a lease file with a record of generation 1 stamped at an hour on clock
// (set there), its modification time mtime; the writer renews it.
func recordedLease(t *testing.T, clock *bootClock, mtime time.Time) (string, *leasefile.Writer) {
	t.Helper()
	lease := touchLease(t)
	clock.now.Store(int64(time.Hour))
	w, err := leasefile.OpenWriter(lease)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	if err := w.Write(leasefile.Record{Boot: leasefile.BootID(), Gen: 1, Stamp: time.Hour}, mtime); err != nil {
		t.Fatal(err)
	}
	return lease, w
}

// waitLapse waits for a launcher's end (done) and wants it stopped for its lease.
func waitLapse(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, launcher.ErrLeaseExpired) {
			t.Fatalf("err = %v, want ErrLeaseExpired", err)
		}
	case <-time.After(testenv.Timeout(20 * time.Second)):
		t.Fatal("worker not stopped " + what)
	}
}

// startedHelpers counts the helper's start reports in dir.
func startedHelpers(dir string) int {
	ms, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	return len(ms)
}

// The launcher judges a lease by its record on the boot clock: the file's modification time
// (which older launchers read, and which the wall clock's steps move) says nothing. It stops
// the worker once the record's stamp is older than the ttl on that clock.
func TestRunJudgesTheRecordOnTheBootClock(t *testing.T) {
	clock := &bootClock{}
	// An mtime a day old (the wall clock stepped forward): the record is fresh.
	lease, _ := recordedLease(t, clock, time.Now().Add(-24*time.Hour))
	dir, done := launchOn(t, lease, time.Second, clock.Now)
	testenv.Eventually(t, "worker started", 10*time.Second, func() bool { return startedHelpers(dir) == 1 })
	// The boot clock moves within the ttl: the worker runs on, however the wall clock goes.
	clock.now.Add(int64(900 * time.Millisecond))
	testenv.AssertUntil(t, "worker runs within its lease", 300*time.Millisecond, func() (bool, string) {
		select {
		case err := <-done:
			return false, fmt.Sprintf("launcher ended (%v) with the lease 900ms old of 1s", err)
		default:
			return true, ""
		}
	})
	// Past the ttl: stopped, whatever the modification time (now an hour ahead).
	now := time.Now().Add(time.Hour)
	if err := os.Chtimes(lease, now, now); err != nil {
		t.Fatal(err)
	}
	clock.now.Add(int64(200 * time.Millisecond))
	waitLapse(t, done, "with its lease past the ttl on the boot clock")
}

// A lease renewed in another generation lapsed meanwhile: the worker stops even though the
// launcher never saw it lapsed (the keeper renewed it first, as after a suspend).
func TestRunStopsWorkerOnANewGeneration(t *testing.T) {
	clock := &bootClock{}
	lease, w := recordedLease(t, clock, time.Now())
	dir, done := launchOn(t, lease, time.Second, clock.Now)
	testenv.Eventually(t, "worker started", 10*time.Second, func() bool { return startedHelpers(dir) == 1 })
	if err := w.Write(leasefile.Record{Boot: leasefile.BootID(), Gen: 2, Stamp: time.Hour}, time.Now()); err != nil {
		t.Fatal(err)
	}
	waitLapse(t, done, "after its lease was renewed in a new generation")
	if termFiles(dir) != 1 {
		t.Error("worker not given SIGTERM to drain")
	}
}
