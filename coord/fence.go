package coord

import (
	"context"
	"errors"
	"fmt"
)

// ErrFenced is returned by the writes of a Fenced KV when the writer's election entry is
// gone or changed: it no longer leads, and nothing of the write was applied. It wraps
// neither ErrNotFound nor ErrConflict, so a read-modify-write (Update, Retry) stops at once
// instead of trying again.
var ErrFenced = errors.New("coord: fenced: the writer no longer leads")

// Fence is a leader's claim, as the store can check it: its election entry, which exists
// at Version only for as long as the leader's session lives and it has not given the term
// up. Sequential election keys are never reused, so once the entry is gone no write
// carrying the fence can succeed again, whatever session or connection carries it
// (go-zookeeper re-sends requests queued before a reconnect; the embedded client retries
// a request on a new session).
type Fence struct {
	Key     string
	Version int64
}

// Zero reports the zero Fence, which checks nothing.
func (f Fence) Zero() bool { return f.Key == "" }

// Op is the check that makes a transaction conditional on the fence: one CheckOp on the
// election entry, the cheapest op there is (no data is written or sent back).
func (f Fence) Op() Op { return CheckOp(f.Key, f.Version) }

// Fenced returns kv whose every write (Put, Create, Delete, Txn) is one transaction that
// also checks f: a writer deposed since it got f (its session expired, it resigned,
// another leads) writes nothing and gets ErrFenced. Reads pass through. With the zero
// Fence it returns kv as it is.
func Fenced(kv KV, f Fence) KV {
	if f.Zero() {
		return kv
	}
	return &fencedKV{kv: kv, f: f}
}

type fencedKV struct {
	kv KV
	f  Fence
}

func (k *fencedKV) Get(ctx context.Context, key string) (Entry, error) { return k.kv.Get(ctx, key) }

func (k *fencedKV) Children(ctx context.Context, key string) ([]string, error) {
	return k.kv.Children(ctx, key)
}

// Txn runs ops after the fence's check, in one transaction. Errors name the caller's ops
// by their own index.
func (k *fencedKV) Txn(ctx context.Context, ops ...Op) ([]OpResult, error) {
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: empty transaction", ErrInvalid)
	}
	all := make([]Op, 0, len(ops)+1)
	all = append(all, k.f.Op())
	all = append(all, ops...)
	res, err := k.kv.Txn(ctx, all...)
	if err != nil {
		var te *TxnError
		if errors.As(err, &te) {
			if te.Index == 0 {
				// %v, not %w: the entry's ErrNotFound or ErrConflict is not the caller's key's.
				return nil, fmt.Errorf("%w (election entry %s: %v)", ErrFenced, k.f.Key, te.Err)
			}
			return nil, &TxnError{Index: te.Index - 1, Op: te.Op, Err: te.Err}
		}
		return nil, err
	}
	return res[1:], nil
}

func (k *fencedKV) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if version != AnyVersion {
		res, err := k.Txn(ctx, PutOp(key, value, version))
		if err != nil {
			return 0, unwrapOne(err)
		}
		return res[0].Version, nil
	}
	// KV.Put with AnyVersion creates a missing key; inside a transaction Put does not, so
	// try the set, then the create, and again while another writer races us.
	for range retryAttempts {
		res, err := k.Txn(ctx, PutOp(key, value, AnyVersion))
		if err == nil {
			return res[0].Version, nil
		}
		if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrFenced) {
			return 0, unwrapOne(err)
		}
		_, err = k.Txn(ctx, CreateOp(key, value, Persistent))
		if err == nil {
			return 0, nil
		}
		if !errors.Is(err, ErrExists) || errors.Is(err, ErrFenced) {
			return 0, unwrapOne(err)
		}
	}
	return 0, fmt.Errorf("coord: put %s: %w", key, ErrContended)
}

func (k *fencedKV) Create(ctx context.Context, key string, value []byte, mode Mode) (string, error) {
	res, err := k.Txn(ctx, CreateOp(key, value, mode))
	if err != nil {
		return "", unwrapOne(err)
	}
	return res[0].Key, nil
}

func (k *fencedKV) Delete(ctx context.Context, key string, version int64) error {
	_, err := k.Txn(ctx, DeleteOp(key, version))
	return unwrapOne(err)
}

// unwrapOne turns the TxnError of a one-op transaction into a plain error about its key,
// as the single-key writes report them.
func unwrapOne(err error) error {
	var te *TxnError
	if errors.As(err, &te) {
		return fmt.Errorf("coord: %s %s: %w", te.Op.Kind, te.Op.Key, te.Err)
	}
	return err
}
