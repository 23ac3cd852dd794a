package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// Embedded is a Store client of an embedded Server, with its own session.
type Embedded struct {
	srv     *Server
	opts    Options
	timeout time.Duration // session timeout, 0: none
	log     *slog.Logger
	release func() // drops the client's hold on a shared server

	life   context.Context
	stop   context.CancelFunc
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup // keepalive and session loops
	gs     goroutines     // watches

	gate *readyGate
	hub  *sessionHub

	expMu   sync.Mutex
	expQ    []int64
	expWake chan struct{}

	mu    sync.Mutex
	sid   int64
	owned map[string][]byte
	sids  map[int64]bool
}

var _ Store = (*Embedded)(nil)

// Connect opens a client with a new session. opts.SessionTimeout arms the keepalive (see
// Options); Credentials and Dialer are ignored.
func (s *Server) Connect(opts Options) (*Embedded, error) {
	opts = opts.withDefaults()
	c := &Embedded{
		srv:     s,
		opts:    opts,
		log:     s.log,
		closed:  make(chan struct{}),
		hub:     newSessionHub(),
		expWake: make(chan struct{}, 1),
		owned:   map[string][]byte{},
		sids:    map[int64]bool{},
	}
	if opts.Logger != slog.Default() {
		c.log = opts.Logger.With("component", "coord", "store", "embedded")
	}
	if opts.SessionTimeout > 0 {
		c.timeout = opts.SessionTimeout
	}
	c.life, c.stop = context.WithCancel(context.Background())
	c.gate = newReadyGate(c.closed)
	sid, err := s.newSession(c.timeout, c.onExpired)
	if err != nil {
		return nil, fmt.Errorf("coord: connect to embedded store: %w", err)
	}
	c.sid = sid
	c.sids[sid] = true
	c.gate.set(true)
	c.wg.Add(1)
	go c.sessionLoop()
	if c.timeout > 0 {
		c.wg.Add(1)
		go c.keepalive()
	}
	return c, nil
}

// Server returns the server the client is connected to.
func (c *Embedded) Server() *Server { return c.srv }

// SessionID implements Session.
func (c *Embedded) SessionID() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sid
}

// SessionEvents implements Session.
func (c *Embedded) SessionEvents(ctx context.Context) <-chan SessionEvent {
	return c.hub.subscribe(ctx)
}

// Close ends the client's session (its ephemeral entries go at once) and stops its
// goroutines.
func (c *Embedded) Close() error {
	c.shutdown(true)
	return nil
}

// Crash stops the client as if its process had been killed: every goroutine stops and
// requests fail with ErrClosed, but the session stays on the server until its keepalives are
// missed for the session timeout, when its ephemeral entries go and watchers are told. With
// no session timeout the session is expired at once.
func (c *Embedded) Crash() {
	c.shutdown(false)
}

func (c *Embedded) shutdown(endSession bool) {
	c.once.Do(func() {
		c.stop()
		close(c.closed)
		c.hub.close()
		c.gs.shutdown()
		c.wg.Wait()
		sid := c.SessionID()
		switch {
		case endSession:
			c.srv.closeSession(sid)
		case c.timeout == 0:
			_ = c.srv.ExpireSession(sid)
		}
		if c.release != nil {
			c.release()
		}
	})
}

func (c *Embedded) keepalive() {
	defer c.wg.Done()
	tk := time.NewTicker(c.timeout / 3)
	defer tk.Stop()
	for {
		select {
		case <-c.closed:
			return
		case <-tk.C:
			_ = c.srv.touch(c.SessionID()) // a gone session is handled by sessionLoop
		}
	}
}

// onExpired is called by the server (holding its lock) when the session expired.
func (c *Embedded) onExpired(id int64) {
	c.expMu.Lock()
	c.expQ = append(c.expQ, id)
	c.expMu.Unlock()
	select {
	case c.expWake <- struct{}{}:
	default:
	}
}

// sessionLoop replaces an expired session with a new one, as a ZooKeeper client does, and
// re-creates the client's ephemeral entries.
func (c *Embedded) sessionLoop() {
	defer c.wg.Done()
	for {
		c.expMu.Lock()
		q := c.expQ
		c.expQ = nil
		c.expMu.Unlock()
		if len(q) == 0 {
			select {
			case <-c.expWake:
				continue
			case <-c.closed:
				return
			}
		}
		for _, old := range q {
			if old != c.SessionID() {
				continue
			}
			c.gate.set(false)
			c.log.Warn("coord: embedded session expired", "session", sessionHex(old))
			c.hub.publish(SessionEvent{Type: SessionExpired, SessionID: old})
			sid, err := c.srv.newSession(c.timeout, c.onExpired)
			if err != nil {
				c.log.Error("coord: embedded store: no new session", "err", err)
				return
			}
			c.mu.Lock()
			c.sid = sid
			c.sids[sid] = true
			owned := maps.Clone(c.owned)
			c.mu.Unlock()
			c.gate.set(true)
			restored, lost := restoreOwned(c.life, embeddedRaw{c}, owned, sid, time.Minute, func(id int64) bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.sids[id]
			})
			c.mu.Lock()
			for _, k := range lost {
				delete(c.owned, k)
			}
			c.mu.Unlock()
			c.log.Info("coord: new embedded session", "session", sessionHex(sid), "restored", restored, "lost", lost)
			c.hub.publish(SessionEvent{Type: SessionNew, SessionID: sid, Restored: restored, Lost: lost})
		}
	}
}

