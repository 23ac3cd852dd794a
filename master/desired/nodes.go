package desired

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// UpdateNodeConf applies change to a node's operator settings with compare-and-set.
func UpdateNodeConf(ctx context.Context, s coord.KV, id string, change func(*cluster.NodeConf)) error {
	// A node has no settings until an operator gives some: a missing key is the zero NodeConf.
	key, err := keyOf(cluster.NodeConfKey(id))
	if err != nil {
		return err
	}
	_, err = coord.Update(ctx, s, key, func(cur []byte, exists bool) ([]byte, error) {
		var c cluster.NodeConf
		if exists && len(cur) > 0 {
			if err := json.Unmarshal(cur, &c); err != nil {
				return nil, fmt.Errorf("read settings of node %s: %w", id, err)
			}
		}
		change(&c)
		return json.Marshal(c)
	})
	if err != nil {
		return busy(err, "node "+id)
	}
	return nil
}
