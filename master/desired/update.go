package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// Changes of a running job's spec. Each makes a new generation, recorded in the job's
// history (/history/<job>), and a rollout in the job record that the leader carries out
// (package master, rollout.go): both go in one transaction with the job record, so a new
// leader finds every rollout it has to continue.

// readHistory returns a job's history and its entry; a job submitted before histories were
// kept gets one made from its record.
func readHistory(ctx context.Context, s coord.KV, rec cluster.JobRecord) (cluster.JobHistory, coord.Entry, bool, error) {
	key, err := keyOf(cluster.JobHistoryKey(rec.Spec.Name))
	if err != nil {
		return cluster.JobHistory{}, coord.Entry{}, false, err
	}
	e, err := s.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		h := cluster.JobHistory{Job: rec.Spec.Name, Generations: []cluster.GenerationRecord{
			{Generation: rec.Generation, Spec: rec.Spec, Image: rec.Image, At: rec.Submitted, Kind: "submit"}}}
		return h, coord.Entry{}, false, nil
	}
	if err != nil {
		return cluster.JobHistory{}, e, false, fmt.Errorf("read history of job %s: %w", rec.Spec.Name, err)
	}
	var h cluster.JobHistory
	if err := json.Unmarshal(e.Value, &h); err != nil {
		return cluster.JobHistory{}, e, false, fmt.Errorf("read history of job %s: %w", rec.Spec.Name, err)
	}
	return h, e, true, nil
}

// historyOp writes the history back in the transaction of the job record's change.
func historyOp(name string, h cluster.JobHistory, e coord.Entry, exists bool) (coord.Op, error) {
	key, err := keyOf(cluster.JobHistoryKey(name))
	if err != nil {
		return coord.Op{}, err
	}
	val, err := json.Marshal(h)
	if err != nil {
		return coord.Op{}, err
	}
	if exists {
		return coord.PutOp(key, val, e.Version), nil
	}
	return coord.CreateOp(key, val, coord.Persistent), nil
}

// HistoryOf returns the history of the job rec is the record of (see ReadHistory).
func HistoryOf(ctx context.Context, s coord.KV, rec cluster.JobRecord) (cluster.JobHistory, error) {
	h, _, _, err := readHistory(ctx, s, rec)
	return h, err
}

// ReadHistory returns the generations of a job.
func ReadHistory(ctx context.Context, s coord.KV, name string) (cluster.JobRecord, cluster.JobHistory, error) {
	rec, _, err := ReadJob(ctx, s, name)
	if err != nil {
		return rec, cluster.JobHistory{}, err
	}
	h, _, _, err := readHistory(ctx, s, rec)
	return rec, h, err
}

// Change is one change of a running job's spec.
type Change struct {
	// Spec is the new spec (Update), or nil for a rollback, which takes To's.
	Spec *cluster.JobSpec
	// To is the generation a rollback goes back to (0: the one before the current).
	To int64
	// Pin is the new spec's image pin (the master's pinImage; its generation is set here), nil when it
	// has none or its image did not change.
	Pin    *cluster.ImagePin
	Policy api.PolicyOverrides
	Who    string
	// DryRun makes every check and stores nothing: the record returned is the job as the
	// change would make it.
	DryRun bool
}

// UpdateJob makes a new generation of a running job from a new spec and starts its rollout.
// It returns the job as stored and whether anything changed: a spec equal to the current
// one makes nothing.
func UpdateJob(ctx context.Context, s coord.KV, name string, c Change) (cluster.JobRecord, bool, error) {
	if err := c.Spec.Validate(); err != nil {
		return cluster.JobRecord{}, false, fmt.Errorf("%w: %v", api.ErrBadInput, err)
	}
	if c.Spec.Name != name {
		return cluster.JobRecord{}, false, fmt.Errorf("%w: the spec is of job %q, not %q", api.ErrBadInput, c.Spec.Name, name)
	}
	return changeJob(ctx, s, name, cluster.RolloutUpdate, c, func(rec cluster.JobRecord, _ cluster.JobHistory) (cluster.JobSpec, *cluster.ImagePin, error) {
		spec := *c.Spec
		if spec.Scaling != nil && rec.Spec.Scaling != nil && (rec.Autoscale == nil || !rec.Autoscale.Paused) {
			// The policy owns the worker count: an update keeps the count it set (within
			// the new policy's range), rather than undo its work with the file's.
			spec.Workers = min(max(rec.Spec.Workers, spec.Scaling.Min), spec.Scaling.Max)
		}
		return spec, c.Pin, nil
	})
}

