package coord

import (
	"context"
	"errors"
	"fmt"
)

// DeleteTree deletes key and everything under it, children first. It is not atomic: a
// concurrent writer can add entries while it runs (it then fails with ErrNotEmpty). A
// missing key is not an error.
func DeleteTree(ctx context.Context, kv KV, key string) error {
	kids, err := kv.Children(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("coord: delete tree %s: %w", key, err)
	}
	for _, k := range kids {
		if err := DeleteTree(ctx, kv, joinKey(key, k)); err != nil {
			return err
		}
	}
	if key == "/" {
		return nil
	}
	if err := kv.Delete(ctx, key, AnyVersion); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("coord: delete tree %s: %w", key, err)
	}
	return nil
}
