package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// testStore is an embedded store with the master's directories, and an admin client.
type testStore struct {
	t     testing.TB
	srv   *coord.Server
	ctx   context.Context
	admin *coord.Embedded
}

func newTestStore(t testing.TB) *testStore {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	srv, err := coord.NewServer(coord.ServerOptions{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		srv.Close()
	})
	tc := &testStore{t: t, srv: srv, ctx: ctx}
	tc.admin = tc.connect(-1)
	for _, k := range []string{cluster.JobsKey, cluster.TenantsKey, cluster.NodeConfsKey, cluster.DCsKey, cluster.HistoryKey} {
		if _, err := tc.admin.Create(ctx, k, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
			t.Fatal(err)
		}
	}
	return tc
}

func (tc *testStore) connect(timeout time.Duration) *coord.Embedded {
	c, err := tc.srv.Connect(coord.Options{SessionTimeout: timeout, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c
}

func testSpec(name string, workers int) *cluster.JobSpec {
	return &cluster.JobSpec{Name: name, Tenant: "search", Workers: workers,
		Resources: cluster.Resources{Memory: 64 << 20, CPU: 100}, Command: []string{"sleep", "1000"},
		Placement: cluster.PlacementSpec{Spread: []string{"dc", "rack"}}}
}

// conflictingKV is a store on which every conditional write meets another writer.
type conflictingKV struct{ coord.KV }

func (conflictingKV) Put(context.Context, string, []byte, int64) (int64, error) {
	return 0, coord.ErrConflict
}

func (conflictingKV) Txn(context.Context, ...coord.Op) ([]coord.OpResult, error) {
	return nil, coord.ErrConflict
}

// TestStoreWritesReportContentionAsBusy: every read-modify-write of the master's records
// gives up after a bounded number of conflicts with api.ErrBusy, which the API answers with 503.
func TestStoreWritesReportContentionAsBusy(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := SubmitJob(tc.ctx, tc.admin, testSpec("wc", 2)); err != nil {
		t.Fatal(err)
	}
	if err := PutDC(tc.ctx, tc.admin, cluster.DCRecord{Name: "dc-a", State: cluster.DCActive}); err != nil {
		t.Fatal(err)
	}
	if err := UpdateNodeConf(tc.ctx, tc.admin, "n1", func(*cluster.NodeConf) {}); err != nil {
		t.Fatal(err)
	}
	kv := conflictingKV{tc.admin}
	tests := []struct {
		name string
		do   func(ctx context.Context) error
		what string
	}{
		{"submit", func(ctx context.Context) error { _, err := SubmitJob(ctx, kv, testSpec("wc2", 1)); return err }, "tenant search"},
		{"scale", func(ctx context.Context) error { _, err := ScaleJob(ctx, kv, "wc", 3); return err }, "job wc"},
		{"kill", func(ctx context.Context) error { _, err := KillJob(ctx, kv, "wc", 0); return err }, "job wc"},
		{"node settings", func(ctx context.Context) error {
			return UpdateNodeConf(ctx, kv, "n1", func(c *cluster.NodeConf) { c.Draining = true })
		}, "node n1"},
		{"tenant token", func(ctx context.Context) error { _, err := SetTenantToken(ctx, kv, "search"); return err }, "tenant search"},
		{"data center", func(ctx context.Context) error {
			_, err := SetDCState(ctx, kv, "dc-a", cluster.DCFailed, false)
			return err
		}, "data center dc-a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do(tc.ctx)
			if !errors.Is(err, api.ErrBusy) || !strings.Contains(err.Error(), "too many concurrent changes to "+tt.what) {
				t.Fatalf("err = %v, want api.ErrBusy about %s", err, tt.what)
			}
		})
	}
}

// TestConcurrentSubmitsKeepTheQuota: submits racing for one tenant's last workers each read
// the quota afresh after a conflict, so together they never take more than the cap.
func TestConcurrentSubmitsKeepTheQuota(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search", MaxWorkers: 10}}); err != nil {
		t.Fatal(err)
	}
	const submits = 8 // of 2 workers each: 5 fit
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		placed int
	)
	for i := range submits {
		c := tc.connect(-1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := SubmitJob(tc.ctx, c, testSpec(fmt.Sprintf("job-%d", i), 2))
				switch {
				case errors.Is(err, api.ErrBusy):
					time.Sleep(time.Millisecond)
					continue
				case err == nil:
					mu.Lock()
					placed++
					mu.Unlock()
				case !errors.Is(err, api.ErrQuota):
					t.Errorf("submit %d: %v", i, err)
				}
				return
			}
		}()
	}
	wg.Wait()
	if placed != 5 {
		t.Fatalf("%d of %d submits accepted, want exactly the 5 that fit the quota", placed, submits)
	}
}