// RollbackJob makes a new generation of a running job from an earlier generation's spec
// (keeping the current worker count, which `job scale` owns, and update policy) with that
// generation's image pin, and starts its rollout.
func RollbackJob(ctx context.Context, s coord.KV, name string, c Change) (cluster.JobRecord, bool, error) {
	return changeJob(ctx, s, name, cluster.RolloutRollback, c, func(rec cluster.JobRecord, h cluster.JobHistory) (cluster.JobSpec, *cluster.ImagePin, error) {
		to := c.To
		if to == 0 {
			for _, g := range h.Generations {
				if g.Generation < rec.Generation {
					to = max(to, g.Generation)
				}
			}
			if to == 0 {
				return cluster.JobSpec{}, nil, fmt.Errorf("%w: job %s has no generation before %d to roll back to (see `stormdock job history %s`)", api.ErrBadInput, name, rec.Generation, name)
			}
		}
		if to == rec.Generation {
			return cluster.JobSpec{}, nil, fmt.Errorf("%w: generation %d is job %s's current one", api.ErrBadInput, to, name)
		}
		g, ok := h.Find(to)
		if !ok {
			return cluster.JobSpec{}, nil, fmt.Errorf("%w: job %s has no generation %d in its history (see `stormdock job history %s`)", api.ErrNotFound, name, to, name)
		}
		spec := g.Spec
		spec.Workers, spec.Update = rec.Spec.Workers, rec.Spec.Update
		// A generation stored before a rule it breaks came in (an output secret to a sink
		// that would get it in clear) runs again only if it passes today's checks.
		if err := spec.Validate(); err != nil {
			return cluster.JobSpec{}, nil, fmt.Errorf("%w: generation %d of job %s: %v", api.ErrBadInput, to, name, err)
		}
		var pin *cluster.ImagePin
		if g.Image != nil && g.Image.Ref != "" {
			p := *g.Image
			pin = &p
		}
		return spec, pin, nil
	})
}

