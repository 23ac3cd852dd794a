package master

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/master/desired"
	"github.com/stormdock/stormdock/placement"
)

// dcState is a data center's effective state: the operator's, or lost when none of its
// nodes is alive.
func (v *View) dcState(dc string) string {
	if rec, ok := v.dcs[dc]; ok && rec.State == cluster.DCFailed {
		return cluster.DCFailed
	}
	for _, rec := range v.nodes {
		if rec.Node.DC == dc {
			return cluster.DCActive
		}
	}
	return cluster.DCLost
}

// out lists the data centers whose workers must leave: failed or lost.
func (v *View) out() map[string]string {
	out := map[string]string{}
	for dc := range v.dcs {
		if st := v.dcState(dc); st != cluster.DCActive {
			out[dc] = st
		}
	}
	return out
}

// recordDCs stores a record for every data center seen among live nodes, so that one
// whose nodes are all gone is still known (and reported lost).
func (r *reconciler) recordDCs(ctx context.Context, v *View) error {
	for _, rec := range v.nodes {
		dc := rec.Node.DC
		if _, ok := v.dcs[dc]; ok {
			continue
		}
		d := cluster.DCRecord{Name: dc, State: cluster.DCActive, Since: time.Now().UTC()}
		val, _ := json.Marshal(d)
		key, err := cluster.DCKey(dc)
		if err != nil {
			continue // agents register valid names only; this one is not a data center's
		}
		_, err = r.kv.Create(ctx, key, val, coord.Persistent)
		r.m.metrics.storeWrites.Inc()
		if err != nil && !errors.Is(err, coord.ErrExists) {
			return fmt.Errorf("master: record data center %s: %w", dc, err)
		}
		v.dcs[dc] = d
	}
	return nil
}

// planWhole plans, then holds back the displaced workers of every job that a failed or
// lost data center would leave half-moved, and plans again, until no job is half-moved.
// Placement goes by priority, so the jobs that move are the most important that fit.
//
// It returns the held workers too: the leader keeps them assigned to the node they were
// lost on, so that the next plan (by this leader or the next) still knows they come from
// a lost data center and must move whole.
//
// Workers that fit nowhere but on nodes avoiding their job go there (planAvoiding).
func (r *reconciler) planWhole(v *View, in placement.Input) (*placement.Result, map[cluster.WorkerKey]string, error) {
	return planAvoiding(in, func(in placement.Input) (*placement.Result, map[cluster.WorkerKey]string, error) {
		return r.planWholeOnce(v, in)
	})
}

func (r *reconciler) planWholeOnce(v *View, in placement.Input) (*placement.Result, map[cluster.WorkerKey]string, error) {
	out := v.out()
	if len(out) == 0 {
		res, err := placement.Plan(in)
		return res, in.Hold, err
	}
	dcOf := func(node string) string {
		if rec, ok := v.nodes[node]; ok {
			return rec.Node.DC
		}
		return r.assign[node].a.DC
	}
	in.Hold = maps.Clone(in.Hold)
	if in.Hold == nil {
		in.Hold = map[cluster.WorkerKey]string{}
	}
	for range len(in.Jobs) + 1 {
		res, err := placement.Plan(in)
		if err != nil {
			return nil, nil, err
		}
		unplaced := map[cluster.WorkerKey]bool{}
		for _, u := range res.Unplaced {
			unplaced[u.Key()] = true
		}
		type moving struct {
			keys  []cluster.WorkerKey
			stuck int
			dc    string
		}
		jobs := map[string]*moving{}
		for _, mv := range res.Moves {
			dc := dcOf(mv.From)
			if _, gone := out[dc]; !gone {
				continue
			}
			m := jobs[mv.Job]
			if m == nil {
				m = &moving{dc: dc}
				jobs[mv.Job] = m
			}
			m.keys = append(m.keys, mv.Key())
			if mv.To == "" && unplaced[mv.Key()] {
				m.stuck++
			}
		}
		held := false
		for _, job := range slices.Sorted(maps.Keys(jobs)) {
			if m := jobs[job]; m.stuck > 0 && m.stuck < len(m.keys) {
				for _, k := range m.keys {
					in.Hold[k] = waitingReason(job, m.dc, out[m.dc], m.stuck, len(m.keys))
				}
				held = true // half-moved: plan again without it
			}
		}
		if held {
			continue
		}
		// Jobs that found no room at all are held too, so that they stay known as displaced;
		// holding them changes nothing else in the plan.
		for job, m := range jobs {
			if m.stuck == len(m.keys) {
				for _, k := range m.keys {
					in.Hold[k] = waitingReason(job, m.dc, out[m.dc], m.stuck, len(m.keys))
				}
			}
		}
		for i, u := range res.Unplaced {
			if why, ok := in.Hold[u.Key()]; ok {
				res.Unplaced[i].Reason, res.Unplaced[i].Why = why, nil
			}
		}
		return res, in.Hold, nil
	}
	res, err := placement.Plan(in)
	return res, in.Hold, err
}

