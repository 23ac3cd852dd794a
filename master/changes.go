package master

import (
	"context"
	"sync"
	"weak"
)

// The API's blocking queries (package master/httpapi) wait for this master's state to
// change instead of polling it. The state a read answers from is the mirrors (jobs, nodes,
// node settings, assignments, tenants, data centers) and the leader's published Snapshot:
// ChangeIndex counts the changes of both, and WaitChange waits for the next one. Neither
// starts a goroutine: a waiter selects on the mirrors' own change channels and the
// publish channel, so a master nobody waits on pays nothing.

// ReadRefresh is how late a master that does not lead (or a leader whose published state
// went stale) may answer from the state it built before a change: a reader that saw a
// change should look again after this long even when nothing else changes (see Snapshot).
const ReadRefresh = readRefresh

// publishes counts the leader's published states this master has seen, for ChangeIndex.
type publishes struct {
	mu sync.Mutex
	// last is the published state seen last (zero: none, or not leading). Weak: a state
	// the leader replaced holds the cluster's decoded assignments, and must not outlive it
	// here while nobody asks for the index.
	last weak.Pointer[Snapshot]
	n    uint64
}

// ChangeIndex is the count of this master's state changes so far: it only grows while the
// process runs, and grows at every change of a mirror and at every state the leader
// publishes (or drops). It says nothing about what changed.
func (m *Master) ChangeIndex() uint64 {
	idx, _ := m.changes()
	return idx
}

// WaitChange waits until ChangeIndex is past after, or ctx ends, and returns the index then
// (with ctx's error when it ended first). A node's memory reading is a change: callers that
// care only for what they read coalesce (the API renders at most once per
// api.WatchInterval) and compare what they read.
func (m *Master) WaitChange(ctx context.Context, after uint64) (uint64, error) {
	for {
		idx, ch := m.changes()
		if idx > after {
			return idx, nil
		}
		select {
		case <-ch[0]:
		case <-ch[1]:
		case <-ch[2]:
		case <-ch[3]:
		case <-ch[4]:
		case <-ch[5]:
		case <-ch[6]:
		case <-ctx.Done():
			return idx, ctx.Err()
		}
	}
}

// changes returns the change index and the channels closed at the next change: each
// mirror's, and the leader's next publish. Each channel is taken with the count it goes
// with, so that no change between the two is missed.
func (m *Master) changes() (uint64, [7]<-chan struct{}) {
	var ch [7]<-chan struct{}
	var idx uint64
	for i, mr := range []*mirror{m.jobs, m.nodes, m.confs, m.assigns, m.tenants, m.dcs} {
		mr.mu.Lock()
		idx += mr.gen
		ch[i] = mr.changed
		mr.mu.Unlock()
	}
	st, next := m.leaderState()
	p := &m.published
	p.mu.Lock()
	if w := weak.Make(st); w != p.last {
		p.last = w
		p.n++
	}
	idx += p.n
	p.mu.Unlock()
	ch[6] = next
	return idx, ch
}
