package agents_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// stormdockBin is testdata/stormdock built for the tests: the agents under test run it as
// their own binary (Config.Self), so a job command [stormdock, helper] runs the test worker,
// as [stormdock, worker, ...] runs the real one, and `stormdock launch` is the real launcher.
var stormdockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agents-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stormdockBin = filepath.Join(dir, "stormdock")
	build := exec.Command("go", "build", "-o", stormdockBin, "./testdata/stormdock")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build testdata/stormdock: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// helperReport is what a helper worker writes when it starts.
type helperReport struct {
	PID  int               `json:"pid"`
	PPID int               `json:"ppid"`
	Env  map[string]string `json:"env"`
	At   time.Time         `json:"at"`
}