// changeJob is the read-modify-write of an update or rollback: it checks the new spec
// against the job (same tenant and links, quota for growth), makes the generation, records
// it in the history and starts the rollout, all in one transaction.
func changeJob(ctx context.Context, s coord.KV, name, kind string, c Change,
	next func(cluster.JobRecord, cluster.JobHistory) (cluster.JobSpec, *cluster.ImagePin, error)) (cluster.JobRecord, bool, error) {
	jobKey, err := keyOf(cluster.JobKey(name))
	if err != nil {
		return cluster.JobRecord{}, false, err
	}
	var rec cluster.JobRecord
	changed := false
	err = coord.Retry(ctx, func() error {
		changed = false
		var je coord.Entry
		var err error
		if rec, je, err = ReadJob(ctx, s, name); err != nil {
			return err
		}
		if rec.State != cluster.JobRunning {
			return fmt.Errorf("%w: job %q is being killed", api.ErrBadInput, name)
		}
		h, he, hexists, err := readHistory(ctx, s, rec)
		if err != nil {
			return err
		}
		spec, pin, err := next(rec, h)
		if err != nil {
			return err
		}
		if err := checkChange(rec.Spec, spec); err != nil {
			return err
		}
		policy := spec.Update
		if kind == cluster.RolloutRollback {
			policy.Canary = 0 // back to a known spec: no canaries unless asked for
		}
		policy = c.Policy.Apply(policy)
		if err := policy.Validate(spec.Workers); err != nil {
			return fmt.Errorf("%w: %w", api.ErrBadInput, err)
		}
		if kind == cluster.RolloutUpdate && spec.Image == rec.Spec.Image && spec.IsolationMode() == rec.Spec.IsolationMode() && rec.Image != nil {
			p := *rec.Image // the same image keeps its digest: an update re-pins only a changed one
			pin = &p
		}
		if reflect.DeepEqual(spec, rec.Spec) && pinRef(pin) == pinRef(rec.Image) {
			return nil // nothing to roll out
		}
		t, te, err := ReadTenant(ctx, s, spec.Tenant)
		if err != nil {
			return err
		}
		if err := checkPriority(t, &spec); err != nil {
			return err
		}
		if spec.Workers > rec.Spec.Workers {
			usedW, usedM, err := tenantUsage(ctx, s, t, name)
			if err != nil {
				return err
			}
			if err := checkQuota(t, usedW, usedM, &spec); err != nil {
				return err
			}
		}
		sop, named, err := secretsOp(ctx, s, &spec)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		gen := max(rec.Generation, h.Latest()) + 1
		if pin != nil {
			pin.Generation = gen
		}
		if spec.Workers != rec.Spec.Workers {
			rec.Epoch = max(rec.Epoch, 1) + 1
		}
		var id int64 = 1
		if rec.Rollout != nil {
			id = rec.Rollout.ID + 1
		}
		if policy.Canary > spec.Workers {
			policy.Canary = spec.Workers
		}
		rec.Rollout = &cluster.Rollout{ID: id, Kind: kind, From: rec.Generation, To: gen, State: cluster.RolloutRunning,
			Policy: policy.Effective(), Started: now, Updated: now, Who: c.Who, Total: spec.TotalWorkers()}
		from := rec.Generation
		rec.Spec, rec.Generation, rec.Image, rec.Updated = spec, gen, pin, now
		h.Add(cluster.GenerationRecord{Generation: gen, Spec: spec, Image: pin, At: now, Who: c.Who, Kind: kind}, from)
		if c.DryRun {
			changed = true
			return nil
		}
		hop, err := historyOp(name, h, he, hexists)
		if err != nil {
			return err
		}
		val, _ := json.Marshal(rec)
		tenantKey, err := keyOf(cluster.TenantKey(spec.Tenant))
		if err != nil {
			return err
		}
		ops := []coord.Op{quotaOp(t, tenantKey, te), coord.PutOp(jobKey, val, je.Version), hop}
		if named {
			ops = append(ops, sop)
		}
		_, err = s.Txn(ctx, ops...)
		if errors.Is(err, coord.ErrNotFound) || errors.Is(err, coord.ErrExists) {
			err = fmt.Errorf("%w: %w", coord.ErrConflict, err)
		}
		if err != nil {
			return fmt.Errorf("%s job %s: %w", kind, name, err)
		}
		changed = true
		return nil
	})
	if err != nil {
		return cluster.JobRecord{}, false, busy(err, "job "+name)
	}
	return rec, changed, nil
}

func pinRef(p *cluster.ImagePin) string {
	if p == nil {
		return ""
	}
	return p.Ref
}

// checkChange refuses what an update cannot change: the tenant, and the links of a
// mirrored job.
// The error is a *cluster.ValidationError naming the fields.
func checkChange(cur, next cluster.JobSpec) error {
	var ps []cluster.FieldError
	if next.Tenant != cur.Tenant {
		ps = append(ps, cluster.FieldError{Path: "tenant", Msg: fmt.Sprintf("a job cannot move to another tenant (%s -> %s): submit it there under a new name", cur.Tenant, next.Tenant)})
	}
	if !slices.Equal(next.Links, cur.Links) {
		ps = append(ps, cluster.FieldError{Path: "links", Msg: fmt.Sprintf("the links of a mirrored job cannot change (%v -> %v): kill the job and submit it again", cur.Links, next.Links)})
	}
	if len(ps) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", api.ErrBadInput, &cluster.ValidationError{What: "update of job " + cur.Name, Problems: ps})
}

