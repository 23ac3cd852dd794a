package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// OpenStore connects to a cluster's store for the provisioner's own reads and writes.
func OpenStore(ctx context.Context, url string, log *slog.Logger) (coord.Store, error) {
	return openStore(ctx, url, coord.Options{}, log)
}

// openStore opens url with opts' credentials and TLS files.
func openStore(ctx context.Context, url string, opts coord.Options, log *slog.Logger) (coord.Store, error) {
	opts.SessionTimeout, opts.ConnectTimeout, opts.Logger = 4*time.Second, 10*time.Second, log
	s, err := coord.Open(ctx, url, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: open store %s: %v: check that ZooKeeper runs there", ErrUnavailable, url, err)
	}
	return s, nil
}

// Registered returns the ids of the nodes whose agents are registered in the store.
func Registered(ctx context.Context, kv coord.KV) (map[string]bool, error) {
	ids, err := kv.Children(ctx, cluster.NodesKey)
	if errors.Is(err, coord.ErrNotFound) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list registered nodes: %w", err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// MasterAPI returns the API URL the leading master published, or "" when none leads.
func MasterAPI(ctx context.Context, kv coord.KV) (string, error) {
	e, err := kv.Get(ctx, cluster.MasterKey)
	if errors.Is(err, coord.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read master info: %w", err)
	}
	var mi cluster.MasterInfo
	if err := json.Unmarshal(e.Value, &mi); err != nil {
		return "", fmt.Errorf("read master info: %w", err)
	}
	return mi.API, nil
}

// WaitRegistered waits until every node in ids is registered in the store. check is
// called on every round so that the provider can fail fast (an agent container exited).
func WaitRegistered(ctx context.Context, kv coord.KV, ids []string, check func(context.Context) error) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		reg, err := Registered(ctx, kv)
		if err != nil && ctx.Err() == nil {
			return err
		}
		var missing []string
		for _, id := range ids {
			if !reg[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 && err == nil {
			return nil
		}
		if check != nil {
			if err := check(ctx); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agents %v did not register in the store: %w", missing, ctx.Err())
		case <-t.C:
		}
	}
}

// NodeInfo is what a registered node says of itself.
type NodeInfo struct {
	DC, Rack string
}

// Nodes returns the registered nodes with their dc and rack.
func Nodes(ctx context.Context, kv coord.KV) (map[string]NodeInfo, error) {
	ids, err := Registered(ctx, kv)
	if err != nil {
		return nil, err
	}
	out := make(map[string]NodeInfo, len(ids))
	for id := range ids {
		key, err := cluster.NodeKey(id)
		if err != nil {
			continue // not a node any agent registers
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, coord.ErrNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read node %s: %w", id, err)
		}
		var rec cluster.NodeRecord
		if err := json.Unmarshal(e.Value, &rec); err != nil {
			return nil, fmt.Errorf("read node %s: %w", id, err)
		}
		out[id] = NodeInfo{DC: rec.Node.DC, Rack: rec.Node.Rack}
	}
	return out, nil
}
