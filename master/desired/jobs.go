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
	"github.com/stormdock/stormdock/multidc"
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

// SubmitJob stores a new job after checking its tenant's quota. The tenant record's
// version is bumped in the same transaction, so two submits for one tenant cannot both
// pass the quota on the same reading.
func SubmitJob(ctx context.Context, s coord.KV, spec *cluster.JobSpec) (cluster.JobRecord, error) {
	return SubmitJobPinned(ctx, s, spec, nil)
}

// SubmitJobPinned is SubmitJob with the image pin of its first generation (which the master
// resolves: see its pinImage).
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
		t, te, err := ReadTenant(ctx, s, spec.Tenant)
		if err != nil {
			return err
		}
		if err := checkPriority(t, spec); err != nil {
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
		sop, named, err := secretsOp(ctx, s, spec)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		rec = cluster.JobRecord{Spec: *spec, Generation: 1, Epoch: 1, State: cluster.JobRunning, Image: pin, Submitted: now, Updated: now}
		if spec.Mirrored() {
			if rec.OutputTokenHash, rec.OutputLinkTokenHashes, err = outputTokenHashes(ctx, s, rec); err != nil {
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
		if named {
			ops = append(ops, sop)
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

// ReadJob returns a job's record and its entry (for its version).
func ReadJob(ctx context.Context, s coord.KV, name string) (cluster.JobRecord, coord.Entry, error) {
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
// running: the generation does not change. A job with a scaling policy has it paused: a
// hand on the count outranks the policy until `job autoscale NAME --resume`.
func ScaleJob(ctx context.Context, s coord.KV, name string, workers int) (cluster.JobRecord, error) {
	return ScaleJobAs(ctx, s, name, workers, "")
}

// ScaleJobAs is ScaleJob recording who paused the job's scaling policy, if it has one.
func ScaleJobAs(ctx context.Context, s coord.KV, name string, workers int, who string) (cluster.JobRecord, error) {
	return scaleJob(ctx, s, name, workers, func(rec *cluster.JobRecord) error {
		if rec.Spec.Scaling != nil {
			as := autoscaleOf(rec)
			as.Paused, as.PausedAt, as.PausedBy = true, time.Now().UTC(), who
		}
		return nil
	})
}

func autoscaleOf(rec *cluster.JobRecord) *cluster.AutoscaleState {
	if rec.Autoscale == nil {
		rec.Autoscale = &cluster.AutoscaleState{}
	}
	return rec.Autoscale
}

// ErrPolicyChanged: the job's scaling policy is gone, paused, or the count moved since the
// autoscaler read it: it decides again from what is stored.
var ErrPolicyChanged = errors.New("the job's scaling changed since it was read")

// AutoscaleJob is the autoscaler's change of a job's worker count, from d.From to d.To,
// through the same path as ScaleJob (quota, a new epoch), with d recorded as the policy's
// last decision. It refuses (ErrPolicyChanged) a job whose policy is gone or paused, or
// whose count is no longer d.From.
func AutoscaleJob(ctx context.Context, s coord.KV, name string, d cluster.ScalingDecision) (cluster.JobRecord, error) {
	return scaleJob(ctx, s, name, d.To, func(rec *cluster.JobRecord) error {
		switch {
		case rec.Spec.Scaling == nil:
			return fmt.Errorf("%w: job %s has no scaling policy now", ErrPolicyChanged, name)
		case rec.Autoscale != nil && rec.Autoscale.Paused:
			return fmt.Errorf("%w: job %s's scaling policy is paused", ErrPolicyChanged, name)
		case rec.Spec.Workers != d.From:
			return fmt.Errorf("%w: job %s has %d workers, not %d", ErrPolicyChanged, name, rec.Spec.Workers, d.From)
		}
		autoscaleOf(rec).Last = &d
		return nil
	})
}

// SetAutoscale pauses or resumes a job's scaling policy (`job autoscale NAME --pause`,
// `--resume`); who is recorded with a pause.
func SetAutoscale(ctx context.Context, s coord.KV, name string, pause bool, who string) (cluster.JobRecord, error) {
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
		if rec.State != cluster.JobRunning {
			return nil, fmt.Errorf("%w: job %q is being killed", api.ErrBadInput, name)
		}
		if rec.Spec.Scaling == nil {
			return nil, fmt.Errorf("%w: job %s has no scaling: block to pause or resume (add one with `stormdock job update`)", api.ErrBadInput, name)
		}
		as := autoscaleOf(&rec)
		if pause {
			as.Paused, as.PausedAt, as.PausedBy = true, time.Now().UTC(), who
		} else {
			as.Paused, as.PausedAt, as.PausedBy = false, time.Time{}, ""
		}
		rec.Updated = time.Now().UTC()
		return json.Marshal(rec)
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "job "+name)
	}
	return rec, nil
}

// scaleJob is ScaleJob's read-modify-write; change, when set, adjusts the record (or
// refuses) before it is written.
func scaleJob(ctx context.Context, s coord.KV, name string, workers int, change func(*cluster.JobRecord) error) (cluster.JobRecord, error) {
	if workers < 1 || workers > cluster.MaxWorkersPerJob {
		return cluster.JobRecord{}, fmt.Errorf("%w: workers must be between 1 and %d (kill the job to stop it)", api.ErrBadInput, cluster.MaxWorkersPerJob)
	}
	var rec cluster.JobRecord
	err := coord.Retry(ctx, func() error {
		var je coord.Entry
		var err error
		if rec, je, err = ReadJob(ctx, s, name); err != nil {
			return err
		}
		if rec.State != cluster.JobRunning {
			return fmt.Errorf("%w: job %q is being killed", api.ErrBadInput, name)
		}
		t, te, err := ReadTenant(ctx, s, rec.Spec.Tenant)
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
		if change != nil {
			// Before the count changes: it sees the record as stored.
			if err := change(&rec); err != nil {
				return err
			}
		}
		if rec.Spec.Workers != spec.Workers {
			rec.Epoch = max(rec.Epoch, 1) + 1
		}
		rec.Spec.Workers = spec.Workers
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

// outputTokenHashes are the hashes the record of a mirrored job submitted at rec.Submitted
// keeps: of the job's own token and of each link's.
func outputTokenHashes(ctx context.Context, s coord.KV, rec cluster.JobRecord) (string, map[string]string, error) {
	key, err := multidc.EnsureOutputKey(ctx, s)
	if err != nil {
		return "", nil, err
	}
	return api.HashToken(multidc.SenderToken(key, rec.Spec.Name, rec.Submitted)),
		multidc.LinkTokenHashes(key, rec.Spec.Name, rec.Spec.Links, rec.Submitted), nil
}
