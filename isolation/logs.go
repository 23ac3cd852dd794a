package isolation

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// ErrNoLogs: the worker has no log of the run asked for (no run before the last restart on
// this node, or a worker this node never ran).
var ErrNoLogs = errors.New("no logs")

// LogOptions say which output of a worker to read.
type LogOptions struct {
	// Follow keeps the reader open and returns what the worker writes as it writes it, also
	// after it restarts, until ctx is done.
	Follow bool
	// Tail starts that many lines before the end; negative reads the whole log kept.
	Tail int
	// Previous reads the run before the last restart (it is never followed).
	Previous bool
}

// LogReader reads workers' output, stdout and stderr together. Drivers keep the run before
// the last restart of a worker, so that the output of a crashed run can be read after the
// restart.
type LogReader interface {
	Logs(ctx context.Context, id string, opts LogOptions) (io.ReadCloser, error)
}

// ValidateID checks a worker id as Spec.Validate does (it names files and containers).
func ValidateID(id string) error {
	if !validID(id) {
		return fmt.Errorf("%w: worker id %q must match %s", ErrInvalidSpec, id, idRule)
	}
	return nil
}

// Discarder drops what a driver keeps of a worker after it ended (its previous run, kept for
// LogReader): agents call it when a worker leaves the node for good.
type Discarder interface {
	Discard(ctx context.Context, id string) error
}
