package coord

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/stormdock/stormdock/internal/ctxtime"
)

// ZK is a Store client backed by a ZooKeeper ensemble, confined to a chroot path.
type ZK struct {
	conn    *zk.Conn
	servers []string
	chroot  string
	acl     []zk.ACL
	opts    Options
	log     *slog.Logger

	life   context.Context // cancelled by Close; parent of every goroutine's context
	stop   context.CancelFunc
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup // the session loop
	gs     goroutines     // watches

	gate *readyGate
	hub  *sessionHub

	evMu   sync.Mutex
	evQ    []zk.Event
	evWake chan struct{}

	// granted is the session timeout the server granted, in milliseconds, read from its
	// answer to the last connect request (see grantConn); 0 until one came.
	granted atomic.Int64

	mu    sync.Mutex
	owned map[string][]byte // ephemeral keys this client created, with their last value
	sids  map[int64]bool    // every session id this client has had
	cur   net.Conn          // the connection zk dialled last (Redial closes it)
}

var _ Store = (*ZK)(nil)

// OpenZK connects to the ZooKeeper servers ("host:port") and confines the client to chroot
// ("" for none), creating the chroot path if missing. It returns once a session is
// established, or an error naming the servers after opts.ConnectTimeout.
func OpenZK(ctx context.Context, servers []string, chroot string, opts Options) (*ZK, error) {
	opts = opts.withDefaults()
	if len(servers) == 0 {
		return nil, fmt.Errorf("coord: open zookeeper: %w: no servers", ErrInvalid)
	}
	chroot = strings.TrimSuffix(chroot, "/")
	if chroot != "" {
		if err := ValidateKey(chroot); err != nil {
			return nil, fmt.Errorf("coord: open zookeeper: chroot: %w", err)
		}
	}
	s := &ZK{
		servers: slices.Clone(servers),
		chroot:  chroot,
		acl:     zk.WorldACL(zk.PermAll),
		opts:    opts,
		log:     opts.Logger.With("component", "coord", "store", "zk"),
		closed:  make(chan struct{}),
		hub:     newSessionHub(),
		evWake:  make(chan struct{}, 1),
		owned:   map[string][]byte{},
		sids:    map[int64]bool{},
	}
	s.life, s.stop = context.WithCancel(context.Background())
	s.gate = newReadyGate(s.closed)
	if opts.Credentials != "" {
		user, pass, ok := strings.Cut(opts.Credentials, ":")
		if !ok || user == "" {
			return nil, fmt.Errorf("coord: open zookeeper: %w: credentials must be user:pass", ErrInvalid)
		}
		s.acl = zk.DigestACL(zk.PermAll, user, pass)
	}
	dial := opts.Dialer
	if dial == nil {
		dial = net.DialTimeout
	}
	// A TLS handshake that fails for good (a certificate that does not verify) ends the
	// wait for the first session at once: retrying cannot mend it.
	tlsFatal := make(chan error, 1)
	if opts.tls != nil {
		dial = tlsDial(dial, opts.tls, tlsFatal)
	}
	handshake := max(opts.SessionTimeout/3, time.Second)
	dialer := func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, address, timeout)
		if err != nil {
			return nil, err
		}
		gc := &grantConn{Conn: deadlineCapConn{c, opts.SessionTimeout, handshake}, granted: &s.granted}
		s.mu.Lock()
		s.cur = gc
		s.mu.Unlock()
		return gc, nil
	}
	// zk's option type is unexported: the buffer options go in a call of their own.
	bufSize := zk.WithMaxBufferSize(0)
	sendBuf := func(*zk.Conn) {}
	if opts.BufferSize > 0 {
		bufSize, sendBuf = zk.WithMaxBufferSize(opts.BufferSize), zk.WithMaxConnBufferSize(opts.BufferSize)
	}
	conn, _, err := zk.Connect(servers, opts.SessionTimeout,
		zk.WithEventCallback(s.onEvent),
		zk.WithLogger(zkLogger{s.log}),
		zk.WithLogInfo(false),
		zk.WithDialer(dialer),
		bufSize, sendBuf)
	if err != nil {
		return nil, fmt.Errorf("coord: connect to zookeeper %s: %w", strings.Join(servers, ","), err)
	}
	// The event channel returned by Connect is never read: zk sends to it without
	// blocking, and every event also reaches onEvent.
	s.conn = conn
	s.wg.Add(1)
	go s.sessionLoop()

	cctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	wctx, wcancel := context.WithCancelCause(cctx)
	defer wcancel(nil)
	go func() {
		select {
		case err := <-tlsFatal:
			wcancel(err)
		case <-wctx.Done():
		}
	}()
	if err := s.gate.wait(wctx); err != nil {
		// zk.Conn.Close can take up to a second when no server answers: do not make the
		// caller wait for it. The goroutine ends with that Close.
		go s.Close()
		var te *tlsError
		if cause := context.Cause(wctx); errors.As(cause, &te) {
			return nil, fmt.Errorf("coord: connect to zookeeper %s: %w", strings.Join(servers, ","), te)
		}
		return nil, fmt.Errorf("coord: connect to zookeeper %s: no session within %s: %w (%v)",
			strings.Join(servers, ","), opts.ConnectTimeout, ErrUnavailable, err)
	}
	if opts.Credentials != "" {
		if _, err := call(cctx, s, func() (struct{}, error) {
			return struct{}{}, conn.AddAuth("digest", []byte(opts.Credentials))
		}); err != nil {
			s.Close()
			return nil, fmt.Errorf("coord: authenticate to zookeeper %s: %w", strings.Join(servers, ","), err)
		}
	}
	if err := s.ensureChroot(cctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *ZK) ensureChroot(ctx context.Context) error {
	if s.chroot == "" {
		return nil
	}
	for _, p := range append(ancestors(s.chroot), s.chroot) {
		_, err := call(ctx, s, func() (string, error) { return s.conn.Create(p, nil, 0, s.acl) })
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("coord: create chroot %s: %w", p, mapZKErr(err))
		}
	}
	return nil
}

