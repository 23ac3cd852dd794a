package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"
)

// Server is the embedded in-process coordination server: a tree of versioned entries,
// sessions and one-shot watches with ZooKeeper's semantics. Clients (Connect) each have their
// own session. With a Path it keeps its persistent entries in one JSON file, rewritten
// atomically after every change and loaded when the server starts.
type Server struct {
	log  *slog.Logger
	path string
	lock *os.File // flock on path+".lock": one process per file

	mu       sync.Mutex
	t        *tree
	sessions map[int64]*esession
	nextSID  int64
	dataW    map[string][]chan struct{} // one-shot watches on a key's data/existence
	childW   map[string][]chan struct{} // one-shot watches on a key's children
	closed   bool

	done chan struct{}
	wg   sync.WaitGroup
}

// ServerOptions configure an embedded Server.
type ServerOptions struct {
	// Path, if set, is the JSON file holding the persistent entries.
	Path string
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
}

type esession struct {
	id       int64
	timeout  time.Duration // 0: never times out
	lastSeen time.Time
	expired  func(id int64) // tells the client, must not block
}

// errSessionGone: the session named in a request no longer exists on the server.
var errSessionGone = fmt.Errorf("%w: session expired", ErrUnavailable)

// reapInterval is how often the server looks for sessions whose keepalives stopped.
const reapInterval = 20 * time.Millisecond

// NewServer starts an embedded server, loading opts.Path if it exists.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		log:      opts.Logger.With("component", "coord", "store", "embedded"),
		path:     opts.Path,
		t:        newTree(),
		sessions: map[int64]*esession{},
		dataW:    map[string][]chan struct{}{},
		childW:   map[string][]chan struct{}{},
		done:     make(chan struct{}),
	}
	if s.path != "" {
		t, err := loadTree(s.path)
		if err != nil {
			return nil, fmt.Errorf("coord: load %s: %w", s.path, err)
		}
		s.t = t
		if s.lock, err = lockFile(s.path + ".lock"); err != nil {
			return nil, fmt.Errorf("coord: open %s: %w", s.path, err)
		}
	}
	s.wg.Add(1)
	go s.reaper()
	return s, nil
}

// Close stops the server. Its clients' requests fail with ErrClosed afterwards.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.mu.Unlock()
	s.wg.Wait()
	if s.lock != nil {
		s.lock.Close() // releases the flock
	}
	return nil
}

func (s *Server) reaper() {
	defer s.wg.Done()
	tk := time.NewTicker(reapInterval)
	defer tk.Stop()
	last := time.Now()
	for {
		select {
		case <-s.done:
			return
		case <-tk.C:
			now := time.Now()
			gap := now.Sub(last) - reapInterval
			last = now
			s.mu.Lock()
			if gap > 5*reapInterval {
				// The whole process stalled (a starved machine): no client of this in-process
				// server could send a keepalive meanwhile, so the stall counts for nobody.
				for _, ss := range s.sessions {
					ss.lastSeen = ss.lastSeen.Add(gap)
				}
			}
			var dead []int64
			for id, ss := range s.sessions {
				if ss.timeout > 0 && now.Sub(ss.lastSeen) > ss.timeout {
					dead = append(dead, id)
				}
			}
			for _, id := range dead {
				s.log.Info("coord: embedded session timed out", "session", sessionHex(id))
				s.endSessionLocked(id, true)
			}
			s.mu.Unlock()
		}
	}
}

// Sessions returns the ids of the live sessions.
func (s *Server) Sessions() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.sessions))
}

// ExpireSession ends session id as ZooKeeper expires a silent client's session: its
// ephemeral entries are deleted, watchers are told, and the client is notified (it then
// opens a new session and re-creates its ephemeral entries, as a ZooKeeper client does).
func (s *Server) ExpireSession(id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sessions[id]; !ok {
		return fmt.Errorf("coord: expire session %s: %w", sessionHex(id), ErrNotFound)
	}
	s.endSessionLocked(id, true)
	return nil
}

