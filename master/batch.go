package master

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"sync"

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

// inFlight is how many assignment transactions the leader has sent and not had answered at
// once. One at a time, a data center's loss at ten thousand nodes (some 45 transactions of
// half a MiB) spent most of its reconcile waiting for each answer before sending the next;
// the server takes them in the order they arrive either way.
const inFlight = 8

// commit writes changes in multi-op transactions of at most coord.MaxTxnBytes: a submission
// that assigns ten thousand nodes is a score of store requests, not ten thousand. The changes
// that take workers away (sorted first by write) go out before those that add: every
// transaction of the first kind is answered before one of the second is sent. Within a kind,
// up to inFlight transactions are sent at once.
//
// Each transaction checks the versions this leader last wrote, as single writes did: when
// another writer got in between (an old leader still finishing), nothing of that
// transaction is applied, its nodes are read again and the error makes the leader plan
// anew. The other transactions, sent already, are applied or not each on its own, and the
// leader keeps what each did. Every transaction also checks this term's fence (r.kv): a
// leader deposed while it planned, or whose request waited out a reconnect, writes nothing.
func (r *reconciler) commit(ctx context.Context, changes []change) error {
	if len(changes) == 0 {
		return nil
	}
	split := len(changes)
	for i, c := range changes {
		if !c.fewer && !c.remove {
			split = i
			break
		}
	}
	if err := r.commitAtOnce(ctx, changes[:split]); err != nil {
		return err
	}
	return r.commitAtOnce(ctx, changes[split:])
}

// commitAtOnce writes changes with up to inFlight transactions sent at once, and keeps what
// each transaction did; it returns the first error in the changes' order.
func (r *reconciler) commitAtOnce(ctx context.Context, changes []change) error {
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
	batches := coord.SplitOps(ops, 0)
	type outcome struct {
		res []coord.OpResult
		err error
	}
	out := make([]outcome, len(batches))
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for i, batch := range batches {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			tctx, heard := ctx, func(error) {}
			if h := r.m.beforeCommit.Load(); h != nil {
				tctx, heard = (*h)(ctx)
			}
			out[i].res, out[i].err = r.kv.Txn(tctx, batch...)
			heard(out[i].err)
		}()
	}
	wg.Wait()
	var first error
	done := 0
	for i, batch := range batches {
		r.m.metrics.storeWrites.Add(float64(len(batch)))
		cs := changes[done : done+len(batch)]
		done += len(batch)
		if err := r.kept(ctx, cs, out[i].res, out[i].err); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// kept takes the outcome of the transaction that wrote cs: the assignments it wrote, or
// what the store holds of those it may not have.
func (r *reconciler) kept(ctx context.Context, cs []change, res []coord.OpResult, err error) error {
	if err != nil {
		if errors.Is(err, coord.ErrFenced) {
			// This term is over in the store's order: nothing of the batch was written,
			// and nothing more will be (the loop's context ends with the term).
			return fmt.Errorf("master: write %d assignments: %w", len(cs), err)
		}
		var te *coord.TxnError
		if errors.As(err, &te) {
			c := cs[te.Index]
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
		for _, c := range cs {
			_ = r.reload(ctx, c.node)
		}
		return fmt.Errorf("master: write %d assignments: %w", len(cs), err)
	}
	for i, c := range cs {
		if c.remove {
			delete(r.assign, c.node)
			continue
		}
		r.assign[c.node] = assignState{a: c.a, sum: sha256.Sum256(c.value), version: res[i].Version, exists: true}
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