// Close ends the session (its ephemeral entries are deleted at once) and stops every
// goroutine the client started.
func (s *ZK) Close() error {
	s.once.Do(func() {
		s.stop()
		close(s.closed)
		s.hub.close()
		s.conn.Close()
		s.gs.shutdown()
		s.wg.Wait()
	})
	return nil
}

// SessionID returns the current ZooKeeper session id.
func (s *ZK) SessionID() int64 { return s.conn.SessionID() }

// SessionEvents implements Session.
func (s *ZK) SessionEvents(ctx context.Context) <-chan SessionEvent { return s.hub.subscribe(ctx) }

// Chroot returns the path the client is confined to.
func (s *ZK) Chroot() string { return s.chroot }

func (s *ZK) path(key string) string {
	if s.chroot == "" {
		return key
	}
	if key == "/" {
		return s.chroot
	}
	return s.chroot + key
}

func (s *ZK) key(path string) string {
	if s.chroot == "" {
		return path
	}
	k := strings.TrimPrefix(path, s.chroot)
	if k == "" {
		return "/"
	}
	return k
}

// call waits for a session, then runs fn (a blocking zk request) until it returns, ctx is
// done or the client closes. zk requests take no context: on ctx done the request's
// goroutine finishes on its own when zk answers or drops the connection.
func call[T any](ctx context.Context, s *ZK, fn func() (T, error)) (T, error) {
	var zero T
	if err := s.gate.wait(ctx); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-s.closed:
		return zero, ErrClosed
	}
}

// read is call for idempotent requests: it retries after connection loss until ctx is done.
func read[T any](ctx context.Context, s *ZK, fn func() (T, error)) (T, error) {
	for {
		v, err := call(ctx, s, fn)
		err = mapZKErr(err)
		if err == nil || !isUnavailable(err) {
			return v, err
		}
		if err := ctxtime.Sleep(ctx, retryPause); err != nil {
			return v, err
		}
	}
}

func mapZKErr(err error) error {
	var sentinel error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, zk.ErrNoNode):
		sentinel = ErrNotFound
	case errors.Is(err, zk.ErrNodeExists):
		sentinel = ErrExists
	case errors.Is(err, zk.ErrBadVersion):
		sentinel = ErrConflict
	case errors.Is(err, zk.ErrNotEmpty):
		sentinel = ErrNotEmpty
	case errors.Is(err, zk.ErrNoAuth), errors.Is(err, zk.ErrAuthFailed), errors.Is(err, zk.ErrInvalidACL):
		sentinel = ErrPermission
	case errors.Is(err, zk.ErrNoChildrenForEphemerals), errors.Is(err, zk.ErrBadArguments), errors.Is(err, zk.ErrInvalidFlags):
		sentinel = ErrInvalid
	case errors.Is(err, zk.ErrClosing):
		sentinel = ErrClosed
	default: // connection closed, session expired or moved, no server, unknown
		sentinel = ErrUnavailable
	}
	return fmt.Errorf("%w: %w", sentinel, err)
}

