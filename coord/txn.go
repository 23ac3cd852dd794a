package coord

import (
	"errors"
	"fmt"
)

// OpKind names a transaction operation.
type OpKind int

const (
	OpCreate OpKind = iota + 1
	OpPut
	OpDelete
	OpCheck
)

func (k OpKind) String() string {
	switch k {
	case OpCreate:
		return "create"
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	case OpCheck:
		return "check"
	}
	return fmt.Sprintf("OpKind(%d)", int(k))
}

// Op is one operation of a transaction. Build ops with CreateOp, PutOp, DeleteOp and
// CheckOp. Inside a transaction Put never creates a key (ErrNotFound if missing), unlike
// KV.Put with AnyVersion. Missing parents of created keys are created before the
// transaction runs, outside it (they stay if the transaction fails).
type Op struct {
	Kind    OpKind
	Key     string
	Value   []byte
	Version int64
	Mode    Mode
}

// CreateOp creates key with the given mode.
func CreateOp(key string, value []byte, mode Mode) Op {
	return Op{Kind: OpCreate, Key: key, Value: value, Mode: mode, Version: AnyVersion}
}

// PutOp sets an existing key's value, at version unless it is AnyVersion.
func PutOp(key string, value []byte, version int64) Op {
	return Op{Kind: OpPut, Key: key, Value: value, Version: version}
}

// DeleteOp deletes key, at version unless it is AnyVersion.
func DeleteOp(key string, version int64) Op {
	return Op{Kind: OpDelete, Key: key, Version: version}
}

// CheckOp asserts that key exists, at version unless it is AnyVersion, without changing it.
func CheckOp(key string, version int64) Op {
	return Op{Kind: OpCheck, Key: key, Version: version}
}

// OpResult is the outcome of one op of a committed transaction.
type OpResult struct {
	Key     string // for OpCreate, the created key (with a sequential suffix)
	Version int64  // for OpPut, the new version
}

// TxnError says which op made a transaction fail. It wraps the op's error, so
// errors.Is(err, ErrConflict) works on it.
type TxnError struct {
	Index int
	Op    Op
	Err   error
}

func (e *TxnError) Error() string {
	return fmt.Sprintf("coord: txn op %d (%s %s): %v", e.Index, e.Op.Kind, e.Op.Key, e.Err)
}

func (e *TxnError) Unwrap() error { return e.Err }

func validateOps(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: empty transaction", ErrInvalid)
	}
	for i, op := range ops {
		var err error
		switch {
		case op.Kind < OpCreate || op.Kind > OpCheck:
			err = fmt.Errorf("%w: unknown op kind %d", ErrInvalid, op.Kind)
		case op.Kind == OpCreate && !op.Mode.valid():
			err = fmt.Errorf("%w: unknown mode %d", ErrInvalid, op.Mode)
		case op.Key == "/":
			err = fmt.Errorf("%w: the root key cannot be changed", ErrInvalid)
		default:
			err = ValidateKey(op.Key)
		}
		if err != nil {
			return &TxnError{Index: i, Op: op, Err: err}
		}
	}
	return nil
}

// isUnavailable reports whether err is a transient store failure worth retrying.
func isUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// MaxTxnBytes is the most one batch of SplitOps carries: half of the 1 MiB that ZooKeeper
// accepts in one request by default (its jute.maxbuffer), leaving room for the request's
// framing and for a server configured tighter.
const MaxTxnBytes = 512 << 10

// opOverhead is what an op adds to a request besides its key and value: header, version,
// flags and a create's ACL.
const opOverhead = 64

// SplitOps cuts ops into consecutive batches of at most limit bytes (MaxTxnBytes when limit
// is 0 or less), each to go in one Txn, in order. An op larger than limit gets a batch of
// its own, which the store refuses if it is too large for one request.
func SplitOps(ops []Op, limit int) [][]Op {
	if limit <= 0 {
		limit = MaxTxnBytes
	}
	var out [][]Op
	start, size := 0, 0
	for i, op := range ops {
		n := len(op.Key) + len(op.Value) + opOverhead
		if i > start && size+n > limit {
			out = append(out, ops[start:i:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(ops) {
		out = append(out, ops[start:len(ops):len(ops)])
	}
	return out
}
