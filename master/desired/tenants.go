package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// CreateTenant stores a new tenant, with uids from the default range (see CreateTenantIn).
func CreateTenant(ctx context.Context, s coord.KV, t cluster.TenantRecord) error {
	_, err := CreateTenantIn(ctx, s, t, cluster.DefaultTenantUIDs)
	return err
}

// uidAttempts bounds how often a creation or backfill tries again when another one took
// the counter between its read and its write. Each try takes one round trip, and writers
// that collided pause a random, growing time, so that many at once all get through.
const uidAttempts = 64

// CreateTenantIn stores a new tenant with the next uids of r (cluster.Tenant.UID): the
// counter's step and the tenant's creation are one transaction, so two creations never get
// one uid and a failed creation takes none. A uid in t is the caller's and ignored. It
// returns the tenant as stored.
func CreateTenantIn(ctx context.Context, s coord.KV, t cluster.TenantRecord, r cluster.UIDRange) (cluster.Tenant, error) {
	t.UID = 0
	if err := t.Validate(); err != nil {
		return cluster.Tenant{}, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if t.Created.IsZero() {
		t.Created = time.Now().UTC()
	}
	key, err := keyOf(cluster.TenantKey(t.Name))
	if err != nil {
		return cluster.Tenant{}, err
	}
	err = withUIDs(ctx, s, r, "tenant "+t.Name, func(uid int) coord.Op {
		t.UID = uid
		val, _ := json.Marshal(t)
		return coord.CreateOp(key, val, coord.Persistent)
	})
	if errors.Is(err, errTenantOp) && errors.Is(err, coord.ErrExists) {
		return cluster.Tenant{}, fmt.Errorf("%w: tenant %q already exists", api.ErrExists, t.Name)
	}
	if err != nil {
		return cluster.Tenant{}, fmt.Errorf("create tenant %s: %w", t.Name, err)
	}
	return t.Tenant, nil
}

// errTenantOp marks the failure of the tenant's own op in withUIDs' transaction (not the
// counter's).
var errTenantOp = errors.New("tenant record")

// withUIDs takes the next uids of r from the counter in one transaction with the op that
// op makes for them (the tenant's creation, or its backfill), and tries again while another
// writer moves the counter in between. The counter only grows: a range moved below it
// gives nothing twice; one moved above it starts at its first uid.
func withUIDs(ctx context.Context, s coord.KV, r cluster.UIDRange, what string, op func(uid int) coord.Op) error {
	for i := range uidAttempts {
		if i > 0 {
			pause := rand.N(min(2*time.Millisecond<<min(i-1, 6), 100*time.Millisecond)) + 1
			if err := ctxtime.Sleep(ctx, pause); err != nil {
				return err
			}
		}
		e, err := s.Get(ctx, cluster.TenantUIDsKey)
		exists := err == nil
		if err != nil && !errors.Is(err, coord.ErrNotFound) {
			return fmt.Errorf("read the tenants' uid counter: %w", err)
		}
		var c cluster.TenantUIDCounter
		if exists {
			if err := json.Unmarshal(e.Value, &c); err != nil {
				return fmt.Errorf("read the tenants' uid counter %s: %w", cluster.TenantUIDsKey, err)
			}
		}
		uid := max(c.Next, r.First)
		if uid+cluster.UIDsPerTenant-1 > r.Last {
			return fmt.Errorf("%w: the tenants' uid range %s is used up (the next free uid is %d, and uids are never given twice): restart the masters with a wider or another --tenant-uids range",
				api.ErrQuota, r, uid)
		}
		next, _ := json.Marshal(cluster.TenantUIDCounter{Next: uid + cluster.UIDsPerTenant})
		counter := coord.CreateOp(cluster.TenantUIDsKey, next, coord.Persistent)
		if exists {
			counter = coord.PutOp(cluster.TenantUIDsKey, next, e.Version)
		}
		_, err = s.Txn(ctx, counter, op(uid))
		var te *coord.TxnError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &te) && te.Index == 1:
			return fmt.Errorf("%w: %w", errTenantOp, err)
		case errors.Is(err, coord.ErrConflict), errors.Is(err, coord.ErrExists), errors.Is(err, coord.ErrNotFound):
			continue // another writer took the counter first: read it again
		default:
			return err
		}
	}
	return fmt.Errorf("%w: too many concurrent changes to the tenants' uids (for %s); try again", api.ErrBusy, what)
}