// RestartJob starts a rolling restart of a running job's workers in place (workers: these
// indexes only; empty: all), with the job's update rules and by, maxParallel (when set) on
// top. Its generation stays.
func RestartJob(ctx context.Context, s coord.KV, name string, workers []int, by string, maxParallel int, who string) (cluster.JobRecord, error) {
	if maxParallel < 0 {
		return cluster.JobRecord{}, fmt.Errorf("%w: --max-parallel must not be negative", api.ErrBadInput)
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
		if rec.State != cluster.JobRunning {
			return nil, fmt.Errorf("%w: job %q is being killed", api.ErrBadInput, name)
		}
		for _, w := range workers {
			if w < 0 || w >= rec.Spec.Workers {
				return nil, fmt.Errorf("%w: --worker %d: job %s has workers 0 to %d", api.ErrBadInput, w, name, rec.Spec.Workers-1)
			}
		}
		policy := rec.Spec.Update
		policy.Canary, policy.AutoRevert = 0, false
		if by != "" {
			policy.By = by
		}
		if maxParallel > 0 {
			policy.MaxParallel = maxParallel
		}
		if err := policy.Validate(rec.Spec.Workers); err != nil {
			return nil, fmt.Errorf("%w: %v", api.ErrBadInput, err)
		}
		now := time.Now().UTC()
		var id int64 = 1
		if rec.Rollout != nil {
			id = rec.Rollout.ID + 1
		}
		total := rec.Spec.TotalWorkers()
		if len(workers) > 0 {
			total = len(slices.Compact(slices.Sorted(slices.Values(workers)))) * max(len(rec.Spec.Links), 1)
		}
		rec.Rollout = &cluster.Rollout{ID: id, Kind: cluster.RolloutRestart, From: rec.Generation, To: rec.Generation,
			State: cluster.RolloutRunning, Policy: policy.Effective(), Workers: slices.Compact(slices.Sorted(slices.Values(workers))),
			Started: now, Updated: now, Who: who, Total: total}
		rec.Updated = now
		return json.Marshal(rec)
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "job "+name)
	}
	return rec, nil
}

// Rollout actions of operators.
const (
	ActionPause   = "pause"
	ActionResume  = "resume"
	ActionPromote = "promote"
)

// RolloutAction pauses, resumes or promotes a job's rollout.
func RolloutAction(ctx context.Context, s coord.KV, name, action string) (cluster.JobRecord, error) {
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
		ro := rec.Rollout
		if !ro.Active() {
			return nil, fmt.Errorf("%w: job %s has no rollout in progress (see `stormdock job status %s`)", api.ErrBadInput, name, name)
		}
		now := time.Now().UTC()
		switch action {
		case ActionPause:
			switch ro.State {
			case cluster.RolloutRunning, cluster.RolloutCanary:
				ro.State, ro.Reason = cluster.RolloutPaused, "paused by an operator"
			case cluster.RolloutPaused:
			default:
				return nil, fmt.Errorf("%w: job %s's rollout is %s: nothing to pause", api.ErrBadInput, name, ro.State)
			}
		case ActionResume:
			switch ro.State {
			case cluster.RolloutPaused, cluster.RolloutFailed:
				// A failed rollout resumed is tried again: the workers in flight get a
				// fresh deadline.
				ro.State, ro.Reason = cluster.RolloutRunning, ""
				for i := range ro.InFlight {
					ro.InFlight[i].Since = now
				}
			case cluster.RolloutRunning, cluster.RolloutReverting:
			default:
				return nil, fmt.Errorf("%w: job %s's rollout is %s: promote it to continue", api.ErrBadInput, name, ro.State)
			}
		case ActionPromote:
			if ro.Policy.Canary == 0 || ro.Promoted {
				return nil, fmt.Errorf("%w: job %s's rollout has no canaries waiting for promotion", api.ErrBadInput, name)
			}
			ro.Promoted = true
			if ro.State == cluster.RolloutCanary {
				ro.State, ro.Reason = cluster.RolloutRunning, ""
			}
		default:
			return nil, fmt.Errorf("%w: unknown rollout action %q", api.ErrBadInput, action)
		}
		ro.Updated = now
		return json.Marshal(rec)
	})
	if err != nil {
		return cluster.JobRecord{}, busy(err, "job "+name)
	}
	return rec, nil
}