func waitingReason(job, dc, state string, stuck, total int) string {
	return fmt.Sprintf("waiting: data center %s is %s and job %s moves only whole: %d of its %d workers there find no room elsewhere",
		dc, state, job, stuck, total)
}

// rebalance carries out a restore's --rebalance once: for each job that may use the data
// center and spreads over data centers, the workers above an even share in the other data
// centers are let go, so that placement puts them into the restored one.
func (r *reconciler) rebalance(ctx context.Context, v *View, cur []cluster.Placement) ([]cluster.Placement, error) {
	var dcs []string
	for dc, rec := range v.dcs {
		if rec.Rebalance && rec.State == cluster.DCActive && v.dcState(dc) == cluster.DCActive {
			dcs = append(dcs, dc)
		}
	}
	if len(dcs) == 0 {
		return cur, nil
	}
	liveDCs := map[string]bool{}
	nodeDC := map[string]string{}
	for id, rec := range v.nodes {
		liveDCs[rec.Node.DC] = true
		nodeDC[id] = rec.Node.DC
	}
	drop := map[cluster.WorkerKey]bool{}
	byJob := map[string][]cluster.Placement{}
	for _, p := range cur {
		byJob[p.Job] = append(byJob[p.Job], p)
	}
	for name, ps := range byJob {
		spec := v.jobs[name].rec.Spec
		if spec.Mirrored() || !slices.Contains(spec.Placement.Spread, cluster.DomainDC) {
			continue
		}
		allowed := 0
		for dc := range liveDCs {
			if len(spec.Placement.DCs) == 0 || slices.Contains(spec.Placement.DCs, dc) {
				allowed++
			}
		}
		if allowed == 0 {
			continue
		}
		share := (spec.Workers + allowed - 1) / allowed
		perDC := map[string][]cluster.Placement{}
		for _, p := range ps {
			perDC[nodeDC[p.Node]] = append(perDC[nodeDC[p.Node]], p)
		}
		for _, list := range perDC {
			slices.SortFunc(list, func(a, b cluster.Placement) int { return cmp.Compare(b.Worker, a.Worker) })
			for i := 0; i < len(list)-share; i++ {
				drop[list[i].Key()] = true
			}
		}
	}
	// The request is cleared with compare-and-set before anything moves: one the operator
	// withdrew since the view was read (a `dc fail` after the restore) moves nothing.
	asked := false
	for _, dc := range dcs {
		ok, err := desired.EndRebalance(ctx, r.kv, dc)
		r.m.metrics.storeWrites.Inc()
		if err != nil {
			return nil, fmt.Errorf("master: %w", err)
		}
		if ok {
			asked = true
			r.m.log.Info("rebalancing into restored data center", "dc", dc, "moving", len(drop))
		}
	}
	if !asked {
		return cur, nil
	}
	kept := cur[:0:0]
	for _, p := range cur {
		if !drop[p.Key()] {
			kept = append(kept, p)
		}
	}
	return kept, nil
}