// TestConcurrentSubmitsWithoutCaps: submits of a tenant without caps have no quota to share:
// they leave its record as it is, so that many at once do not conflict on it (over
// ZooKeeper, eight clients submitting at once were answered busy).
func TestConcurrentSubmitsWithoutCaps(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	tenantKey, _ := cluster.TenantKey("search")
	before, err := tc.admin.Get(tc.ctx, tenantKey)
	if err != nil {
		t.Fatal(err)
	}
	const submits = 16
	var wg sync.WaitGroup
	for i := range submits {
		c := tc.connect(-1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 20 {
				if _, err := SubmitJob(tc.ctx, c, testSpec(fmt.Sprintf("job-%d-%d", i, r), 2)); err != nil {
					t.Errorf("submit %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	names, err := tc.admin.Children(tc.ctx, cluster.JobsKey)
	if err != nil || len(names) != submits*20 {
		t.Fatalf("%d jobs stored (%v), want %d", len(names), err, submits*20)
	}
	if after, err := tc.admin.Get(tc.ctx, tenantKey); err != nil || after.Version != before.Version {
		t.Fatalf("tenant record went from version %d to %d (%v): submits without caps changed it", before.Version, after.Version, err)
	}
}

// TestConcurrentNodeConfUpdates: operators and the master changing one node's settings at
// once, starting with no settings at all, lose none of the changes.
func TestConcurrentNodeConfUpdates(t *testing.T) {
	tc := newTestStore(t)
	const writers = 8
	var wg sync.WaitGroup
	want := make([]string, writers)
	for i := range writers {
		c := tc.connect(-1)
		want[i] = fmt.Sprintf("job-%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := UpdateNodeConf(tc.ctx, c, "n1", func(nc *cluster.NodeConf) { nc.Avoid = append(nc.Avoid, want[i]) })
				if errors.Is(err, api.ErrBusy) {
					continue
				}
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
				}
				return
			}
		}()
	}
	wg.Wait()
	e, err := tc.admin.Get(tc.ctx, cluster.NodeConfsKey+"/n1")
	if err != nil {
		t.Fatal(err)
	}
	var got cluster.NodeConf
	if err := json.Unmarshal(e.Value, &got); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got.Avoid)
	if !slices.Equal(got.Avoid, want) {
		t.Fatalf("avoid = %v, want %v: an update was lost", got.Avoid, want)
	}
}

// TestDockerJobWithoutCommandAccepted: a docker job without a command runs its image's own
// entrypoint and cmd (under the lease launcher, see agents): the spec is valid and stored.
// Whether the image has a command at all is the master's check (master.CheckImageCommand).
func TestDockerJobWithoutCommandAccepted(t *testing.T) {
	tc := newTestStore(t)
	if err := CreateTenant(tc.ctx, tc.admin, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "search"}}); err != nil {
		t.Fatal(err)
	}
	spec := testSpec("dkjob", 1)
	spec.Isolation, spec.Image, spec.Command = cluster.IsolationDocker, "127.0.0.1:5055/w:1", nil
	if _, err := SubmitJob(tc.ctx, tc.admin, spec); err != nil {
		t.Fatalf("submit: %v", err)
	}
	if rec, _, err := ReadJob(tc.ctx, tc.admin, "dkjob"); err != nil || len(rec.Spec.Command) != 0 {
		t.Errorf("stored: %+v, %v; want the job without a command", rec.Spec, err)
	}
}

// TestEndRebalanceNeverUndoesAFail: the leader clears a restore's rebalance request with
// compare-and-set, and only while the record still asks for it: a `dc fail` written since
// the leader read the record stays (a blind write of the record read would undo it).
func TestEndRebalanceNeverUndoesAFail(t *testing.T) {
	tc := newTestStore(t)
	if err := PutDC(tc.ctx, tc.admin, cluster.DCRecord{Name: "dc-a", State: cluster.DCActive, Rebalance: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := SetDCState(tc.ctx, tc.admin, "dc-a", cluster.DCFailed, false); err != nil {
		t.Fatal(err)
	}
	for _, tc2 := range []struct {
		name      string
		before    func()
		wantDone  bool
		wantState string
	}{
		{"failed meanwhile", func() {}, false, cluster.DCFailed},
		{"restored with rebalance", func() {
			if _, err := SetDCState(tc.ctx, tc.admin, "dc-a", cluster.DCActive, true); err != nil {
				t.Fatal(err)
			}
		}, true, cluster.DCActive},
	} {
		t.Run(tc2.name, func(t *testing.T) {
			tc2.before()
			done, err := EndRebalance(tc.ctx, tc.admin, "dc-a")
			if err != nil || done != tc2.wantDone {
				t.Fatalf("EndRebalance = %v, %v; want %v", done, err, tc2.wantDone)
			}
			e, err := tc.admin.Get(tc.ctx, "/dcs/dc-a")
			if err != nil {
				t.Fatal(err)
			}
			var rec cluster.DCRecord
			if err := json.Unmarshal(e.Value, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.State != tc2.wantState || rec.Rebalance {
				t.Errorf("record %+v; want state %s without a rebalance asked", rec, tc2.wantState)
			}
		})
	}
}
