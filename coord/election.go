package coord

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormdock/stormdock/internal/ctxtime"
)

// ErrNoLeader is returned by Leader when nobody holds the election.
var ErrNoLeader = errors.New("coord: no leader")

// Election is a leader election among clients under one key prefix, with the ZooKeeper
// recipe: each candidate creates an ephemeral sequential entry "<prefix>/<nonce>-n_<seq>"
// holding its id; the lowest sequence leads; every other candidate watches only its
// predecessor, so a leader's loss wakes exactly one follower.
type Election struct {
	s      Store
	prefix string
	id     string
}

// NewElection returns an election under prefix in which this client stands as id.
func NewElection(s Store, prefix, id string) (*Election, error) {
	if err := validateWriteKey(prefix); err != nil {
		return nil, fmt.Errorf("coord: election %s: %w", prefix, err)
	}
	return &Election{s: s, prefix: prefix, id: id}, nil
}

// Leadership is held by the winner of Campaign until Done closes.
type Leadership struct {
	e      *Election
	key    string
	fence  Fence
	done   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Done closes when leadership is lost: the session expired, the connection dropped (the
// session may expire unseen, so leadership is given up at once, like Curator), the candidate
// entry was deleted, Resign was called, or the store closed. After a loss the candidate
// entry is removed as soon as the store can reach the server; campaign again to lead again.
func (l *Leadership) Done() <-chan struct{} { return l.done }

// Key returns the leader's candidate entry.
func (l *Leadership) Key() string { return l.key }

// Fence is this term's claim to lead, for the leader's writes (see Fenced): its candidate
// entry at the version it won with. The entry goes with the session or the resignation,
// so a write that carries the fence succeeds only while this term lasts in the store's
// own order, whatever this client has noticed of it yet.
func (l *Leadership) Fence() Fence { return l.fence }

// Resign gives up leadership and removes the candidate entry, letting the next candidate
// lead.
func (l *Leadership) Resign(ctx context.Context) error {
	l.cancel()
	l.wg.Wait()
	err := l.e.s.Delete(ctx, l.key, AnyVersion)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("coord: resign %s: %w", l.e.prefix, err)
	}
	return nil
}

func newNonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// candidate is one entry of the election, ordered by its sequence suffix.
type candidate struct {
	name string
	seq  int64
}

func (e *Election) candidates(ctx context.Context) ([]candidate, error) {
	names, err := e.s.Children(ctx, e.prefix)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, n := range names {
		i := strings.LastIndex(n, "-n_")
		if i < 0 {
			continue
		}
		seq, err := strconv.ParseInt(n[i+3:], 10, 64)
		if err != nil {
			continue
		}
		out = append(out, candidate{n, seq})
	}
	slices.SortFunc(out, func(a, b candidate) int {
		if a.seq != b.seq {
			if a.seq < b.seq {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

// Leader returns the current leader's id, or ErrNoLeader.
func (e *Election) Leader(ctx context.Context) (string, error) {
	for {
		cs, err := e.candidates(ctx)
		if err != nil {
			return "", fmt.Errorf("coord: leader of %s: %w", e.prefix, err)
		}
		if len(cs) == 0 {
			return "", fmt.Errorf("coord: leader of %s: %w", e.prefix, ErrNoLeader)
		}
		ent, err := e.s.Get(ctx, joinKey(e.prefix, cs[0].name))
		if errors.Is(err, ErrNotFound) {
			continue // the leader just left: look again
		}
		if err != nil {
			return "", fmt.Errorf("coord: leader of %s: %w", e.prefix, err)
		}
		return string(ent.Value), nil
	}
}

// Campaign stands for election and blocks until this client leads or ctx is done (then the
// candidate entry is removed and ctx's error returned).
func (e *Election) Campaign(ctx context.Context) (*Leadership, error) {
	subCtx, subCancel := context.WithCancel(context.Background())
	sess := e.s.SessionEvents(subCtx)
	nonce := newNonce()
	var me string // candidate key, "" while we have none
	fail := func(err error) (*Leadership, error) {
		subCancel()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if me != "" {
			_ = e.s.Delete(dctx, me, AnyVersion)
		} else {
			// A Create abandoned when ctx ended may still have succeeded: look for our entry
			// (twice, in case the request was still on its way) and remove it.
			for range 2 {
				if k, ferr := e.find(dctx, nonce); ferr == nil && k != "" {
					_ = e.s.Delete(dctx, k, AnyVersion)
				}
				_ = ctxtime.Sleep(dctx, retryPause)
			}
		}
		return nil, fmt.Errorf("coord: campaign %s: %w", e.prefix, err)
	}
	for {
		if me == "" {
			k, err := e.s.Create(ctx, joinKey(e.prefix, nonce+"-n_"), []byte(e.id), EphemeralSequential)
			switch {
			case err == nil:
				me = k
			case isUnavailable(err):
				// The entry may have been created before the connection dropped: adopt it.
				if me, err = e.find(ctx, nonce); err != nil {
					return fail(err)
				}
				if me == "" {
					if err := ctxtime.Sleep(ctx, retryPause); err != nil {
						return fail(err)
					}
				}
				continue
			default:
				return fail(err)
			}
		}
		cs, err := e.candidates(ctx)
		if err != nil {
			if isUnavailable(err) {
				continue
			}
			return fail(err)
		}
		idx := slices.IndexFunc(cs, func(c candidate) bool { return c.name == baseName(me) })
		if idx < 0 { // our entry went with an expired session
			me = ""
			continue
		}
		if idx == 0 {
			ent, err := e.s.Get(ctx, me)
			if errors.Is(err, ErrNotFound) {
				me = ""
				continue
			}
			if err != nil {
				return fail(err)
			}
			if ent.Owner != e.s.SessionID() { // held by an expired session of ours
				me = ""
				continue
			}
			return e.lead(me, ent, sess, subCancel), nil
		}
		pred := joinKey(e.prefix, cs[idx-1].name)
		owner, err := e.ownerOf(ctx, me)
		if err != nil {
			if isUnavailable(err) {
				continue
			}
			return fail(err)
		}
		if owner != e.s.SessionID() {
			me = "" // ours went with an expired session
			continue
		}
		// A candidate ahead of ours held by our own session and standing for our own id is
		// one of an earlier term of ours that could not be given up (a resign that could not
		// reach the server). Another candidate may be waiting behind it, so every one is
		// checked, not only our predecessor: left alone it would lead nobody and block
		// everyone. (Another candidate of the same client stands for another id.)
		stale := false
		for _, c := range cs[:idx] {
			k := joinKey(e.prefix, c.name)
			if ent, err := e.s.Get(ctx, k); err == nil && ent.Owner == owner && string(ent.Value) == e.id {
				err := e.s.Delete(ctx, k, AnyVersion)
				if errors.Is(err, ErrNotFound) {
					// Read a moment ago, gone for the leader of the ensemble: unless it is
					// gone for the server read from too, that server came apart.
					e.apart(ctx, k)
				} else if err != nil && !isUnavailable(err) {
					return fail(err)
				}
				stale = true
			}
		}
		if stale {
			continue
		}
		if err := e.waitGone(ctx, pred, sess, &me, owner); err != nil {
			return fail(err)
		}
	}
}

// find looks for a candidate entry of ours (by nonce) owned by the current session.
func (e *Election) find(ctx context.Context, nonce string) (string, error) {
	cs, err := e.candidates(ctx)
	if err != nil {
		return "", err
	}
	for _, c := range cs {
		if strings.HasPrefix(c.name, nonce+"-") {
			k := joinKey(e.prefix, c.name)
			ent, err := e.s.Get(ctx, k)
			if err == nil && ent.Owner == e.s.SessionID() {
				return k, nil
			}
		}
	}
	return "", nil
}

// ownerOf returns the session owning the candidate entry key, 0 when it is gone.
func (e *Election) ownerOf(ctx context.Context, key string) (int64, error) {
	ent, err := e.s.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return ent.Owner, nil
}

// waitGone waits until key is deleted, the session owning our entry expires (then *me is
// cleared) or ctx is done. Events about other, older sessions are stale: the session
// events channel holds everything since the campaign began.
func (e *Election) waitGone(ctx context.Context, key string, sess <-chan SessionEvent, me *string, owner int64) error {
	wctx, cancel := context.WithCancel(ctx)
	ck := newChecker(wctx, e, key)
	defer func() {
		cancel()
		ck.wait()
	}()
	ch, err := e.s.Watch(wctx, key)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ck.tick.C:
			ck.start()
		case <-ck.gone:
			return nil
		case ev, ok := <-ch:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return ErrClosed
			}
			if !ev.Exists {
				return nil
			}
		case se, ok := <-sess:
			if !ok {
				return ErrClosed
			}
			if se.Type == SessionExpired && se.SessionID == owner {
				*me = ""
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lead starts the goroutine that watches for the loss of leadership.
func (e *Election) lead(me string, ent Entry, sess <-chan SessionEvent, subCancel context.CancelFunc) *Leadership {
	mctx, cancel := context.WithCancel(context.Background())
	l := &Leadership{e: e, key: me, fence: Fence{Key: me, Version: ent.Version}, done: make(chan struct{}), cancel: cancel}
	ch, err := e.s.Watch(mctx, me)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer subCancel()
		defer l.once.Do(func() { close(l.done) })
		if err != nil {
			return
		}
		// A leader that reads its entry from a server apart from the ensemble would lead on
		// for as long as that server stays apart, every write fenced, and no watch to end
		// the term.
		cctx, stopCheck := context.WithCancel(mctx)
		ck := newChecker(cctx, e, me)
		defer func() {
			stopCheck()
			ck.wait()
		}()
		for {
			select {
			case <-ck.tick.C:
				ck.start()
			case <-ck.gone:
				return
			case ev, ok := <-ch:
				if !ok || !ev.Exists || ev.Entry.CreateRev != ent.CreateRev {
					return
				}
			case se, ok := <-sess:
				if !ok {
					return
				}
				if se.SessionID != ent.Owner {
					continue // about an older session, queued before this term began
				}
				switch se.Type {
				case SessionExpired:
					return
				case SessionDisconnected:
					l.once.Do(func() { close(l.done) })
					// Remove the entry once the server is reachable again, unless the
					// owner resigns or the store closes first.
					_ = e.s.Delete(mctx, me, AnyVersion)
					return
				}
			case <-mctx.Done():
				return
			}
		}
	}()
	return l
}

// confirmEvery is how often a candidate checks, in the store's order of writes, that the
// entry it waits behind (or, leading, its own) is there as the server it reads from shows it.
// A ZooKeeper server answers reads from its own copy, and the chaos run saw one come apart
// from its ensemble (ZooKeeper 3.8.0, after a leader's partition): for minutes it showed an
// election entry the ensemble's leader had deleted, while forwarding writes that the leader
// refused. The watches on the entry never fired: one master waited behind it for good and
// the other led on it, its every write fenced.
const confirmEvery = 2 * time.Second

// checker runs gone on a key every confirmEvery, one check at a time, in a goroutine of
// its own: the loop that asks goes on hearing its watch and session events while a check
// waits for the store (a disconnected client's requests wait for the next connection, and a
// leader must give up its term at once on a disconnect). gone receives once the key is gone.
type checker struct {
	e    *Election
	ctx  context.Context
	key  string
	tick *time.Ticker
	gone chan struct{}
	busy atomic.Bool
	wg   sync.WaitGroup
}

func newChecker(ctx context.Context, e *Election, key string) *checker {
	return &checker{e: e, ctx: ctx, key: key, tick: time.NewTicker(confirmEvery), gone: make(chan struct{}, 1)}
}

// start begins a check unless one is under way.
func (c *checker) start() {
	if !c.busy.CompareAndSwap(false, true) {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.busy.Store(false)
		if gone, _ := c.e.gone(c.ctx, c.key); gone {
			select {
			case c.gone <- struct{}{}:
			default:
			}
		}
	}()
}

// wait stops the ticker and waits for a check under way; its context must be done.
func (c *checker) wait() {
	c.tick.Stop()
	c.wg.Wait()
}

// gone reports whether key no longer exists in the order of writes: a check in a
// transaction is decided by the ensemble's leader. A key gone there but still read from the
// server this client talks to, after that answer (a server answers one client's requests in
// order), shows the server apart from the ensemble: the client moves to another (Redial).
// Unknown (the store unavailable): false, with the error.
func (e *Election) gone(ctx context.Context, key string) (bool, error) {
	_, err := e.s.Txn(ctx, CheckOp(key, AnyVersion))
	switch {
	case err == nil:
		return false, nil
	case !errors.Is(err, ErrNotFound):
		return false, err
	}
	e.apart(ctx, key)
	return true, nil
}

// apart moves the client to another server when the one it reads from still shows key,
// which the ensemble's leader has just said is gone.
func (e *Election) apart(ctx context.Context, key string) {
	if _, err := e.s.Get(ctx, key); err != nil {
		return
	}
	redialApart(e.s, key)
}