func (s *Server) newSession(timeout time.Duration, expired func(int64)) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	s.nextSID++
	id := s.nextSID
	s.sessions[id] = &esession{id: id, timeout: timeout, lastSeen: time.Now(), expired: expired}
	return id, nil
}

func (s *Server) touch(id int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.sessions[id]
	if !ok {
		return errSessionGone
	}
	ss.lastSeen = time.Now()
	return nil
}

func (s *Server) closeSession(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endSessionLocked(id, false)
}

// endSessionLocked removes session id and its ephemeral entries; notify tells the client.
func (s *Server) endSessionLocked(id int64, notify bool) {
	ss, ok := s.sessions[id]
	if !ok {
		return
	}
	delete(s.sessions, id)
	var keys []string
	for k, n := range s.t.nodes {
		if n.owner == id {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		ch := s.t.begin()
		for _, k := range keys {
			_ = s.t.remove(ch, k, AnyVersion)
		}
		// The session is over whatever the disk says: its ephemeral entries go. A failed
		// save misses only their parents' child versions, which no later load needs
		// (sessions do not outlive the server), and the next save writes them.
		_ = s.commitLocked(ch, true)
	}
	if notify && ss.expired != nil {
		ss.expired(id)
	}
}

// commitLocked commits ch, made on the live tree. With a file, a change of a persistent
// entry is saved first: if the save fails, the change is rolled back whole (no read sees
// it, no watch fires) and the caller reports the write failed, as ZooKeeper answers only
// once its transaction log holds the write; unless keep, which applies it all the same.
// Then the watches of ch fire.
func (s *Server) commitLocked(ch *changes, keep bool) error {
	if s.path != "" && ch.persistent {
		if err := saveTree(s.path, s.t); err != nil {
			if !keep {
				ch.rollback()
				s.log.Error("coord: persist embedded store: the change is not applied", "path", s.path, "err", err)
				return fmt.Errorf("%w: persist: %w", ErrUnavailable, err)
			}
			s.log.Error("coord: persist embedded store", "path", s.path, "err", err)
		}
	}
	for k := range ch.data {
		for _, c := range s.dataW[k] {
			close(c)
		}
		delete(s.dataW, k)
	}
	for k := range ch.child {
		for _, c := range s.childW[k] {
			close(c)
		}
		delete(s.childW, k)
	}
	return nil
}

// do runs a change on the live tree and commits it (saved before it applies:
// commitLocked); fn must check everything before it changes t.
func (s *Server) do(sid int64, fn func(t *tree, ch *changes) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if _, ok := s.sessions[sid]; !ok {
		return errSessionGone
	}
	ch := s.t.begin()
	if err := fn(s.t, ch); err != nil {
		ch.rollback()
		return err
	}
	return s.commitLocked(ch, false)
}

func (s *Server) read(fn func(t *tree) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return fn(s.t)
}

func (s *Server) get(key string) (Entry, error) {
	var e Entry
	err := s.read(func(t *tree) error {
		n, ok := t.nodes[key]
		if !ok {
			return ErrNotFound
		}
		e = n.entry(key)
		return nil
	})
	return e, err
}

func (s *Server) children(key string) ([]string, int64, error) {
	var kids []string
	var ver int64
	err := s.read(func(t *tree) error {
		n, ok := t.nodes[key]
		if !ok {
			return ErrNotFound
		}
		kids = slices.Sorted(maps.Keys(n.children))
		if kids == nil {
			kids = []string{}
		}
		ver = n.cversion
		return nil
	})
	return kids, ver, err
}

func (s *Server) create(sid int64, key string, value []byte, mode Mode) (string, error) {
	var created string
	err := s.do(sid, func(t *tree, ch *changes) error {
		var err error
		created, err = t.create(ch, key, value, mode, sid, true)
		return err
	})
	return created, err
}

func (s *Server) put(sid int64, key string, value []byte, version int64) (int64, error) {
	var v int64
	err := s.do(sid, func(t *tree, ch *changes) error {
		_, ok := t.nodes[key]
		if !ok && version == AnyVersion {
			_, err := t.create(ch, key, value, Persistent, sid, true)
			return err
		}
		var err error
		v, err = t.set(ch, key, value, version)
		return err
	})
	return v, err
}

func (s *Server) remove(sid int64, key string, version int64) error {
	return s.do(sid, func(t *tree, ch *changes) error { return t.remove(ch, key, version) })
}

func (s *Server) txn(sid int64, ops []Op) ([]OpResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if _, ok := s.sessions[sid]; !ok {
		return nil, errSessionGone
	}
	// Parents of created keys first, outside the transaction, as ZooKeeper does.
	inTxn := map[string]bool{}
	for _, op := range ops {
		if op.Kind == OpCreate {
			inTxn[op.Key] = true
		}
	}
	pch := s.t.begin()
	for _, op := range ops {
		if op.Kind != OpCreate {
			continue
		}
		for _, a := range ancestors(op.Key) {
			if _, ok := s.t.nodes[a]; ok || inTxn[a] {
				continue
			}
			if _, err := s.t.create(pch, a, nil, Persistent, sid, false); err != nil && !errors.Is(err, ErrExists) {
				break // the op itself reports it
			}
		}
	}
	if pch.used {
		if err := s.commitLocked(pch, false); err != nil {
			return nil, fmt.Errorf("coord: txn: %w", err)
		}
	}
	// Then the ops, on the live tree under the lock, rolled back whole unless every op
	// succeeds and, with a file, the result is saved.
	ch := s.t.begin()
	out := make([]OpResult, len(ops))
	for i, op := range ops {
		out[i].Key = op.Key
		var err error
		switch op.Kind {
		case OpCreate:
			out[i].Key, err = s.t.create(ch, op.Key, op.Value, op.Mode, sid, false)
		case OpPut:
			out[i].Version, err = s.t.set(ch, op.Key, op.Value, op.Version)
		case OpDelete:
			err = s.t.remove(ch, op.Key, op.Version)
		case OpCheck:
			err = s.t.check(op.Key, op.Version)
		}
		if err != nil {
			ch.rollback()
			return nil, &TxnError{Index: i, Op: op, Err: err}
		}
	}
	if err := s.commitLocked(ch, false); err != nil {
		return nil, fmt.Errorf("coord: txn: %w", err)
	}
	return out, nil
}

// arm registers a one-shot watch channel in m[key] and returns the waiter for it.
func (s *Server) arm(m map[string][]chan struct{}, key string) waitFunc {
	c := make(chan struct{})
	m[key] = append(m[key], c)
	return func(ctx context.Context) error {
		select {
		case <-c:
			return nil
		case <-s.done:
			return ErrClosed
		case <-ctx.Done():
			s.mu.Lock()
			m[key] = slices.DeleteFunc(m[key], func(x chan struct{}) bool { return x == c })
			if len(m[key]) == 0 {
				delete(m, key)
			}
			s.mu.Unlock()
			return ctx.Err()
		}
	}
}

func (s *Server) armData(key string) (Entry, bool, waitFunc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Entry{}, false, nil, ErrClosed
	}
	n, ok := s.t.nodes[key]
	var e Entry
	if ok {
		e = n.entry(key)
	}
	return e, ok, s.arm(s.dataW, key), nil
}

func (s *Server) armChildren(key string) (ChildrenEvent, waitFunc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ChildrenEvent{}, nil, ErrClosed
	}
	n, ok := s.t.nodes[key]
	if !ok {
		// Like ZooKeeper: a missing key gets an existence watch.
		return ChildrenEvent{Children: []string{}}, s.arm(s.dataW, key), nil
	}
	kids := slices.Sorted(maps.Keys(n.children))
	if kids == nil {
		kids = []string{}
	}
	return ChildrenEvent{Exists: true, Children: kids, Version: n.cversion}, s.arm(s.childW, key), nil
}
