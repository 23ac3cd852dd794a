package master

import (
	"context"
	"maps"
	"path"
	"sync"

	"github.com/stormdock/stormdock/coord"
)

// mirror keeps an in-memory copy of a directory of the store (its children and their
// values) from watches, and pokes a channel after every change, so that the reconcile loop
// reads memory instead of the store and wakes within one watch delivery of a change.
type mirror struct {
	dir   string
	store coord.Watcher
	poke  func()
	// decode, when set, decodes each value as it arrives, once: readers take the decoded
	// values (decodedSnapshot), and the digest says whether the change is worth a poke:
	// node records change with every worker's memory reading, and planning does not care.
	// A value that does not decode is nil. The entries of such a mirror keep no value:
	// the raw records were a second copy of every node's, 25 MiB of the master's live heap
	// at ten thousand nodes, read by nobody but the console's map, which decoded them again.
	decode func(name string, value []byte) (v any, digest uint64)

	mu      sync.Mutex
	entries map[string]coord.Entry
	decoded map[string]decodedValue // with decode set
	// gen grows with every change of entries: whoever keeps something made from them
	// tells in O(1) whether it is still current.
	gen uint64
	// members grows when an entry comes, goes or changes owner (a node that re-registered),
	// not when a value changes: a read state stays current through memory readings.
	members uint64
	// changed is closed, and replaced, at every change: waitFor's wake-up.
	changed chan struct{}
	ready   chan struct{} // closed once the first listing and its values are in
	readied sync.Once
	wg      sync.WaitGroup
}

func newMirror(s coord.Watcher, dir string, poke func()) *mirror {
	return &mirror{dir: dir, store: s, poke: poke, entries: map[string]coord.Entry{}, decoded: map[string]decodedValue{},
		changed: make(chan struct{}), ready: make(chan struct{})}
}

// run watches until ctx is done; it returns once every watch goroutine has stopped.
func (m *mirror) run(ctx context.Context) error {
	defer m.wg.Wait()
	ch, err := m.store.WatchChildren(ctx, m.dir)
	if err != nil {
		return err
	}
	cancels := map[string]context.CancelFunc{}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	first := true
	for ev := range ch {
		want := map[string]bool{}
		for _, name := range ev.Children {
			want[name] = true
		}
		for name, c := range cancels {
			if !want[name] {
				c()
				delete(cancels, name)
			}
		}
		m.mu.Lock()
		for name := range m.entries {
			if !want[name] {
				delete(m.entries, name) // also what vanished while a previous run was down
				delete(m.decoded, name)
				m.members++
				m.bump()
			}
		}
		m.mu.Unlock()
		var waits []chan struct{}
		for name := range want {
			if _, ok := cancels[name]; ok {
				continue
			}
			cctx, cancel := context.WithCancel(ctx)
			cancels[name] = cancel
			got := make(chan struct{})
			waits = append(waits, got)
			if err := m.watchOne(cctx, name, got); err != nil {
				cancel()
				delete(cancels, name)
				close(got)
			}
		}
		if first {
			// The first listing is complete only once every child's value arrived.
			for _, w := range waits {
				select {
				case <-w:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			m.readied.Do(func() { close(m.ready) })
			first = false
		}
		m.poke()
	}
	return ctx.Err()
}

func (m *mirror) watchOne(ctx context.Context, name string, got chan struct{}) error {
	key := path.Join(m.dir, name)
	once := false
	handle := func(ev coord.Event) {
		var d decodedValue
		if m.decode != nil && ev.Exists {
			d.v, d.digest = m.decode(name, ev.Entry.Value)
			d.owner, d.rev = ev.Entry.Owner, ev.Entry.ModRev
			ev.Entry.Value = nil
		}
		m.mu.Lock()
		if ctx.Err() != nil {
			m.mu.Unlock()
			return // the child is gone; run has dropped its entry
		}
		old, had := m.entries[name]
		oldDigest := m.decoded[name].digest
		if ev.Exists {
			m.entries[name] = ev.Entry
			if m.decode != nil {
				m.decoded[name] = d
			}
		} else {
			delete(m.entries, name)
			delete(m.decoded, name)
		}
		if had != ev.Exists || old.Owner != ev.Entry.Owner {
			m.members++
		}
		m.bump()
		m.mu.Unlock()
		if !once {
			close(got)
			once = true
		}
		// A re-created entry (a new session's) always matters: the master stamps the
		// node's assignment with the session that now owns it.
		if !had || !ev.Exists || m.decode == nil || old.Owner != ev.Entry.Owner || oldDigest != d.digest {
			m.poke()
		}
	}
	finish := func() {
		if !once {
			close(got)
		}
		m.wg.Done()
	}
	// A store that hands states to a function spares a goroutine per child: two per node
	// of ten thousand were a fifth of the master's memory.
	if fw, ok := m.store.(coord.FuncWatcher); ok {
		m.wg.Add(1)
		if err := fw.WatchFunc(ctx, key, handle, finish); err != nil {
			m.wg.Done()
			return err
		}
		return nil
	}
	ch, err := m.store.Watch(ctx, key)
	if err != nil {
		return err
	}
	m.wg.Add(1)
	go func() {
		defer finish()
		for ev := range ch {
			handle(ev)
		}
	}()
	return nil
}

// bump counts a change and wakes waitFor's callers. m.mu is held.
func (m *mirror) bump() {
	m.gen++
	close(m.changed)
	m.changed = make(chan struct{})
}

// waitFor waits until ok holds for the child name as the mirror has it (exists false when
// it has none), or ctx ends.
func (m *mirror) waitFor(ctx context.Context, name string, ok func(e coord.Entry, exists bool) bool) error {
	for {
		m.mu.Lock()
		e, exists := m.entries[name]
		ch := m.changed
		m.mu.Unlock()
		if ok(e, exists) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// membership returns how many times entries came, went or changed owner.
func (m *mirror) membership() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members
}

// size returns how many entries the mirror holds.
func (m *mirror) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// generation returns the number of changes so far.
func (m *mirror) generation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

// has reports whether the directory has the child name.
func (m *mirror) has(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.entries[name]
	return ok
}

// decodedValue is an entry's value as decode made it, with its owning session and the
// revision it was decoded from.
type decodedValue struct {
	v      any
	digest uint64
	owner  int64
	rev    int64
}

// decodedSnapshot returns a copy of the decoded values by child name.
func (m *mirror) decodedSnapshot() map[string]decodedValue {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.decoded)
}

// decodedOne returns the decoded value of the child name, if the mirror has it.
func (m *mirror) decodedOne(name string) (decodedValue, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.decoded[name]
	return d, ok
}

// snapshot returns a copy of the entries by child name; a decoding mirror's have no value.
func (m *mirror) snapshot() map[string]coord.Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.entries)
}
