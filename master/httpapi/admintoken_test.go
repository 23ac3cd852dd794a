package httpapi_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master"
	"github.com/stormdock/stormdock/master/httpapi"
)

// adminReads counts the reads of the admin token's key.
type adminReads struct {
	coord.Store
	n atomic.Int64
}

func (s *adminReads) Get(ctx context.Context, key string) (coord.Entry, error) {
	if key == cluster.AdminTokenKey {
		s.n.Add(1)
	}
	return s.Store.Get(ctx, key)
}

// The admin token is checked against the master's watch of its hash, not read from the store
// for every request; a new token replaces the old one at once all the same.
func TestAdminTokenFromTheWatch(t *testing.T) {
	tc := clustertest.NewSim(t)
	token := tc.AdminToken()
	st := &adminReads{Store: tc.Connect(-1)}
	m, err := master.New(st, master.Config{ID: "m1", Debounce: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(tc.Ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	srv, _ := tc.API(m, httpapi.Config{})
	testenv.Eventually(t, "the master watching the admin token", 10*time.Second, func() bool {
		h, ok := m.AdminTokenHash()
		return ok && string(h) == api.HashToken(token)
	})
	cl, _ := api.NewClient(srv.URL, token)
	before := st.n.Load()
	for range 50 {
		if _, err := cl.Tenants(tc.Ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := st.n.Load() - before; n != 0 {
		t.Errorf("50 requests with the admin token read it from the store %d times; want 0", n)
	}

	// A new admin token: the old one is refused and the new one taken, without a restart.
	next := tc.AdminToken()
	testenv.EventuallyWith(t, "the new admin token taken, the old one refused", 10*time.Second, func() (bool, string) {
		_, errOld := cl.Tenants(tc.Ctx)
		nc, _ := api.NewClient(srv.URL, next)
		_, errNew := nc.Tenants(tc.Ctx)
		return errNew == nil && errOld != nil, fmt.Sprintf("old: %v, new: %v", errOld, errNew)
	})
}
