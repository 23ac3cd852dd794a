package coordtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
)

// Environment of a child candidate process (see RunChildIfRequested).
const (
	envChild   = "COORDTEST_CHILD"
	envURL     = "COORDTEST_URL"
	envTimeout = "COORDTEST_SESSION_TIMEOUT"
	envPrefix  = "COORDTEST_PREFIX"
	envID      = "COORDTEST_ID"
	envCA      = "COORDTEST_CA" // zks:// stores: the CA file
	leadingMsg = "COORDTEST LEADING"
)

// RunChildIfRequested turns the test binary into a child candidate when started by
// StartChildLeader: it campaigns in the election named by its environment, prints a line
// when it leads and then waits to be killed. Call it first in TestMain; it returns at once
// in a normal test run.
func RunChildIfRequested() {
	if os.Getenv(envChild) != "campaign" {
		return
	}
	timeout, err := time.ParseDuration(os.Getenv(envTimeout))
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordtest child:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := coord.Open(ctx, os.Getenv(envURL), coord.Options{SessionTimeout: timeout, TLS: coord.TLSFiles{CA: os.Getenv(envCA)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordtest child:", err)
		os.Exit(2)
	}
	e, err := coord.NewElection(s, os.Getenv(envPrefix), os.Getenv(envID))
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordtest child:", err)
		os.Exit(2)
	}
	l, err := e.Campaign(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordtest child:", err)
		os.Exit(2)
	}
	fmt.Println(leadingMsg)
	<-l.Done()
	fmt.Fprintln(os.Stderr, "coordtest child: leadership lost")
	os.Exit(3)
}

// StartChildLeader re-executes the test binary (whose TestMain calls RunChildIfRequested)
// as a process that campaigns at prefix as id on the store at url, and returns once it
// leads. kill SIGKILLs it and reaps it; it also runs at test cleanup.
func StartChildLeader(t testing.TB, url string, sessionTimeout time.Duration, prefix, id string) (kill func()) {
	t.Helper()
	return StartChildLeaderTLS(t, url, "", sessionTimeout, prefix, id)
}

// StartChildLeaderTLS is StartChildLeader for a zks:// store whose servers' certificates
// caFile's CA signed.
func StartChildLeaderTLS(t testing.TB, url, caFile string, sessionTimeout time.Duration, prefix, id string) (kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCA+"="+caFile,
		envChild+"=campaign", envURL+"="+url, envTimeout+"="+sessionTimeout.String(),
		envPrefix+"="+prefix, envID+"="+id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child candidate: %v", err)
	}
	exited := make(chan struct{})
	leading := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == leadingMsg {
				close(leading)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(exited)
	}()
	killed := false
	kill = func() {
		if killed {
			return
		}
		killed = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	t.Cleanup(kill)
	select {
	case <-leading:
		return kill
	case <-exited:
		t.Fatalf("child candidate exited before leading: %s", stderr.String())
	case <-time.After(30 * time.Second):
		kill()
		t.Fatalf("child candidate did not lead within 30s: %s", stderr.String())
	}
	return kill
}