// BackfillTenantUIDs gives every tenant stored before uids existed its uids from r, each
// in one transaction with the counter's step and conditional on the record unchanged, and
// returns how many it gave. The leading master runs it at the start of its term, so that
// no tenant stays without: its workers are not placed until it has them.
func BackfillTenantUIDs(ctx context.Context, s coord.KV, r cluster.UIDRange) (int, error) {
	names, err := s.Children(ctx, cluster.TenantsKey)
	if err != nil {
		return 0, fmt.Errorf("list tenants: %w", err)
	}
	n := 0
	for _, name := range names {
		key, err := keyOf(cluster.TenantKey(name))
		if err != nil {
			continue
		}
		for {
			e, err := s.Get(ctx, key)
			if errors.Is(err, coord.ErrNotFound) {
				break // deleted meanwhile
			}
			if err != nil {
				return n, fmt.Errorf("read tenant %s: %w", name, err)
			}
			t, err := decodeTenant(name, e.Value, true)
			if err != nil {
				return n, err
			}
			if t.UID > 0 {
				break
			}
			err = withUIDs(ctx, s, r, "tenant "+name, func(uid int) coord.Op {
				t.UID = uid
				val, _ := json.Marshal(t)
				return coord.PutOp(key, val, e.Version)
			})
			if errors.Is(err, errTenantOp) && (errors.Is(err, coord.ErrConflict) || errors.Is(err, coord.ErrNotFound)) {
				continue // the record changed (or went) under us: read it again
			}
			if err != nil {
				return n, fmt.Errorf("give tenant %s its uids: %w", name, err)
			}
			n++
			break
		}
	}
	return n, nil
}

// ReadTenant returns a tenant's record and its entry (for its version).
func ReadTenant(ctx context.Context, s coord.KV, name string) (cluster.TenantRecord, coord.Entry, error) {
	key, err := keyOf(cluster.TenantKey(name))
	if err != nil {
		return cluster.TenantRecord{}, coord.Entry{}, err
	}
	e, err := s.Get(ctx, key)
	if err != nil && !errors.Is(err, coord.ErrNotFound) {
		return cluster.TenantRecord{}, e, fmt.Errorf("read tenant %s: %w", name, err)
	}
	t, err := decodeTenant(name, e.Value, err == nil)
	return t, e, err
}

// decodeTenant decodes a tenant's stored record; exists is false when there is none.
func decodeTenant(name string, val []byte, exists bool) (cluster.TenantRecord, error) {
	var t cluster.TenantRecord
	if !exists {
		return t, fmt.Errorf("%w: unknown tenant %q: create it first with `stormdock tenant create %s`", api.ErrNotFound, name, name)
	}
	if err := json.Unmarshal(val, &t); err != nil {
		return cluster.TenantRecord{}, fmt.Errorf("read tenant %s: %w", name, err)
	}
	return t, nil
}

// tenantUsage reads, fresh from the store, what the tenant's jobs ask for, leaving out the
// job named except (the one being scaled). A tenant without caps has no quota to check: its
// usage is not read, which would cost a read of every job for every submission (minutes for
// a thousand jobs).
func tenantUsage(ctx context.Context, s coord.KV, t cluster.TenantRecord, except string) (workers int, memory cluster.Bytes, err error) {
	if t.MaxWorkers <= 0 && t.MaxMemory <= 0 {
		return 0, 0, nil
	}
	tenant := t.Name
	names, err := s.Children(ctx, cluster.JobsKey)
	if err != nil {
		return 0, 0, fmt.Errorf("list jobs: %w", err)
	}
	for _, name := range names {
		key, kerr := cluster.JobKey(name)
		if name == except || kerr != nil {
			continue
		}
		e, err := s.Get(ctx, key)
		if errors.Is(err, coord.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("read job %s: %w", name, err)
		}
		var rec cluster.JobRecord
		if json.Unmarshal(e.Value, &rec) != nil || rec.Spec.Tenant != tenant {
			continue
		}
		w := rec.Spec.TotalWorkers()
		workers += w
		memory += cluster.Bytes(w) * rec.Spec.Resources.Memory
	}
	return workers, memory, nil
}