func zkVersion(v int64) (int32, error) {
	if v < AnyVersion || v > math.MaxInt32 {
		return 0, fmt.Errorf("%w: version %d out of range", ErrInvalid, v)
	}
	return int32(v), nil
}

func entryFromStat(key string, data []byte, st *zk.Stat) Entry {
	e := Entry{Key: key, Value: data}
	if st != nil {
		e.Version = int64(st.Version)
		e.CreateRev = st.Czxid
		e.ModRev = st.Mzxid
		e.Owner = st.EphemeralOwner
	}
	return e
}

type getResult struct {
	data []byte
	st   *zk.Stat
}

// Get implements KV.
func (s *ZK) Get(ctx context.Context, key string) (Entry, error) {
	if err := ValidateKey(key); err != nil {
		return Entry{}, fmt.Errorf("coord: get %s: %w", key, err)
	}
	p := s.path(key)
	r, err := read(ctx, s, func() (getResult, error) {
		d, st, err := s.conn.Get(p)
		return getResult{d, st}, err
	})
	if err != nil {
		return Entry{}, fmt.Errorf("coord: get %s: %w", key, err)
	}
	return entryFromStat(key, r.data, r.st), nil
}

// Sync implements Syncer: a sync of the chroot (ZooKeeper syncs the whole tree whatever the
// path), retried after connection loss until ctx is done.
func (s *ZK) Sync(ctx context.Context) error {
	p := s.path("/")
	if _, err := read(ctx, s, func() (string, error) { return s.conn.Sync(p) }); err != nil {
		return fmt.Errorf("coord: sync: %w", err)
	}
	return nil
}

// Put implements KV.
func (s *ZK) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := validateWriteKey(key); err != nil {
		return 0, fmt.Errorf("coord: put %s: %w", key, err)
	}
	v, err := zkVersion(version)
	if err != nil {
		return 0, fmt.Errorf("coord: put %s: %w", key, err)
	}
	p := s.path(key)
	for {
		st, err := call(ctx, s, func() (*zk.Stat, error) { return s.conn.Set(p, value, v) })
		err = mapZKErr(err)
		if err == nil {
			s.noteWrite(key, value)
			return int64(st.Version), nil
		}
		if version != AnyVersion || !errors.Is(err, ErrNotFound) {
			return 0, fmt.Errorf("coord: put %s: %w", key, err)
		}
		_, err = s.create(ctx, key, value, Persistent)
		if err == nil {
			return 0, nil
		}
		if !errors.Is(err, ErrExists) {
			return 0, fmt.Errorf("coord: put %s: %w", key, err)
		}
		// Someone created it in between: set it.
	}
}

func (s *ZK) noteWrite(key string, value []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.owned[key]; ok {
		s.owned[key] = slices.Clone(value)
	}
}

// Create implements KV.
func (s *ZK) Create(ctx context.Context, key string, value []byte, mode Mode) (string, error) {
	if err := validateWriteKey(key); err != nil {
		return "", fmt.Errorf("coord: create %s: %w", key, err)
	}
	if !mode.valid() {
		return "", fmt.Errorf("coord: create %s: %w: unknown mode %d", key, ErrInvalid, mode)
	}
	k, err := s.create(ctx, key, value, mode)
	if err != nil {
		return "", fmt.Errorf("coord: create %s: %w", key, err)
	}
	if mode == Ephemeral {
		s.mu.Lock()
		s.owned[k] = slices.Clone(value)
		s.mu.Unlock()
	}
	return k, nil
}

func zkFlags(mode Mode) int32 {
	var f int32
	if mode.ephemeral() {
		f |= zk.FlagEphemeral
	}
	if mode.sequential() {
		f |= zk.FlagSequence
	}
	return f
}

// create makes key, and its missing parents if the first attempt says they are missing.
func (s *ZK) create(ctx context.Context, key string, value []byte, mode Mode) (string, error) {
	p := s.path(key)
	mk := func() (string, error) { return s.conn.Create(p, value, zkFlags(mode), s.acl) }
	created, err := call(ctx, s, mk)
	err = mapZKErr(err)
	if errors.Is(err, ErrNotFound) {
		if err := s.ensureParents(ctx, []string{key}, nil); err != nil {
			return "", err
		}
		created, err = call(ctx, s, mk)
		err = mapZKErr(err)
	}
	if err != nil {
		return "", err
	}
	return s.key(created), nil
}

