package agents_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

// stormdockBin is testdata/stormdock built for the tests: the agents under test run it as
// their own binary (Config.Self), so a job command [stormdock, helper] runs the test worker,
// as [stormdock, worker, ...] runs the real one, and `stormdock launch` is the real launcher.
var stormdockBin string

// shimBin is cmd/stormdock-shim: the tests' drivers and agents start workers with it, as
// agents beside which it is installed do.
var shimBin string

func TestMain(m *testing.M) {
	var err error
	if stormdockBin, err = testenv.Build("./agents/testdata/stormdock"); err == nil {
		shimBin, err = testenv.Build("./cmd/stormdock-shim")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	removePushedImages()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// helperReport is what a helper worker writes when it starts.
type helperReport struct {
	PID  int               `json:"pid"`
	PPID int               `json:"ppid"`
	Env  map[string]string `json:"env"`
	At   time.Time         `json:"at"`
}
