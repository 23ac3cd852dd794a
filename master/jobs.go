package master

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

// busy reports a read-modify-write that kept meeting other writers (coord.ErrContended) as
// api.ErrBusy, which the API answers with 503 so that the client tries again; what names the
// record. Other errors pass unchanged.
func busy(err error, what string) error {
	if errors.Is(err, coord.ErrContended) {
		return fmt.Errorf("%w: too many concurrent changes to %s; try again", api.ErrBusy, what)
	}
	return err
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

// readTenant returns the tenant record and its entry (for its version).
func readTenant(ctx context.Context, s coord.KV, name string) (cluster.TenantRecord, coord.Entry, error) {
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

// SubmitJob stores a new job after checking its tenant's quota. The tenant record's
// version is bumped in the same transaction, so two submits for one tenant cannot both
// pass the quota on the same reading.
func SubmitJob(ctx context.Context, s coord.KV, spec *cluster.JobSpec) (cluster.JobRecord, error) {
	return SubmitJobPinned(ctx, s, spec, nil)
}

// SubmitJobPinned is SubmitJob with the image pin of its first generation (see pinImage).
func SubmitJobPinned(ctx context.Context, s coord.KV, spec *cluster.JobSpec, pin *cluster.ImagePin) (cluster.JobRecord, error) {
	return SubmitJobAs(ctx, s, spec, pin, "")
}

// SubmitJobAs is SubmitJobPinned recording who submitted in the job's history.
func SubmitJobAs(ctx context.Context, s coord.KV, spec *cluster.JobSpec, pin *cluster.ImagePin, who string) (cluster.JobRecord, error) {
	if err := spec.Validate(); err != nil {
		return cluster.JobRecord{}, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	var rec cluster.JobRecord
	jobKey, err := keyOf(cluster.JobKey(spec.Name))
	if err != nil {
		return rec, err
	}
	tenantKey, err := keyOf(cluster.TenantKey(spec.Tenant))
	if err != nil {
		return rec, err
	}
	historyKey, err := keyOf(cluster.JobHistoryKey(spec.Name))
	if err != nil {
		return rec, err
	}
	err = coord.Retry(ctx, func() error {
		t, te, err := readTenant(ctx, s, spec.Tenant)
		if err != nil {
			return err
		}
		if _, err := s.Get(ctx, jobKey); err == nil {
			return fmt.Errorf("%w: job %q already exists: scale it with `stormdock job scale` or kill it first", api.ErrExists, spec.Name)
		}
		usedW, usedM, err := tenantUsage(ctx, s, t, "")
		if err != nil {
			return err
		}
		if err := checkQuota(t, usedW, usedM, spec); err != nil {
			return err
		}
		now := time.Now().UTC()
		rec = cluster.JobRecord{Spec: *spec, Generation: 1, Epoch: 1, State: cluster.JobRunning, Image: pin, Submitted: now, Updated: now}
		if spec.Mirrored() {
			if rec.OutputTokenHash, err = outputTokenHash(ctx, s, rec); err != nil {
				return err
			}
		}
		val, _ := json.Marshal(rec)
		hist, _ := json.Marshal(cluster.JobHistory{Job: spec.Name, Generations: []cluster.GenerationRecord{
			{Generation: 1, Spec: *spec, Image: pin, At: now, Who: who, Kind: "submit"}}})
		ops := []coord.Op{quotaOp(t, tenantKey, te), coord.CreateOp(jobKey, val, coord.Persistent)}
		// A history left by an earlier job of this name (its record removed by hand) is
		// replaced: the new job's starts afresh.
		if he, err := s.Get(ctx, historyKey); err == nil {
			ops = append(ops, coord.PutOp(historyKey, hist, he.Version))
		} else {
			ops = append(ops, coord.CreateOp(historyKey, hist, coord.Persistent))
		}
		// A conflict on the tenant (another submit or scale counted its quota meanwhile)
		// makes Retry read everything again.
		_, err = s.Txn(ctx, ops...)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, coord.ErrExists):
			return fmt.Errorf("%w: job %q already exists", api.ErrExists, spec.Name)
		}
		return fmt.Errorf("store job %s: %w", spec.Name, err)
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "tenant "+spec.Tenant)
	}
	return rec, nil
}

// readJob returns a job's record and entry.
func readJob(ctx context.Context, s coord.KV, name string) (cluster.JobRecord, coord.Entry, error) {
	key, err := keyOf(cluster.JobKey(name))
	if err != nil {
		return cluster.JobRecord{}, coord.Entry{}, err
	}
	e, err := s.Get(ctx, key)
	if err != nil && !errors.Is(err, coord.ErrNotFound) {
		return cluster.JobRecord{}, e, fmt.Errorf("read job %s: %w", name, err)
	}
	rec, err := decodeJob(name, e.Value, err == nil)
	return rec, e, err
}

// decodeJob decodes a job's stored record; exists is false when there is none.
func decodeJob(name string, val []byte, exists bool) (cluster.JobRecord, error) {
	var rec cluster.JobRecord
	if !exists {
		return rec, fmt.Errorf("%w: no job %q (see `stormdock job list`)", api.ErrNotFound, name)
	}
	if err := json.Unmarshal(val, &rec); err != nil {
		return cluster.JobRecord{}, fmt.Errorf("read job %s: %w", name, err)
	}
	return rec, nil
}

// ScaleJob sets a job's worker count, checking the quota for growth. Workers that stay keep
// running: the generation does not change.
func ScaleJob(ctx context.Context, s coord.KV, name string, workers int) (cluster.JobRecord, error) {
	if workers < 1 || workers > cluster.MaxWorkersPerJob {
		return cluster.JobRecord{}, fmt.Errorf("%w: workers must be between 1 and %d (kill the job to stop it)", api.ErrBadInput, cluster.MaxWorkersPerJob)
	}
	var rec cluster.JobRecord
	err := coord.Retry(ctx, func() error {
		var je coord.Entry
		var err error
		if rec, je, err = readJob(ctx, s, name); err != nil {
			return err
		}
		if rec.State != cluster.JobRunning {
			return fmt.Errorf("%w: job %q is being killed", api.ErrBadInput, name)
		}
		t, te, err := readTenant(ctx, s, rec.Spec.Tenant)
		if err != nil {
			return err
		}
		spec := rec.Spec
		spec.Workers = workers
		if workers > rec.Spec.Workers {
			usedW, usedM, err := tenantUsage(ctx, s, t, name)
			if err != nil {
				return err
			}
			grow := spec
			grow.Workers = workers - rec.Spec.Workers
			if err := checkQuota(t, usedW+rec.Spec.TotalWorkers(), usedM+cluster.Bytes(rec.Spec.TotalWorkers())*spec.Resources.Memory, &grow); err != nil {
				return err
			}
		}
		if rec.Spec.Workers != spec.Workers {
			rec.Epoch = max(rec.Epoch, 1) + 1
		}
		rec.Spec = spec
		rec.Updated = time.Now().UTC()
		val, _ := json.Marshal(rec)
		tenantKey, err := keyOf(cluster.TenantKey(spec.Tenant))
		if err != nil {
			return err
		}
		jobKey, err := keyOf(cluster.JobKey(name))
		if err != nil {
			return err
		}
		_, err = s.Txn(ctx, quotaOp(t, tenantKey, te), coord.PutOp(jobKey, val, je.Version))
		if errors.Is(err, coord.ErrNotFound) {
			// The job or its tenant went since the read: the next read says which.
			err = fmt.Errorf("%w: %w", coord.ErrConflict, err)
		}
		if err != nil {
			return fmt.Errorf("scale job %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "job "+name)
	}
	return rec, nil
}

// KillJob marks a job killed; the leader stops its workers (with grace when given) and then
// removes the record.
func KillJob(ctx context.Context, s coord.KV, name string, grace time.Duration) (cluster.JobRecord, error) {
	if grace < 0 {
		return cluster.JobRecord{}, fmt.Errorf("%w: grace must not be negative", api.ErrBadInput)
	}
	var rec cluster.JobRecord
	key, err := keyOf(cluster.JobKey(name))
	if err != nil {
		return rec, err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		var err error
		if rec, err = decodeJob(name, cur, exists); err != nil {
			return nil, err
		}
		rec.State = cluster.JobKilled
		if grace > 0 {
			rec.Spec.GracePeriod = cluster.Duration(grace)
		}
		rec.Updated = time.Now().UTC()
		return json.Marshal(rec)
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "job "+name)
	}
	return rec, nil
}

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

// UpdateNodeConf applies change to a node's operator settings with compare-and-set.
func UpdateNodeConf(ctx context.Context, s coord.KV, id string, change func(*cluster.NodeConf)) error {
	// A node has no settings until an operator gives some: a missing key is the zero NodeConf.
	key, err := keyOf(cluster.NodeConfKey(id))
	if err != nil {
		return err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		var c cluster.NodeConf
		if exists && len(cur) > 0 {
			if err := json.Unmarshal(cur, &c); err != nil {
				return nil, fmt.Errorf("read settings of node %s: %w", id, err)
			}
		}
		change(&c)
		return json.Marshal(c)
	})
	if err != nil {
		return busy(err, "node "+id)
	}
	return nil
}
