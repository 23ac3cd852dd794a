package agents

import (
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
)

func TestKeeperCanRun(t *testing.T) {
	now := time.Now()
	timeout := cluster.Duration(2 * time.Second)
	for _, c := range []struct {
		name string
		st   KeeperStatus
		want bool
	}{
		{"live", KeeperStatus{State: KeeperLive, Session: 1}, true},
		{"live without a session", KeeperStatus{State: KeeperLive}, false},
		{"store down", KeeperStatus{State: KeeperStoreDown, Session: 1, Stamp: now}, true},
		{"silent, lease held", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, Stamp: now.Add(-time.Second)}, true},
		{"silent, lease lapsed", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: timeout, Stamp: now.Add(-3 * time.Second)}, false},
		{"disconnected", KeeperStatus{State: KeeperDisconnected, Session: 1, Stamp: now}, false},
		// Asked 8s, granted 2s: the lease lapsed 2s after the stamp, not 8s.
		{"silent, granted less, lapsed", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: cluster.Duration(8 * time.Second),
			Granted: timeout, Stamp: now.Add(-3 * time.Second)}, false},
		{"silent, granted less, held", KeeperStatus{State: KeeperSilent, Session: 1, SessionTimeout: cluster.Duration(8 * time.Second),
			Granted: timeout, Stamp: now.Add(-time.Second)}, true},
	} {
		if got := c.st.canRun(); got != c.want {
			t.Errorf("%s: canRun = %v, want %v", c.name, got, c.want)
		}
	}
}
