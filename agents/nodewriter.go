package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// ErrNodeTaken: the node's entry belongs to a live agent on another host (two agents were
// given the same node id).
var ErrNodeTaken = errors.New("node id registered by another agent")

// nodeWriter keeps the node's session-bound entry: it creates it under the keeper's session
// and rewrites it with the entry's version.
type nodeWriter struct {
	store coord.Store
	key   string
	host  string
	log   *slog.Logger

	version int64 // of our entry as last written; -1: unknown
}

// write puts b into the node's session-bound entry. It writes with the entry's version, never
// unconditionally: an unconditional Put would create a persistent entry while the session's
// entry is momentarily gone (expiry), and the node would then never disappear.
func (w *nodeWriter) write(ctx context.Context, b []byte) error {
	st := w.store
	for attempt := 0; attempt < 5; attempt++ {
		if w.version >= 0 {
			v, err := st.Put(ctx, w.key, b, w.version)
			switch {
			case err == nil:
				w.version = v
				return nil
			case errors.Is(err, coord.ErrNotFound), errors.Is(err, coord.ErrConflict):
				w.version = -1 // gone or re-created (new session): find out below
			default:
				return err
			}
		}
		_, err := st.Create(ctx, w.key, b, coord.Ephemeral)
		if err == nil {
			w.version = 0
			return nil
		}
		if !errors.Is(err, coord.ErrExists) {
			return err
		}
		e, err := st.Get(ctx, w.key)
		switch {
		case errors.Is(err, coord.ErrNotFound):
			continue
		case err != nil:
			return err
		case e.Owner == st.SessionID():
			w.version = e.Version
			continue
		}
		var old cluster.NodeRecord
		_ = json.Unmarshal(e.Value, &old)
		if old.Node.Host != w.host {
			return fmt.Errorf("%w: %s is held by agent %s on host %q", ErrNodeTaken, w.key, old.Agent, old.Node.Host)
		}
		// An earlier keeper on this host, whose session has not timed out yet. It is dead:
		// this keeper holds the state directory's keeper lock. Take the entry over now rather
		// than wait.
		w.log.Info("replacing the node entry of an earlier keeper", "old_agent", old.Agent)
		if err := st.Delete(ctx, w.key, e.Version); err != nil && !errors.Is(err, coord.ErrNotFound) && !errors.Is(err, coord.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("write %s: gave up after repeated conflicts", w.key)
}

// remove deletes the node's entry, if it is still this session's.
func (w *nodeWriter) remove(ctx context.Context) error {
	e, err := w.store.Get(ctx, w.key)
	if errors.Is(err, coord.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if e.Owner != w.store.SessionID() {
		return nil
	}
	if err := w.store.Delete(ctx, w.key, e.Version); err != nil && !errors.Is(err, coord.ErrNotFound) {
		return err
	}
	return nil
}
