package agents

import (
	"testing"
	"time"

	"github.com/stormdock/stormdock/agents/leasefile"
	"github.com/stormdock/stormdock/cluster"
)

func TestKeeperCanRun(t *testing.T) {
	wall := time.Now()
	const now = time.Hour // on the boot clock
	boot := leasefile.BootID()
	timeout := cluster.Duration(2 * time.Second)
	for _, c := range []struct {
		name string
		st   KeeperStatus
		want bool
	}{
		{"live", KeeperStatus{State: KeeperLive, Session: 1}, true},
		{"live without a session", KeeperStatus{State: KeeperLive}, false},
		{"store down", KeeperStatus{State: KeeperStoreDown, Session: 1, StampBoot: now}, true},
		{"silent, lease held", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, StampBoot: now - time.Second, Boot: boot}, true},
		{"silent, lease lapsed", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, StampBoot: now - 3*time.Second, Boot: boot}, false},
		{"silent, stamped in another boot", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, StampBoot: now,
			Boot: "0123456789abcdef0123456789abcdef"}, boot == ""},
		// The wall-clock stamp says nothing once there is one on the boot clock: a clock
		// stepped back does not make a lapsed lease look held.
		{"silent, lapsed, wall clock stepped back", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout,
			StampBoot: now - 3*time.Second, Boot: boot, Stamp: wall.Add(time.Hour)}, false},
		{"silent, keeper older than boot stamps, held", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, Stamp: wall.Add(-time.Second)}, true},
		{"silent, keeper older than boot stamps, lapsed", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, Stamp: wall.Add(-3 * time.Second)}, false},
		{"disconnected", KeeperStatus{State: KeeperDisconnected, Session: 1, StampBoot: now}, false},
		// Asked 8s, granted 2s: the lease lapsed 2s after the stamp, not 8s.
		{"silent, granted less, lapsed", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: cluster.Duration(8 * time.Second),
			Granted: timeout, StampBoot: now - 3*time.Second, Boot: boot}, false},
		{"silent, granted less, held", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: cluster.Duration(8 * time.Second),
			Granted: timeout, StampBoot: now - time.Second, Boot: boot}, true},
	} {
		if got := c.st.canRun(now); got != c.want {
			t.Errorf("%s: canRun = %v, want %v", c.name, got, c.want)
		}
	}
}
