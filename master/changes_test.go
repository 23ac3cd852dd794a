package master_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
	"github.com/stormdock/stormdock/master/desired"
)

// TestWaitChange: WaitChange returns once the master's state changed past the index given
// (a job submitted, and the leader's publish of its plan), with a greater index; with no
// change it waits until its context ends.
func TestWaitChange(t *testing.T) {
	tc := clustertest.NewSim(t)
	m, _, _ := tc.Master("m1")
	for _, n := range clustertest.Nodes(1, 1, 2) {
		tc.Node(n)
	}
	testenv.Eventually(t, "the master sees 2 nodes", 5*time.Second, func() bool { return len(m.NodeEntries()) == 2 })
	if err := desired.CreateTenant(tc.Ctx, tc.Admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	tc.Reconciled(m)

	// Nothing changes (once the start's last publishes are in): the wait lasts until its
	// context ends, and returns the same index.
	var idx uint64
	testenv.EventuallyWith(t, "a wait of 200ms with nothing changing", 5*time.Second, func() (bool, string) {
		idx = m.ChangeIndex()
		ctx, cancel := context.WithTimeout(tc.Ctx, 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		got, err := m.WaitChange(ctx, idx)
		switch {
		case err == nil && got > idx:
			return false, fmt.Sprintf("changed: %d to %d", idx, got) // still settling
		case err == nil || got != idx || time.Since(start) < 200*time.Millisecond:
			t.Fatalf("WaitChange(%d) returned %d, %v after %s without a change", idx, got, err, time.Since(start))
		}
		return true, ""
	})

	// A submit changes the jobs' mirror, and the leader plans and publishes.
	type result struct {
		idx uint64
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := m.WaitChange(tc.Ctx, idx)
		done <- result{got, err}
	}()
	if _, err := desired.SubmitJob(tc.Ctx, tc.Admin, clustertest.Spec("web", 2)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.idx <= idx {
			t.Fatalf("WaitChange after a submit: index %d (was %d), err %v", r.idx, idx, r.err)
		}
	case <-time.After(testenv.Timeout(5 * time.Second)):
		t.Fatal("WaitChange did not return after a submit")
	}
	testenv.Eventually(t, "the index grows with the plan's publish", 5*time.Second, func() bool {
		return m.ChangeIndex() > idx+1
	})
	// An index behind the master's is answered at once.
	if got, err := m.WaitChange(tc.Ctx, 0); err != nil || got == 0 {
		t.Fatalf("WaitChange(0): %d %v", got, err)
	}
}
