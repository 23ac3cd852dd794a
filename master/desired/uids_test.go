package desired

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// uidStores opens the store kinds the uid allocation runs on: the embedded one and
// ZooKeeper (its own chroot, removed at the end).
func uidStores(t *testing.T) map[string]func(t *testing.T) coord.KV {
	return map[string]func(t *testing.T) coord.KV{
		"embedded": func(t *testing.T) coord.KV { return newTestStore(t).admin },
		"zookeeper": func(t *testing.T) coord.KV {
			addr := testenv.ZKAddr(t)
			chroot := fmt.Sprintf("/stormdock-test/%s-%x", strings.ReplaceAll(t.Name(), "/", "_"), rand.Uint64())
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(30*time.Second))
			defer cancel()
			quiet := coord.Options{Logger: slog.New(slog.DiscardHandler)}
			s, err := coord.Open(ctx, "zk://"+addr+chroot, quiet)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				s.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if root, err := coord.OpenZK(ctx, []string{addr}, "", quiet); err == nil {
					_ = coord.DeleteTree(ctx, root, chroot)
					root.Close()
				}
			})
			if _, err := s.Create(ctx, cluster.TenantsKey, nil, coord.Persistent); err != nil && !errors.Is(err, coord.ErrExists) {
				t.Fatal(err)
			}
			return s
		},
	}
}

// TestTenantUIDs: concurrent creations get distinct uid pairs from the range, in one
// transaction with the record (a refused creation takes none), a uid in the request is
// ignored, a deleted tenant's uids are never given again, a used-up range is a one-line
// error that creates nothing, and a record stored before uids existed is backfilled from
// the same counter.
func TestTenantUIDs(t *testing.T) {
	for name, open := range uidStores(t) {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			ctx := context.Background()
			r := cluster.UIDRange{First: 300000, Last: 300000 + 2*12 - 1} // room for 12 tenants

			const n = 8
			var wg sync.WaitGroup
			got := make([]cluster.Tenant, n)
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: fmt.Sprintf("t%d", i), UID: 1}}, r)
				}()
			}
			wg.Wait()
			seen := map[int]string{}
			for i, tn := range got {
				if errs[i] != nil {
					t.Fatalf("create t%d: %v", i, errs[i])
				}
				stored, _, err := ReadTenant(ctx, s, tn.Name)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case stored.UID != tn.UID:
					t.Errorf("%s: created with uid %d, stored with %d", tn.Name, tn.UID, stored.UID)
				case !r.Contains(tn.UID) || !r.Contains(tn.RouterUID()) || (tn.UID-r.First)%2 != 0:
					t.Errorf("%s: uid %d (routers %d) is not a pair of the range %s", tn.Name, tn.UID, tn.RouterUID(), r)
				}
				for _, u := range []int{tn.UID, tn.RouterUID()} {
					if other, dup := seen[u]; dup {
						t.Errorf("uid %d given to %s and %s", u, other, tn.Name)
					}
					seen[u] = tn.Name
				}
			}

			// A creation refused (the name is taken) takes no uid; a deleted tenant's are
			// not given again.
			if _, err := CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "t0"}}, r); !errors.Is(err, api.ErrExists) {
				t.Fatalf("create t0 twice: %v, want ErrExists", err)
			}
			key, _ := cluster.TenantKey("t0")
			if err := s.Delete(ctx, key, coord.AnyVersion); err != nil {
				t.Fatal(err)
			}
			again, err := CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "t0"}}, r)
			if err != nil {
				t.Fatal(err)
			}
			if want := r.First + 2*n; again.UID != want {
				t.Errorf("t0 created again got uid %d; want %d, the next never given (the refused creation took none, the deleted one's stay taken)", again.UID, want)
			}

			// Records stored before uids: the backfill gives them the next pairs.
			for _, old := range []string{"old1", "old2"} {
				k, _ := cluster.TenantKey(old)
				if _, err := s.Create(ctx, k, []byte(`{"name":"`+old+`","maxPriority":0,"created":"2026-01-01T00:00:00Z"}`), coord.Persistent); err != nil {
					t.Fatal(err)
				}
			}
			filled, err := BackfillTenantUIDs(ctx, s, r)
			if err != nil || filled != 2 {
				t.Fatalf("backfill: %d, %v; want 2 tenants", filled, err)
			}
			for i, old := range []string{"old1", "old2"} {
				tn, _, err := ReadTenant(ctx, s, old)
				if err != nil {
					t.Fatal(err)
				}
				if _, dup := seen[tn.UID]; dup || tn.UID < again.UID+2 || !r.Contains(tn.RouterUID()) {
					t.Errorf("backfilled %s: uid %d; want a pair of %s above %d never given", old, tn.UID, r, again.UID)
				}
				seen[tn.UID] = old
				_ = i
			}
			if filled, err := BackfillTenantUIDs(ctx, s, r); err != nil || filled != 0 {
				t.Errorf("second backfill: %d, %v; want nothing to do", filled, err)
			}

			// 9 + 2 tenants took 22 of 24 uids: one more fits, then the range is used up.
			if _, err := CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "last"}}, r); err != nil {
				t.Fatalf("the range's last pair: %v", err)
			}
			_, err = CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "over"}}, r)
			if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "used up") || !strings.Contains(err.Error(), "--tenant-uids") {
				t.Fatalf("create past the range: %v; want a one-line error naming --tenant-uids", err)
			}
			if _, _, err := ReadTenant(ctx, s, "over"); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("a tenant refused for want of uids was stored: %v", err)
			}
			// A wider range goes on from the counter, giving nothing twice.
			wide := cluster.UIDRange{First: r.First, Last: r.Last + 100}
			more, err := CreateTenantIn(ctx, s, cluster.TenantRecord{Tenant: cluster.Tenant{Name: "over"}}, wide)
			if err != nil || more.UID != r.Last+1 {
				t.Errorf("create in the widened range: uid %d, %v; want %d", more.UID, err, r.Last+1)
			}
		})
	}
}

// TestUIDRange: the --tenant-uids value is checked at start, each refusal one line saying
// what to do.
func TestUIDRange(t *testing.T) {
	for _, c := range []struct {
		in   string
		self int
		want string // "" : valid
	}{
		{"200000-299999", 0, ""},
		{"1000-1001", 0, ""},
		{"200000-299999", 250000, "runs as"},
		{"0-100000", 0, "below 1000"},
		{"999-5000", 0, "below 1000"},
		{"60000-70000", 0, "65534"},
		{"5000-5000", 0, "fewer than"},
		{"5000-4000", 0, "fewer than"},
		{"5000", 0, "FIRST-LAST"},
		{"a-b", 0, "FIRST-LAST"},
		{"2000-4294967295", 0, "ends above"},
	} {
		_, err := cluster.ParseUIDRange(c.in, c.self)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.in, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n")):
			t.Errorf("%s (self %d): %v; want one line with %q", c.in, c.self, err, c.want)
		}
	}
}
