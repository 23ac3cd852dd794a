package master

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// change is one node's assignment to write (or, with remove, to delete).
type change struct {
	node   string
	a      cluster.NodeAssignment // what value encodes
	value  []byte
	fewer  bool // it takes workers away: written before the changes that add
	remove bool
}

// commit writes changes in order, in multi-op transactions of at most coord.MaxTxnBytes:
// a submission that assigns ten thousand nodes is a score of store requests, not ten
// thousand. Each transaction checks the versions this leader last wrote, as single writes
// did: when another writer got in between (an old leader still finishing), nothing of that
// transaction is applied, its nodes are read again and the error makes the leader plan
// anew. The transactions before it stay written. Every transaction also checks this term's
// fence (r.kv): a leader deposed while it planned, or whose request waited out a
// reconnect, writes nothing.
func (r *reconciler) commit(ctx context.Context, changes []change) error {
	if len(changes) == 0 {
		return nil
	}
	ops := make([]coord.Op, 0, len(changes))
	for _, c := range changes {
		st := r.assign[c.node]
		key, err := cluster.AssignmentKey(c.node)
		if err != nil {
			return fmt.Errorf("master: %w", err)
		}
		switch {
		case c.remove:
			ops = append(ops, coord.DeleteOp(key, st.version))
		case st.exists:
			ops = append(ops, coord.PutOp(key, c.value, st.version))
		default:
			ops = append(ops, coord.CreateOp(key, c.value, coord.Persistent))
		}
	}
	done := 0
	for _, batch := range coord.SplitOps(ops, 0) {
		tctx, outcome := ctx, func(error) {}
		if h := r.m.beforeCommit.Load(); h != nil {
			tctx, outcome = (*h)(ctx)
		}
		res, err := r.kv.Txn(tctx, batch...)
		outcome(err)
		r.m.metrics.storeWrites.Add(float64(len(batch)))
		if err != nil {
			if errors.Is(err, coord.ErrFenced) {
				// This term is over in the store's order: nothing of the batch was written,
				// and nothing more will be (the loop's context ends with the term).
				return fmt.Errorf("master: write %d assignments: %w", len(batch), err)
			}
			var te *coord.TxnError
			if errors.As(err, &te) {
				c := changes[done+te.Index]
				if errors.Is(err, coord.ErrConflict) || errors.Is(err, coord.ErrExists) || errors.Is(err, coord.ErrNotFound) {
					if c.remove && errors.Is(err, coord.ErrNotFound) {
						delete(r.assign, c.node) // already gone: forget it, and plan again
					} else {
						_ = r.reload(ctx, c.node) // someone else wrote it: read it and plan again
					}
				}
				return fmt.Errorf("master: write assignment of %s: %w", c.node, err)
			}
			// The outcome is unknown (the connection dropped): read back what the batch
			// touched before planning again.
			for _, c := range changes[done : done+len(batch)] {
				_ = r.reload(ctx, c.node)
			}
			return fmt.Errorf("master: write %d assignments: %w", len(batch), err)
		}
		for i, c := range changes[done : done+len(batch)] {
			if c.remove {
				delete(r.assign, c.node)
				continue
			}
			r.assign[c.node] = assignState{a: c.a, sum: sha256.Sum256(c.value), version: res[i].Version, exists: true}
		}
		done += len(batch)
	}
	return nil
}

// unchanged reports whether a node's desired assignment is the one last written, without
// encoding it: a reconcile of ten thousand nodes where one rack changed encodes a hundred
// assignments, not ten thousand. The assignment written is kept as it was desired, so the
// records of jobs that did not change share their maps and slices with it and compare at
// once. Assignments that do not compare equal are encoded and compared as bytes.
func unchanged(written, want cluster.NodeAssignment) bool {
	return reflect.DeepEqual(written, want)
}
