package desired

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// PutDC stores a data center's record as it is, over whatever is stored (the leader's
// records of data centers it sees, and their rebalance done).
func PutDC(ctx context.Context, s coord.KV, rec cluster.DCRecord) error {
	val, _ := json.Marshal(rec)
	key, err := keyOf(cluster.DCKey(rec.Name))
	if err != nil {
		return err
	}
	if _, err := s.Put(ctx, key, val, coord.AnyVersion); err != nil {
		return fmt.Errorf("store data center %s: %w", rec.Name, err)
	}
	return nil
}

// SetDCState fails or restores a data center (restore with rebalance asks the leader to
// spread jobs back into it once).
func SetDCState(ctx context.Context, s coord.KV, dc, state string, rebalance bool) (cluster.DCRecord, error) {
	var rec cluster.DCRecord
	key, err := keyOf(cluster.DCKey(dc))
	if err != nil {
		return rec, err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		if !exists {
			return nil, fmt.Errorf("%w: no data center %q (see `stormdock dc list`)", api.ErrNotFound, dc)
		}
		rec = cluster.DCRecord{}
		if err := json.Unmarshal(cur, &rec); err != nil {
			return nil, fmt.Errorf("read data center %s: %w", dc, err)
		}
		if rec.State != state {
			rec.Since = time.Now().UTC()
		}
		rec.State, rec.Rebalance = state, rebalance
		return json.Marshal(rec)
	})
	if err != nil {
		return cluster.DCRecord{}, busy(err, "data center "+dc)
	}
	return rec, nil
}