// checkQuota refuses a change that would take the tenant past its caps, with the numbers.
func checkQuota(t cluster.TenantRecord, usedW int, usedM cluster.Bytes, spec *cluster.JobSpec) error {
	w := spec.TotalWorkers()
	m := cluster.Bytes(w) * spec.Resources.Memory
	if t.MaxWorkers > 0 && usedW+w > t.MaxWorkers {
		return fmt.Errorf("%w: tenant %s: %d of %d workers used, asked for %d more", api.ErrQuota, t.Name, usedW, t.MaxWorkers, w)
	}
	if t.MaxMemory > 0 && usedM+m > t.MaxMemory {
		return fmt.Errorf("%w: tenant %s: %s of %s memory used, asked for %s more", api.ErrQuota, t.Name, usedM, t.MaxMemory, m)
	}
	return nil
}

// checkPriority refuses a spec asking for more than its tenant's priority cap, saying
// who may raise the cap and how.
func checkPriority(t cluster.TenantRecord, spec *cluster.JobSpec) error {
	if most := t.PriorityCap(); spec.Priority > most {
		return fmt.Errorf("%w: tenant %s may use priority up to %d, job %s asks for %d: lower the job's priority, or the admin raises the cap with `stormdock tenant update %s --max-priority %d`",
			api.ErrQuota, t.Name, most, spec.Name, spec.Priority, t.Name, spec.Priority)
	}
	return nil
}

// quotaOp is the transaction's guard on the tenant a job change was checked against. With
// caps, the tenant's version is bumped, so that two changes cannot both pass the quota on
// one reading of it; without caps there is no usage to count, and the record is only
// checked unchanged (its caps not set meanwhile): submissions of one tenant then do not
// conflict with each other, which made eight clients submitting at once fail with busy.
func quotaOp(t cluster.TenantRecord, key string, e coord.Entry) coord.Op {
	if t.MaxWorkers <= 0 && t.MaxMemory <= 0 {
		return coord.CheckOp(key, e.Version)
	}
	return coord.PutOp(key, e.Value, e.Version)
}

// UpdateTenant applies c (what the admin may change) to a tenant's record and returns the tenant as stored. Lowering a
// cap below what the tenant's jobs use or ask for is allowed: the jobs keep running (the
// placement caps their priority), and only changes that ask for more are refused.
func UpdateTenant(ctx context.Context, s coord.KV, name string, c api.TenantChange) (cluster.Tenant, error) {
	var out cluster.Tenant
	key, err := keyOf(cluster.TenantKey(name))
	if err != nil {
		return out, err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		t, err := decodeTenant(name, cur, exists)
		if err != nil {
			return nil, err
		}
		if c.MaxWorkers != nil {
			t.MaxWorkers = *c.MaxWorkers
		}
		if c.MaxMemory != nil {
			t.MaxMemory = *c.MaxMemory
		}
		if c.MaxPriority != nil {
			t.MaxPriority = *c.MaxPriority
		}
		// The uid is not the admin's to change: a tenant given another one would read the
		// files its old uid left on the nodes, or another tenant's.
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
		out = t.Tenant
		return json.Marshal(t)
	})
	if err != nil {
		return cluster.Tenant{}, busy(err, "tenant "+name)
	}
	return out, nil
}

// SetTenantToken makes a new token for a tenant, replacing the old one, and returns it.
func SetTenantToken(ctx context.Context, s coord.KV, name string) (string, error) {
	var token string
	key, err := keyOf(cluster.TenantKey(name))
	if err != nil {
		return "", err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		t, err := decodeTenant(name, cur, exists)
		if err != nil {
			return nil, err
		}
		token = api.NewToken()
		t.TokenHash = api.HashToken(token)
		return json.Marshal(t)
	})
	if err != nil {
		return "", busy(err, "tenant "+name)
	}
	return token, nil
}
