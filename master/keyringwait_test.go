package master_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/keyring"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
)

// keyringOutage is a store whose reads of the keyring's check values fail as an outage
// would, the first fails times: the store lost right after the master made its directories.
type keyringOutage struct {
	coord.Store
	fails atomic.Int32
	tries atomic.Int32
}

func (s *keyringOutage) Get(ctx context.Context, key string) (coord.Entry, error) {
	if key == cluster.SecretsKeyringKey {
		if s.tries.Add(1) <= s.fails.Load() {
			return coord.Entry{}, coord.ErrUnavailable
		}
	}
	return s.Store.Get(ctx, key)
}

// A master with a keyring whose store goes away between making the directories and checking
// the keyring waits for it, as it does for the directories, and then leads: it does not exit
// (systemd would only start it again into the same outage).
func TestMasterWaitsOutTheStoreAtTheKeyringCheck(t *testing.T) {
	tc := clustertest.NewSim(t)
	path := filepath.Join(t.TempDir(), "secrets.key")
	if _, err := keyring.Generate(path); err != nil {
		t.Fatal(err)
	}
	ring, err := keyring.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st := &keyringOutage{Store: tc.Connect(-1)}
	st.fails.Store(2)
	m, err := master.New(st, master.Config{ID: "m1", Keyring: ring, Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tc.Ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	testenv.EventuallyWith(t, "the master leading after the keyring check's outage", 30*time.Second, func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("the master exited during the outage: %v", err)
		default:
		}
		return m.Leader(), "not leading yet"
	})
	if n := st.tries.Load(); n < 3 {
		t.Errorf("the keyring's checks were read %d times; want the 2 failures and a success", n)
	}
	if _, err := tc.Admin.Get(tc.Ctx, cluster.SecretsKeyringKey); err != nil {
		t.Errorf("the keyring's checks were not written after the outage: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}

}
