package multidc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// RouterRecord is what a router keeps at cluster.RouterKey(job): its status, whose
// Checkpoint field is the checkpoint (every offset up to it is in the sink), and which
// router wrote it.
type RouterRecord struct {
	Status
	Instance string `json:"instance"`
	// Sink is the evidence of a file sink as the router last made it durable: how the next
	// router knows the file as its own (see SinkEvidence).
	Sink *SinkEvidence `json:"sink,omitempty"`
	// Stopped marks the last record of a router that stopped: a standby takes over at once.
	Stopped bool `json:"stopped,omitempty"`
}

// ReadRecord reads a job's router record. ok is false while no router has written one.
func ReadRecord(ctx context.Context, kv coord.KV, job string) (rec RouterRecord, ok bool, err error) {
	rec, _, ok, err = readRecord(ctx, kv, job)
	return rec, ok, err
}

// readRecord also returns the entry's version, -1 when the key does not exist.
func readRecord(ctx context.Context, kv coord.KV, job string) (RouterRecord, int64, bool, error) {
	key, err := cluster.RouterKey(job)
	if err != nil {
		return RouterRecord{}, 0, false, fmt.Errorf("multidc: %w", err)
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, coord.ErrNotFound) {
		return RouterRecord{}, -1, false, nil
	}
	if err != nil {
		return RouterRecord{}, 0, false, fmt.Errorf("multidc: read %s: %w", key, err)
	}
	if len(e.Value) == 0 {
		// The election made the key as the parent of its entries; no router wrote it yet.
		return RouterRecord{}, e.Version, false, nil
	}
	var rec RouterRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return RouterRecord{}, 0, false, fmt.Errorf("multidc: decode %s: %w", key, err)
	}
	return rec, e.Version, true, nil
}

// checkpointer writes a job's router record with compare-and-set: a conflict means another
// router wrote it, which the election should have made impossible, so the router stops
// rather than risk two writers on one sink.
type checkpointer struct {
	kv      coord.KV
	job     string
	version int64 // of the key as this router last read or wrote it; -1: absent
}

func (c *checkpointer) load(ctx context.Context) (RouterRecord, bool, error) {
	rec, v, ok, err := readRecord(ctx, c.kv, c.job)
	if err != nil {
		return RouterRecord{}, false, err
	}
	c.version = v
	return rec, ok, nil
}

func (c *checkpointer) save(ctx context.Context, rec RouterRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("multidc: encode router record: %w", err)
	}
	key, err := cluster.RouterKey(c.job)
	if err != nil {
		return fmt.Errorf("multidc: %w", err)
	}
	if c.version < 0 {
		if _, err := c.kv.Create(ctx, key, b, coord.Persistent); err != nil {
			if errors.Is(err, coord.ErrExists) {
				err = fmt.Errorf("%w: %w", coord.ErrConflict, err)
			}
			return fmt.Errorf("multidc: create %s: %w", key, err)
		}
		c.version = 0
		return nil
	}
	v, err := c.kv.Put(ctx, key, b, c.version)
	if errors.Is(err, coord.ErrConflict) {
		// A write of ours whose answer was lost (a dropped connection) also shows up as a
		// conflict: the record then names this router, and the write can be repeated.
		cur, cv, ok, rerr := readRecord(ctx, c.kv, c.job)
		if rerr == nil && ok && cur.Instance == rec.Instance {
			v, err = c.kv.Put(ctx, key, b, cv)
		}
	}
	if err != nil {
		return fmt.Errorf("multidc: write %s at version %d: %w", key, c.version, err)
	}
	c.version = v
	return nil
}