// ensureParents creates the missing ancestors of keys, except those in skip.
func (s *ZK) ensureParents(ctx context.Context, keys []string, skip map[string]bool) error {
	seen := map[string]bool{}
	for _, k := range keys {
		for _, a := range ancestors(k) {
			if seen[a] || skip[a] {
				continue
			}
			seen[a] = true
			p := s.path(a)
			_, err := call(ctx, s, func() (string, error) { return s.conn.Create(p, nil, 0, s.acl) })
			if err = mapZKErr(err); err != nil && !errors.Is(err, ErrExists) {
				return fmt.Errorf("create parent %s: %w", a, err)
			}
		}
	}
	return nil
}

// Delete implements KV.
func (s *ZK) Delete(ctx context.Context, key string, version int64) error {
	if err := validateWriteKey(key); err != nil {
		return fmt.Errorf("coord: delete %s: %w", key, err)
	}
	v, err := zkVersion(version)
	if err != nil {
		return fmt.Errorf("coord: delete %s: %w", key, err)
	}
	if err := s.delete(ctx, key, v); err != nil {
		return fmt.Errorf("coord: delete %s: %w", key, err)
	}
	s.mu.Lock()
	delete(s.owned, key)
	s.mu.Unlock()
	return nil
}

func (s *ZK) delete(ctx context.Context, key string, version int32) error {
	p := s.path(key)
	_, err := call(ctx, s, func() (struct{}, error) { return struct{}{}, s.conn.Delete(p, version) })
	return mapZKErr(err)
}

// Children implements KV.
func (s *ZK) Children(ctx context.Context, key string) ([]string, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("coord: children %s: %w", key, err)
	}
	p := s.path(key)
	kids, err := read(ctx, s, func() ([]string, error) {
		k, _, err := s.conn.Children(p)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("coord: children %s: %w", key, err)
	}
	return s.cleanChildren(key, kids), nil
}

// cleanChildren sorts names and hides ZooKeeper's own /zookeeper node at an unchrooted root.
func (s *ZK) cleanChildren(key string, kids []string) []string {
	if key == "/" && s.chroot == "" {
		kids = slices.DeleteFunc(kids, func(n string) bool { return n == "zookeeper" })
	}
	slices.Sort(kids)
	if kids == nil {
		kids = []string{}
	}
	return kids
}

// Txn implements KV with one ZooKeeper multi request.
func (s *ZK) Txn(ctx context.Context, ops ...Op) ([]OpResult, error) {
	if err := validateOps(ops); err != nil {
		return nil, err
	}
	var creates []string
	inTxn := map[string]bool{}
	reqs := make([]any, len(ops))
	for i, op := range ops {
		v, err := zkVersion(op.Version)
		if err != nil {
			return nil, &TxnError{Index: i, Op: op, Err: err}
		}
		p := s.path(op.Key)
		switch op.Kind {
		case OpCreate:
			creates = append(creates, op.Key)
			inTxn[op.Key] = true
			reqs[i] = &zk.CreateRequest{Path: p, Data: op.Value, Acl: s.acl, Flags: zkFlags(op.Mode)}
		case OpPut:
			reqs[i] = &zk.SetDataRequest{Path: p, Data: op.Value, Version: v}
		case OpDelete:
			reqs[i] = &zk.DeleteRequest{Path: p, Version: v}
		case OpCheck:
			reqs[i] = &zk.CheckVersionRequest{Path: p, Version: v}
		}
	}
	multi := func() ([]zk.MultiResponse, error) {
		resps, err := call(ctx, s, func() ([]zk.MultiResponse, error) { return s.conn.Multi(reqs...) })
		if err != nil {
			for i, r := range resps {
				// ZooKeeper reports ops before the failing one as OK and ops after it as
				// rolled back (-2): the first error is the cause.
				if r.Error != nil {
					return nil, &TxnError{Index: i, Op: ops[i], Err: mapZKErr(r.Error)}
				}
			}
			return nil, fmt.Errorf("coord: txn: %w", mapZKErr(err))
		}
		return resps, nil
	}
	// Parents are made only when a create finds one missing, as create does: making them
	// first would cost a (failing) write per parent on every transaction that creates.
	resps, err := multi()
	var te *TxnError
	if err != nil && errors.As(err, &te) && te.Op.Kind == OpCreate && errors.Is(err, ErrNotFound) {
		if err := s.ensureParents(ctx, creates, inTxn); err != nil {
			return nil, fmt.Errorf("coord: txn: %w", err)
		}
		resps, err = multi()
	}
	if err != nil {
		return nil, err
	}
	out := make([]OpResult, len(ops))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, op := range ops {
		out[i].Key = op.Key
		switch op.Kind {
		case OpCreate:
			if i < len(resps) && resps[i].String != "" {
				out[i].Key = s.key(resps[i].String)
			}
			if op.Mode == Ephemeral {
				s.owned[out[i].Key] = slices.Clone(op.Value)
			}
		case OpPut:
			if i < len(resps) && resps[i].Stat != nil {
				out[i].Version = int64(resps[i].Stat.Version)
			}
			if _, ok := s.owned[op.Key]; ok {
				s.owned[op.Key] = slices.Clone(op.Value)
			}
		case OpDelete:
			delete(s.owned, op.Key)
		}
	}
	return out, nil
}

