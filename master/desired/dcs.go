package desired

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stormdock/stormdock/api"
	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// PutDC stores a data center's record as it is, over whatever is stored. The leader never
// uses it (its writes are versioned: EndRebalance); tests seed records with it.
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

// EndRebalance records that the leader carries out the rebalance a restore asked for in
// dc: it clears the request with compare-and-set, and only while the record still asks for
// it in an active data center, so an operator's `dc fail` (or a new restore) written since
// the leader read the record is never undone. It reports whether the request was cleared.
func EndRebalance(ctx context.Context, s coord.KV, dc string) (bool, error) {
	key, err := keyOf(cluster.DCKey(dc))
	if err != nil {
		return false, err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		var rec cluster.DCRecord
		if !exists || json.Unmarshal(cur, &rec) != nil || !rec.Rebalance || rec.State != cluster.DCActive {
			return nil, errNoRebalance
		}
		rec.Rebalance = false
		return json.Marshal(rec)
	})
	switch {
	case errors.Is(err, errNoRebalance):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("record the rebalance of data center %s: %w", dc, err)
	}
	return true, nil
}

var errNoRebalance = errors.New("no rebalance asked")

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
