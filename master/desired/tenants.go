package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// CreateTenant stores a new tenant.
func CreateTenant(ctx context.Context, s coord.KV, t cluster.TenantRecord) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if t.Created.IsZero() {
		t.Created = time.Now().UTC()
	}
	val, _ := json.Marshal(t)
	key, err := keyOf(cluster.TenantKey(t.Name))
	if err != nil {
		return err
	}
	_, err = s.Create(ctx, key, val, coord.Persistent)
	if errors.Is(err, coord.ErrExists) {
		return fmt.Errorf("%w: tenant %q already exists", api.ErrExists, t.Name)
	}
	if err != nil {
		return fmt.Errorf("create tenant %s: %w", t.Name, err)
	}
	return nil
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