func validateWriteKey(key string) error {
	if key == "/" {
		return fmt.Errorf("%w: the root key cannot be changed", ErrInvalid)
	}
	return ValidateKey(key)
}

// zkLogger routes the zk library's logs to slog at debug level.
type zkLogger struct{ l *slog.Logger }

func (z zkLogger) Printf(format string, args ...any) {
	z.l.Debug("zk: " + fmt.Sprintf(format, args...))
}

// deadlineCapConn shortens zk's connect handshake. zk gives a server ten times 2/3 of the
// session timeout to answer its connect request; a server that accepts connections while
// still starting up can hold a reconnecting client that long, and the session expires
// meanwhile. Deadlines farther away than the session timeout (only the handshake's are) are
// cut to handshake; zk's per-request deadlines are shorter and pass unchanged.
type deadlineCapConn struct {
	net.Conn
	session   time.Duration
	handshake time.Duration
}

func (c deadlineCapConn) capped(t time.Time) time.Time {
	now := time.Now()
	if !t.IsZero() && t.After(now.Add(c.session)) {
		return now.Add(c.handshake)
	}
	return t
}

func (c deadlineCapConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.capped(t)) }
func (c deadlineCapConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.capped(t))
}
func (c deadlineCapConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.capped(t))
}

// Redial drops the connection to the server the client talks to now: zk connects to the next
// server of its list, within the session, as it does by itself once a server has not
// answered for two thirds of the session timeout. For a client whose server answers but
// passes nothing on to the leader (a follower cut off from it: its requests stall while it
// goes on answering pings for a while), to move before its session runs low. A client that
// is not connected now (it is already moving) is left alone.
func (s *ZK) Redial() { s.redial("", "") }

// redial is Redial saying why; a server apart from its ensemble is warned about.
func (s *ZK) redial(why, key string) {
	if !s.gate.isReady() {
		return
	}
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	if c == nil {
		return
	}
	if why != "" {
		s.log.Warn("coord: dropping the connection to try another server", "server", c.RemoteAddr(), "why", why, "key", key)
	} else {
		s.log.Info("coord: dropping the connection to try another server", "server", c.RemoteAddr())
	}
	_ = c.Close()
}

// GrantedSessionTimeout is the session timeout the server granted to the current session:
// ZooKeeper caps a request within its minSessionTimeout..maxSessionTimeout (2 to 20 ticks
// by default), so it may be shorter than Options.SessionTimeout. 0 before the first session.
func (s *ZK) GrantedSessionTimeout() time.Duration {
	return time.Duration(s.granted.Load()) * time.Millisecond
}

// grantConn reads the session timeout the server granted from the first frame it sends on
// a connection: the answer to zk's connect request (length, protocolVersion int32, timeOut
// int32, sessionId int64, passwd; big-endian). go-zookeeper v1.0.4 keeps that value in an
// unexported field and reports it in no event, so the client is wrapped rather than
// changed. An answer with session id 0 (an expired session) is not a grant.
type grantConn struct {
	net.Conn
	granted *atomic.Int64
	head    []byte // the first bytes read, until 20 are in
	done    bool
}

func (c *grantConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.head = append(c.head, p[:min(n, 20-len(c.head))]...)
		if len(c.head) == 20 {
			c.done = true
			timeout := int32(binary.BigEndian.Uint32(c.head[8:12]))
			if sid := int64(binary.BigEndian.Uint64(c.head[12:20])); sid != 0 && timeout > 0 {
				c.granted.Store(int64(timeout))
			}
			c.head = nil
		}
	}
	return n, err
}