// withSession runs fn with the current session, retrying on a new session if the server
// expired the one fn was given before the client noticed.
func (c *Embedded) withSession(ctx context.Context, fn func(sid int64) error) error {
	for {
		select {
		case <-c.closed:
			return ErrClosed
		default:
		}
		if err := c.gate.wait(ctx); err != nil {
			return err
		}
		sid := c.SessionID()
		err := fn(sid)
		if !errors.Is(err, errSessionGone) {
			return err
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-c.closed:
			t.Stop()
			return ErrClosed
		}
	}
}

func (c *Embedded) live() error {
	select {
	case <-c.closed:
		return ErrClosed
	default:
		return nil
	}
}

// Get implements KV.
func (c *Embedded) Get(ctx context.Context, key string) (Entry, error) {
	if err := ValidateKey(key); err != nil {
		return Entry{}, fmt.Errorf("coord: get %s: %w", key, err)
	}
	if err := c.live(); err != nil {
		return Entry{}, fmt.Errorf("coord: get %s: %w", key, err)
	}
	e, err := c.srv.get(key)
	if err != nil {
		return Entry{}, fmt.Errorf("coord: get %s: %w", key, err)
	}
	return e, nil
}

// Sync implements Syncer: the embedded server is the whole store, so a client with a session
// is in sync with it.
func (c *Embedded) Sync(ctx context.Context) error {
	if err := c.live(); err != nil {
		return fmt.Errorf("coord: sync: %w", err)
	}
	return ctx.Err()
}

// Put implements KV.
func (c *Embedded) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := validateWriteKey(key); err != nil {
		return 0, fmt.Errorf("coord: put %s: %w", key, err)
	}
	if version < AnyVersion {
		return 0, fmt.Errorf("coord: put %s: %w: version %d", key, ErrInvalid, version)
	}
	var v int64
	err := c.withSession(ctx, func(sid int64) error {
		var err error
		v, err = c.srv.put(sid, key, value, version)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("coord: put %s: %w", key, err)
	}
	c.mu.Lock()
	if _, ok := c.owned[key]; ok {
		c.owned[key] = slices.Clone(value)
	}
	c.mu.Unlock()
	return v, nil
}

// Create implements KV.
func (c *Embedded) Create(ctx context.Context, key string, value []byte, mode Mode) (string, error) {
	if err := validateWriteKey(key); err != nil {
		return "", fmt.Errorf("coord: create %s: %w", key, err)
	}
	if !mode.valid() {
		return "", fmt.Errorf("coord: create %s: %w: unknown mode %d", key, ErrInvalid, mode)
	}
	var created string
	err := c.withSession(ctx, func(sid int64) error {
		var err error
		created, err = c.srv.create(sid, key, value, mode)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("coord: create %s: %w", key, err)
	}
	if mode == Ephemeral {
		c.mu.Lock()
		c.owned[created] = slices.Clone(value)
		c.mu.Unlock()
	}
	return created, nil
}

// Delete implements KV.
func (c *Embedded) Delete(ctx context.Context, key string, version int64) error {
	if err := validateWriteKey(key); err != nil {
		return fmt.Errorf("coord: delete %s: %w", key, err)
	}
	if version < AnyVersion {
		return fmt.Errorf("coord: delete %s: %w: version %d", key, ErrInvalid, version)
	}
	err := c.withSession(ctx, func(sid int64) error { return c.srv.remove(sid, key, version) })
	if err != nil {
		return fmt.Errorf("coord: delete %s: %w", key, err)
	}
	c.mu.Lock()
	delete(c.owned, key)
	c.mu.Unlock()
	return nil
}

// Children implements KV.
func (c *Embedded) Children(ctx context.Context, key string) ([]string, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: children %s: %w", key, err)
	}
	if err := c.live(); err != nil {
		return nil, fmt.Errorf("coord: children %s: %w", key, err)
	}
	kids, _, err := c.srv.children(key)
	if err != nil {
		return nil, fmt.Errorf("coord: children %s: %w", key, err)
	}
	return kids, nil
}

