package master

import (
	"context"
	"sync"
	"time"

	"github.com/stormdock/stormdock/cluster"
	"github.com/stormdock/stormdock/coord"
)

// adminToken keeps the admin token's hash (cluster.AdminTokenKey) as the store has it, from a
// watch: the API checks every request's token, and a store read for each one was a
// ZooKeeper round trip per request, most of a read's time when the store is busy (a
// thousand clients blocked on job status, ten thousand agents writing).
type adminToken struct {
	mu   sync.Mutex
	hash []byte
	ok   bool // the watch has delivered the key's state at least once
}

// watch follows the key until ctx ends.
func (t *adminToken) watch(ctx context.Context, store coord.Watcher) {
	for ctx.Err() == nil {
		ch, err := store.Watch(ctx, cluster.AdminTokenKey)
		if err != nil {
			t.set(nil, false)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		for ev := range ch {
			var v []byte
			if ev.Exists {
				v = ev.Entry.Value
			}
			t.set(v, true)
		}
		t.set(nil, false) // the watch ended: unknown until it is armed again
	}
}

func (t *adminToken) set(v []byte, ok bool) {
	t.mu.Lock()
	t.hash, t.ok = v, ok
	t.mu.Unlock()
}

// AdminTokenHash returns the admin token's hash as this master's watch last saw it, and
// whether the watch has seen the key at all (false: ask the store).
func (m *Master) AdminTokenHash() ([]byte, bool) {
	m.admin.mu.Lock()
	defer m.admin.mu.Unlock()
	return m.admin.hash, m.admin.ok
}
