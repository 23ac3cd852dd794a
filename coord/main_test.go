package coord_test

import (
	"os"
	"testing"

	"github.com/stormdock/stormdock/coord/coordtest"
)

func TestMain(m *testing.M) {
	coordtest.RunChildIfRequested() // the leader-kill tests re-execute this binary
	os.Exit(m.Run())
}