// Txn implements KV.
func (c *Embedded) Txn(ctx context.Context, ops ...Op) ([]OpResult, error) {
	if err := validateOps(ops); err != nil {
		return nil, err
	}
	for i, op := range ops {
		if op.Version < AnyVersion {
			return nil, &TxnError{Index: i, Op: op, Err: fmt.Errorf("%w: version %d", ErrInvalid, op.Version)}
		}
	}
	var out []OpResult
	err := c.withSession(ctx, func(sid int64) error {
		var err error
		out, err = c.srv.txn(sid, ops)
		return err
	})
	if err != nil {
		var te *TxnError
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, fmt.Errorf("coord: txn: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, op := range ops {
		switch {
		case op.Kind == OpCreate && op.Mode == Ephemeral:
			c.owned[out[i].Key] = slices.Clone(op.Value)
		case op.Kind == OpPut:
			if _, ok := c.owned[op.Key]; ok {
				c.owned[op.Key] = slices.Clone(op.Value)
			}
		case op.Kind == OpDelete:
			delete(c.owned, op.Key)
		}
	}
	return out, nil
}

// Watch implements Watcher.
func (c *Embedded) Watch(ctx context.Context, key string) (<-chan Event, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: watch %s: %w", key, err)
	}
	if err := c.live(); err != nil {
		return nil, fmt.Errorf("coord: watch %s: %w", key, err)
	}
	out := make(chan Event)
	wctx, done := c.goroutineContext(ctx)
	go func() {
		defer done()
		watchData(wctx, embeddedArmer{c.srv}, key, out, c.log)
	}()
	return out, nil
}

// WatchFunc implements FuncWatcher.
func (c *Embedded) WatchFunc(ctx context.Context, key string, fn func(Event), done func()) error {
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("coord: watch %s: %w", key, err)
	}
	if err := c.live(); err != nil {
		return fmt.Errorf("coord: watch %s: %w", key, err)
	}
	wctx, end := c.goroutineContext(ctx)
	go func() {
		defer end()
		if done != nil {
			defer done()
		}
		watchDataFunc(wctx, embeddedArmer{c.srv}, key, func(ev Event) bool { fn(ev); return wctx.Err() == nil }, c.log)
	}()
	return nil
}

// WatchChildren implements Watcher.
func (c *Embedded) WatchChildren(ctx context.Context, key string) (<-chan ChildrenEvent, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: watch children %s: %w", key, err)
	}
	if err := c.live(); err != nil {
		return nil, fmt.Errorf("coord: watch children %s: %w", key, err)
	}
	out := make(chan ChildrenEvent)
	wctx, done := c.goroutineContext(ctx)
	go func() {
		defer done()
		watchChildren(wctx, embeddedArmer{c.srv}, key, out, c.log)
	}()
	return out, nil
}

func (c *Embedded) goroutineContext(ctx context.Context) (context.Context, func()) {
	return c.gs.start(ctx, c.life)
}

type embeddedArmer struct{ s *Server }

func (a embeddedArmer) armData(_ context.Context, key string) (Entry, bool, waitFunc, error) {
	return a.s.armData(key)
}

func (a embeddedArmer) armChildren(_ context.Context, key string) (ChildrenEvent, waitFunc, error) {
	return a.s.armChildren(key)
}

type embeddedRaw struct{ c *Embedded }

func (r embeddedRaw) createEphemeral(ctx context.Context, key string, value []byte) error {
	return r.c.withSession(ctx, func(sid int64) error {
		_, err := r.c.srv.create(sid, key, value, Ephemeral)
		return err
	})
}

func (r embeddedRaw) get(_ context.Context, key string) (Entry, error) { return r.c.srv.get(key) }

func (r embeddedRaw) delete(ctx context.Context, key string, version int64) error {
	return r.c.withSession(ctx, func(sid int64) error { return r.c.srv.remove(sid, key, version) })
}

// registry holds the process-wide embedded servers named by mem://NAME and file:// URLs.
var registry = struct {
	sync.Mutex
	servers map[string]*sharedServer
}{servers: map[string]*sharedServer{}}

type sharedServer struct {
	srv  *Server
	refs int
}

// OpenEmbedded opens a client of the embedded server named by t (see Target).
func OpenEmbedded(t Target, opts Options) (*Embedded, error) {
	if t.Scheme != "mem" && t.Scheme != "file" {
		return nil, fmt.Errorf("coord: open embedded store: %w: scheme %q", ErrInvalid, t.Scheme)
	}
	if t.Scheme == "mem" && t.Name == "" {
		srv, err := NewServer(ServerOptions{Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		c, err := srv.Connect(opts)
		if err != nil {
			srv.Close()
			return nil, err
		}
		c.release = func() { srv.Close() }
		return c, nil
	}
	name := t.String()
	registry.Lock()
	defer registry.Unlock()
	sh := registry.servers[name]
	if sh == nil {
		srv, err := NewServer(ServerOptions{Path: t.Path, Logger: opts.Logger})
		if err != nil {
			return nil, err
		}
		sh = &sharedServer{srv: srv}
		registry.servers[name] = sh
	}
	c, err := sh.srv.Connect(opts)
	if err != nil {
		return nil, err
	}
	sh.refs++
	c.release = func() {
		registry.Lock()
		defer registry.Unlock()
		sh.refs--
		if sh.refs == 0 {
			delete(registry.servers, name)
			sh.srv.Close()
		}
	}
	return c, nil
}

// GrantedSessionTimeout is the session timeout the client asked for: the embedded server
// grants any (0 for sessions that never time out).
func (c *Embedded) GrantedSessionTimeout() time.Duration { return max(c.timeout, 0) }
