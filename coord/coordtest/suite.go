// Package coordtest is the conformance suite every coord.Store implementation must pass,
// run by each implementation's tests against a real backend (containerd's ContentSuite model).
package coordtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stormdock/stormdock/coord"
	"github.com/stormdock/stormdock/internal/testenv"
)

// Backend gives the suite clients of one fresh, isolated namespace of a store.
type Backend interface {
	// Client opens a new client with its own session; the backend closes it at test end.
	Client(t *testing.T) coord.Store
	// Expire makes the server expire c's session (c from Client) and returns once c has a
	// new session.
	Expire(t *testing.T, c coord.Store)
	// StartLeader starts a separate candidate that campaigns at prefix as id and returns
	// once it leads. kill ends it abruptly (for ZooKeeper: SIGKILL of a child process), so
	// that its session is lost only when its timeout runs out.
	StartLeader(t *testing.T, prefix, id string) (kill func())
	// SessionTimeout is the clients' session timeout.
	SessionTimeout() time.Duration
	// ExpiryGrace is how long past SessionTimeout the server may take to notice a dead
	// session (ZooKeeper checks in tickTime buckets).
	ExpiryGrace() time.Duration
}

// suite lists the conformance tests. session marks those about sessions (ephemeral entries,
// expiry, election across session loss): the ones worth running again against a store whose
// sessions live on several servers (RunSessionSuite).
var suite = []struct {
	name    string
	session bool
	fn      func(t *testing.T, b Backend)
}{
	{"GetPutCreateDelete", false, testCRUD},
	{"InvalidKeys", false, testInvalidKeys},
	{"CompareAndSet", false, testCAS},
	{"ConcurrentCAS", false, testConcurrentCAS},
	{"Sequential", false, testSequential},
	{"Txn", false, testTxn},
	{"WatchOrder", false, testWatchOrder},
	{"WatchChildren", false, testWatchChildren},
	{"WatchStopsOnCancelAndClose", false, testWatchStops},
	{"WatchFuncOrder", false, testWatchFuncOrder},
	{"WatchFuncStopsOnCancelAndClose", false, testWatchFuncStops},
	{"WatchFuncKeepsNoValue", false, testWatchFuncKeepsNoValue},
	{"WatchFuncAcrossOwnExpiry", true, testWatchFuncExpiry},
	{"EphemeralGoneOnClose", true, testEphemeralClose},
	{"SessionExpiry", true, testSessionExpiry},
	{"Election", true, testElection},
	{"ElectionLostOnExpiry", true, testElectionExpiry},
	{"FencedWritesOfDeposedLeader", true, testFencedWrites},
	{"LeaderKilled", true, testLeaderKilled},
	{"SyncThenRead", false, testSync},
	{"ClosedStore", false, testClosed},
}

// RunSuite runs the conformance suite; newBackend is called once per subtest.
func RunSuite(t *testing.T, newBackend func(t *testing.T) Backend) {
	run(t, newBackend, false)
}

// RunSessionSuite runs the suite's session tests only: ephemeral entries removed on close,
// session expiry and restoration, elections and their loss to expiry or to a killed leader.
func RunSessionSuite(t *testing.T, newBackend func(t *testing.T) Backend) {
	run(t, newBackend, true)
}

func run(t *testing.T, newBackend func(t *testing.T) Backend, sessionOnly bool) {
	for _, tc := range suite {
		if sessionOnly && !tc.session {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newBackend(t))
		})
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustIs(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func testCRUD(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	_, err := s.Get(ctx, "/a")
	mustIs(t, err, coord.ErrNotFound, "get missing")

	k, err := s.Create(ctx, "/a/b/c", []byte("v0"), coord.Persistent)
	must(t, err, "create with missing parents")
	if k != "/a/b/c" {
		t.Fatalf("create returned %q", k)
	}
	e, err := s.Get(ctx, "/a/b/c")
	must(t, err, "get")
	if string(e.Value) != "v0" || e.Version != 0 || e.Owner != 0 || e.Key != "/a/b/c" {
		t.Fatalf("get after create = %+v", e)
	}
	_, err = s.Create(ctx, "/a/b/c", nil, coord.Persistent)
	mustIs(t, err, coord.ErrExists, "create existing")

	v, err := s.Put(ctx, "/a/b/c", []byte("v1"), coord.AnyVersion)
	must(t, err, "put")
	if v != 1 {
		t.Fatalf("put version = %d, want 1", v)
	}
	e2, _ := s.Get(ctx, "/a/b/c")
	if string(e2.Value) != "v1" || e2.Version != 1 || e2.CreateRev != e.CreateRev || e2.ModRev <= e.ModRev {
		t.Fatalf("get after put = %+v (before %+v)", e2, e)
	}

	v, err = s.Put(ctx, "/x/y", []byte("up"), coord.AnyVersion)
	must(t, err, "put creates missing key and parents")
	if v != 0 {
		t.Fatalf("put-create version = %d, want 0", v)
	}

	kids, err := s.Children(ctx, "/")
	must(t, err, "children of root")
	if !slices.Equal(kids, []string{"a", "x"}) {
		t.Fatalf("children of / = %v", kids)
	}
	for _, n := range []string{"z", "m", "c2"} {
		_, err := s.Create(ctx, "/a/b/"+n, nil, coord.Persistent)
		must(t, err, "create child")
	}
	kids, _ = s.Children(ctx, "/a/b")
	if !slices.Equal(kids, []string{"c", "c2", "m", "z"}) {
		t.Fatalf("children not sorted: %v", kids)
	}
	_, err = s.Children(ctx, "/nope")
	mustIs(t, err, coord.ErrNotFound, "children of missing key")
	kids, err = s.Children(ctx, "/a/b/c")
	if err != nil || len(kids) != 0 {
		t.Fatalf("children of leaf = %v, %v", kids, err)
	}

	mustIs(t, s.Delete(ctx, "/a/b", coord.AnyVersion), coord.ErrNotEmpty, "delete non-empty")
	mustIs(t, s.Delete(ctx, "/nope", coord.AnyVersion), coord.ErrNotFound, "delete missing")
	must(t, s.Delete(ctx, "/a/b/c", coord.AnyVersion), "delete")
	_, err = s.Get(ctx, "/a/b/c")
	mustIs(t, err, coord.ErrNotFound, "get deleted")

	// Ephemeral entries cannot have children.
	_, err = s.Create(ctx, "/eph", nil, coord.Ephemeral)
	must(t, err, "create ephemeral")
	e, _ = s.Get(ctx, "/eph")
	if e.Owner != s.SessionID() || !e.Ephemeral() {
		t.Fatalf("ephemeral owner = %d, session %d", e.Owner, s.SessionID())
	}
	_, err = s.Create(ctx, "/eph/child", nil, coord.Persistent)
	mustIs(t, err, coord.ErrInvalid, "child of ephemeral")

	must(t, coord.DeleteTree(ctx, s, "/a"), "delete tree")
	_, err = s.Get(ctx, "/a")
	mustIs(t, err, coord.ErrNotFound, "get after delete tree")
}

func testInvalidKeys(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	for _, key := range []string{"", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/a\x00b"} {
		t.Run(strconv.Quote(key), func(t *testing.T) {
			_, err := s.Get(ctx, key)
			mustIs(t, err, coord.ErrInvalid, "get")
			_, err = s.Put(ctx, key, nil, coord.AnyVersion)
			mustIs(t, err, coord.ErrInvalid, "put")
			_, err = s.Create(ctx, key, nil, coord.Persistent)
			mustIs(t, err, coord.ErrInvalid, "create")
			mustIs(t, s.Delete(ctx, key, coord.AnyVersion), coord.ErrInvalid, "delete")
			_, err = s.Watch(ctx, key)
			mustIs(t, err, coord.ErrInvalid, "watch")
		})
	}
	_, err := s.Create(ctx, "/", nil, coord.Persistent)
	mustIs(t, err, coord.ErrInvalid, "create root")
	mustIs(t, s.Delete(ctx, "/", coord.AnyVersion), coord.ErrInvalid, "delete root")
}

func testCAS(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	_, err := s.Create(ctx, "/cas", []byte("0"), coord.Persistent)
	must(t, err, "create")
	_, err = s.Put(ctx, "/cas", []byte("1"), 0)
	must(t, err, "put at current version")

	cases := []struct {
		name    string
		do      func() error
		want    error
		wantVer int64 // version of /cas afterwards
	}{
		{"put stale version", func() error { _, err := s.Put(ctx, "/cas", []byte("x"), 0); return err }, coord.ErrConflict, 1},
		{"put future version", func() error { _, err := s.Put(ctx, "/cas", []byte("x"), 7); return err }, coord.ErrConflict, 1},
		{"delete stale version", func() error { return s.Delete(ctx, "/cas", 0) }, coord.ErrConflict, 1},
		{"put version on missing key", func() error { _, err := s.Put(ctx, "/missing", []byte("x"), 0); return err }, coord.ErrNotFound, 1},
		{"put current version", func() error { _, err := s.Put(ctx, "/cas", []byte("2"), 1); return err }, nil, 2},
		{"bad version", func() error { _, err := s.Put(ctx, "/cas", []byte("x"), -5); return err }, coord.ErrInvalid, 2},
	}
	for _, tc := range cases {
		err := tc.do()
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
		e, err := s.Get(ctx, "/cas")
		must(t, err, "get")
		if e.Version != tc.wantVer {
			t.Errorf("%s: version %d, want %d", tc.name, e.Version, tc.wantVer)
		}
	}
	e, _ := s.Get(ctx, "/cas")
	if string(e.Value) != "2" {
		t.Fatalf("value after failed CAS writes = %q", e.Value)
	}
	must(t, s.Delete(ctx, "/cas", 2), "delete at current version")
}

// testConcurrentCAS: clients increment one counter with read-modify-CAS loops; no update
// may be lost.
func testConcurrentCAS(t *testing.T, b Backend) {
	ctx := testCtx(t)
	const clients, incs = 4, 15
	stores := make([]coord.Store, clients)
	for i := range stores {
		stores[i] = b.Client(t)
	}
	_, err := stores[0].Create(ctx, "/counter", []byte("0"), coord.Persistent)
	must(t, err, "create")
	var wg sync.WaitGroup
	var conflicts sync.Map
	errs := make(chan error, clients)
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for done := 0; done < incs; {
				e, err := s.Get(ctx, "/counter")
				if err != nil {
					errs <- err
					return
				}
				c, _ := strconv.Atoi(string(e.Value))
				_, err = s.Put(ctx, "/counter", []byte(strconv.Itoa(c+1)), e.Version)
				switch {
				case err == nil:
					done++
				case errors.Is(err, coord.ErrConflict):
					n++
				default:
					errs <- err
					return
				}
			}
			conflicts.Store(i, n)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e, err := stores[0].Get(ctx, "/counter")
	must(t, err, "get")
	if string(e.Value) != strconv.Itoa(clients*incs) || e.Version != clients*incs {
		t.Fatalf("counter = %s at version %d, want %d", e.Value, e.Version, clients*incs)
	}
}

func testSequential(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	var keys []string
	for i := 0; i < 3; i++ {
		k, err := s.Create(ctx, "/q/item-", []byte(strconv.Itoa(i)), coord.PersistentSequential)
		must(t, err, "create sequential")
		keys = append(keys, k)
	}
	k, err := s.Create(ctx, "/q/eph-", nil, coord.EphemeralSequential)
	must(t, err, "create ephemeral sequential")
	keys = append(keys, k)
	want := []string{"/q/item-0000000000", "/q/item-0000000001", "/q/item-0000000002", "/q/eph-0000000003"}
	if !slices.Equal(keys, want) {
		t.Fatalf("sequential keys = %v, want %v", keys, want)
	}
	e, _ := s.Get(ctx, keys[3])
	if e.Owner != s.SessionID() {
		t.Fatalf("ephemeral sequential owner %d, session %d", e.Owner, s.SessionID())
	}
}

func testTxn(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	_, err := s.Create(ctx, "/jobs/wc/status", []byte("pending"), coord.Persistent)
	must(t, err, "create")

	res, err := s.Txn(ctx,
		coord.CheckOp("/jobs/wc/status", 0),
		coord.CreateOp("/jobs/wc/assign/w-", []byte("node1"), coord.PersistentSequential),
		coord.PutOp("/jobs/wc/status", []byte("assigned"), 0),
	)
	must(t, err, "txn")
	if len(res) != 3 || res[1].Key != "/jobs/wc/assign/w-0000000000" || res[2].Version != 1 {
		t.Fatalf("txn results = %+v", res)
	}
	e, _ := s.Get(ctx, "/jobs/wc/status")
	if string(e.Value) != "assigned" || e.Version != 1 {
		t.Fatalf("status after txn = %+v", e)
	}

	// A failing op leaves everything unchanged and says which op failed.
	_, err = s.Txn(ctx,
		coord.CreateOp("/jobs/wc/extra", []byte("x"), coord.Persistent),
		coord.PutOp("/jobs/wc/status", []byte("stale"), 0),
		coord.DeleteOp("/jobs/wc/assign/w-0000000000", coord.AnyVersion),
	)
	mustIs(t, err, coord.ErrConflict, "txn with stale version")
	var te *coord.TxnError
	if !errors.As(err, &te) || te.Index != 1 {
		t.Fatalf("txn error = %#v, want TxnError at index 1", err)
	}
	_, err = s.Get(ctx, "/jobs/wc/extra")
	mustIs(t, err, coord.ErrNotFound, "create of failed txn must not apply")
	_, err = s.Get(ctx, "/jobs/wc/assign/w-0000000000")
	must(t, err, "delete of failed txn must not apply")
	e, _ = s.Get(ctx, "/jobs/wc/status")
	if string(e.Value) != "assigned" {
		t.Fatalf("status changed by failed txn: %q", e.Value)
	}

	_, err = s.Txn(ctx, coord.CheckOp("/jobs/none", coord.AnyVersion))
	mustIs(t, err, coord.ErrNotFound, "check missing")
	_, err = s.Txn(ctx, coord.PutOp("/jobs/none", nil, coord.AnyVersion))
	mustIs(t, err, coord.ErrNotFound, "txn put does not create")
	_, err = s.Txn(ctx)
	mustIs(t, err, coord.ErrInvalid, "empty txn")

	// Create and delete in one transaction, ephemeral included.
	_, err = s.Txn(ctx,
		coord.CreateOp("/nodes/n1", []byte("up"), coord.Ephemeral),
		coord.DeleteOp("/jobs/wc/assign/w-0000000000", 0),
	)
	must(t, err, "txn create+delete")
	e, err = s.Get(ctx, "/nodes/n1")
	must(t, err, "get txn ephemeral")
	if e.Owner != s.SessionID() {
		t.Fatalf("txn ephemeral owner %d, session %d", e.Owner, s.SessionID())
	}
}

// next receives from ch within d.
func next[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	d = testenv.Timeout(d)
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
	}
	var zero T
	return zero
}

// waitCandidates waits until the election under prefix has n candidates: a campaign stands
// once its entry is there.
func waitCandidates(t *testing.T, s coord.Store, prefix string, n int) {
	t.Helper()
	ctx := testCtx(t)
	testenv.Eventually(t, fmt.Sprintf("%d candidates under %s", n, prefix), 10*time.Second, func() bool {
		names, err := s.Children(ctx, prefix)
		return err == nil && len(names) == n
	})
}

// watchFunc is a key's watch through coord.FuncWatcher, as a channel for the tests written
// for Watch: fn's states in order (fn never waits: the buffer is the test's bound), closed
// by done. It fails the test if fn is called after done, or done twice.
func watchFunc(t *testing.T, ctx context.Context, c coord.Store, key string) <-chan coord.Event {
	t.Helper()
	fw, ok := c.(coord.FuncWatcher)
	if !ok {
		t.Fatalf("%T is no coord.FuncWatcher", c)
	}
	ch := make(chan coord.Event, 4096)
	var mu sync.Mutex
	var ended, inFn bool
	err := fw.WatchFunc(ctx, key, func(ev coord.Event) {
		mu.Lock()
		if ended || inFn {
			mu.Unlock()
			t.Errorf("watch %s: a call after done, or two at once: %+v", key, ev)
			return
		}
		inFn = true
		mu.Unlock()
		select {
		case ch <- ev:
		default:
			t.Errorf("watch %s: more than %d states unread", key, cap(ch))
		}
		mu.Lock()
		inFn = false
		mu.Unlock()
	}, func() {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			t.Errorf("watch %s: done called twice", key)
			return
		}
		ended = true
		close(ch)
	})
	must(t, err, "watch func")
	return ch
}

// testWatchFuncKeepsNoValue: a watch keeps nothing of a value it handed out once fn
// returned: a master watches every node's record and keeps each decoded, so a copy of every
// value kept by its watches was a second copy of every record (tens of MiB at ten thousand
// nodes). 32 values of 768 KiB are watched and dropped; the heap may not grow by half of them
// (the margin is for what tests running beside this one keep meanwhile).
func testWatchFuncKeepsNoValue(t *testing.T, b Backend) {
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	s, w := b.Client(t), b.Client(t)
	const keys, size = 32, 768 << 10
	for i := range keys {
		value := make([]byte, size)
		rand.Read(value)
		_, err := s.Put(ctx, "/big/"+strconv.Itoa(i), value, coord.AnyVersion)
		must(t, err, "put")
	}
	fw, ok := w.(coord.FuncWatcher)
	if !ok {
		t.Fatalf("%T is no coord.FuncWatcher", w)
	}
	before := testenv.LiveHeap()
	var got sync.WaitGroup
	got.Add(keys)
	for i := range keys {
		var once sync.Once
		err := fw.WatchFunc(ctx, "/big/"+strconv.Itoa(i), func(ev coord.Event) {
			if ev.Exists && len(ev.Entry.Value) == size {
				once.Do(got.Done)
			}
		}, nil)
		must(t, err, "watch func")
	}
	got.Wait()
	if grew := int64(testenv.LiveHeap()) - int64(before); grew > keys*size/2 {
		t.Errorf("the heap grew by %d KiB while %d watches held states of %d KiB each: the watches keep their values", grew>>10, keys, size>>10)
	}
}

func testWatchOrder(t *testing.T, b Backend) {
	w := b.Client(t)
	testWatchOrderOf(t, b, func(ctx context.Context, key string) (<-chan coord.Event, error) { return w.Watch(ctx, key) })
}

func testWatchFuncOrder(t *testing.T, b Backend) {
	w := b.Client(t)
	testWatchOrderOf(t, b, func(ctx context.Context, key string) (<-chan coord.Event, error) {
		return watchFunc(t, ctx, w, key), nil
	})
}

// testWatchOrderOf checks the states a key's watch gives through its creation, 60 writes,
// its deletion and re-creation.
func testWatchOrderOf(t *testing.T, b Backend, watch func(ctx context.Context, key string) (<-chan coord.Event, error)) {
	ctx := testCtx(t)
	s := b.Client(t)
	ch, err := watch(ctx, "/w")
	must(t, err, "watch")
	ev := next(t, ch, 10*time.Second, "initial event")
	if ev.Exists || ev.Key != "/w" {
		t.Fatalf("initial event for missing key = %+v", ev)
	}
	_, err = s.Create(ctx, "/w", []byte("0"), coord.Persistent)
	must(t, err, "create")
	const n = 60
	done := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			if _, err := s.Put(ctx, "/w", []byte(strconv.Itoa(i)), int64(i-1)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	last := int64(-1)
	seen := 0
	for last < n {
		ev := next(t, ch, 10*time.Second, "watch event")
		if !ev.Exists {
			t.Fatalf("unexpected delete event %+v", ev)
		}
		if ev.Entry.Version <= last {
			t.Fatalf("versions not increasing: %d after %d", ev.Entry.Version, last)
		}
		if string(ev.Entry.Value) != strconv.FormatInt(ev.Entry.Version, 10) {
			t.Fatalf("event carries value %q at version %d", ev.Entry.Value, ev.Entry.Version)
		}
		last = ev.Entry.Version
		seen++
	}
	must(t, <-done, "writer")
	cur, _ := s.Get(ctx, "/w")
	if cur.Version != last {
		t.Fatalf("final event version %d, store has %d", last, cur.Version)
	}
	t.Logf("%d writes, %d events (intermediate states may be coalesced)", n, seen)

	must(t, s.Delete(ctx, "/w", coord.AnyVersion), "delete")
	ev = next(t, ch, 10*time.Second, "delete event")
	if ev.Exists {
		t.Fatalf("after delete got %+v", ev)
	}
	_, err = s.Create(ctx, "/w", []byte("again"), coord.Persistent)
	must(t, err, "re-create")
	ev = next(t, ch, 10*time.Second, "re-create event")
	if !ev.Exists || string(ev.Entry.Value) != "again" || ev.Entry.Version != 0 {
		t.Fatalf("after re-create got %+v", ev)
	}
	select {
	case ev := <-ch:
		t.Fatalf("spurious event %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
}

func testWatchChildren(t *testing.T, b Backend) {
	ctx := testCtx(t)
	w, s := b.Client(t), b.Client(t)
	ch, err := w.WatchChildren(ctx, "/nodes")
	must(t, err, "watch children")
	ev := next(t, ch, 10*time.Second, "initial")
	if ev.Exists || len(ev.Children) != 0 {
		t.Fatalf("initial children event of missing key = %+v", ev)
	}
	for _, n := range []string{"n3", "n1", "n2"} {
		_, err := s.Create(ctx, "/nodes/"+n, nil, coord.Ephemeral)
		must(t, err, "create child")
	}
	want := []string{"n1", "n2", "n3"}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.Exists && slices.Equal(ev.Children, want) {
				goto added
			}
		case <-deadline:
			t.Fatalf("children never became %v", want)
		}
	}
added:
	must(t, s.Delete(ctx, "/nodes/n2", coord.AnyVersion), "delete child")
	ev = next(t, ch, 10*time.Second, "after delete")
	if !slices.Equal(ev.Children, []string{"n1", "n3"}) {
		t.Fatalf("children after delete = %v", ev.Children)
	}
	// Data changes of a child do not fire a children watch.
	_, err = s.Put(ctx, "/nodes/n1", []byte("x"), coord.AnyVersion)
	must(t, err, "put child")
	select {
	case ev := <-ch:
		t.Fatalf("children watch fired on data change: %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
}

func testWatchStops(t *testing.T, b Backend) {
	testWatchStopsOf(t, b, func(ctx context.Context, s coord.Store, key string) (<-chan coord.Event, error) {
		return s.Watch(ctx, key)
	})
}

func testWatchFuncStops(t *testing.T, b Backend) {
	testWatchStopsOf(t, b, func(ctx context.Context, s coord.Store, key string) (<-chan coord.Event, error) {
		return watchFunc(t, ctx, s, key), nil
	})
}

// testWatchStopsOf checks that a watch ends when its context does, and a children watch
// when its client closes.
func testWatchStopsOf(t *testing.T, b Backend, watch func(ctx context.Context, s coord.Store, key string) (<-chan coord.Event, error)) {
	ctx := testCtx(t)
	s := b.Client(t)
	wctx, cancel := context.WithCancel(ctx)
	ch, err := watch(wctx, s, "/k")
	must(t, err, "watch")
	next(t, ch, 10*time.Second, "initial")
	cch, err := s.WatchChildren(ctx, "/k")
	must(t, err, "watch children")
	next(t, cch, 10*time.Second, "initial children")
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			// one in-flight event is allowed; then it must close
			if _, ok := <-ch; ok {
				t.Fatal("watch still open after cancel")
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed after ctx cancel")
	}
	must(t, s.Close(), "close")
	select {
	case _, ok := <-cch:
		if ok {
			t.Fatal("children event after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("children watch not closed by Close")
	}
}

func testEphemeralClose(t *testing.T, b Backend) {
	ctx := testCtx(t)
	a, w := b.Client(t), b.Client(t)
	_, err := a.Create(ctx, "/live/a", []byte("a"), coord.Ephemeral)
	must(t, err, "create ephemeral")
	ch, err := w.Watch(ctx, "/live/a")
	must(t, err, "watch")
	if ev := next(t, ch, 10*time.Second, "initial"); !ev.Exists {
		t.Fatal("ephemeral entry not visible to another client")
	}
	start := time.Now()
	must(t, a.Close(), "close")
	if ev := next(t, ch, 10*time.Second, "after close"); ev.Exists {
		t.Fatalf("after close got %+v", ev)
	}
	if d := time.Since(start); d > b.SessionTimeout() {
		t.Fatalf("closing a client took %s to remove its entries, more than the session timeout", d)
	}
}

// testSessionExpiry: the server expires a client's session; its ephemeral entries go and
// watchers are told; the client opens a new session and re-creates its plain ephemeral
// entries (reported in SessionNew), but not its ephemeral sequential ones.
func testSessionExpiry(t *testing.T, b Backend) {
	ctx := testCtx(t)
	a, w := b.Client(t), b.Client(t)
	sess := a.SessionEvents(ctx)
	_, err := a.Create(ctx, "/agents/a", []byte("v1"), coord.Ephemeral)
	must(t, err, "create ephemeral")
	_, err = a.Put(ctx, "/agents/a", []byte("v2"), coord.AnyVersion)
	must(t, err, "put ephemeral")
	seq, err := a.Create(ctx, "/agents/s-", nil, coord.EphemeralSequential)
	must(t, err, "create ephemeral sequential")
	before, _ := a.Get(ctx, "/agents/a")
	oldSID := a.SessionID()

	data, err := w.Watch(ctx, "/agents/a")
	must(t, err, "watch")
	kids, err := w.WatchChildren(ctx, "/agents")
	must(t, err, "watch children")
	next(t, data, 10*time.Second, "initial")
	if ev := next(t, kids, 10*time.Second, "initial children"); len(ev.Children) != 2 {
		t.Fatalf("initial children %v", ev.Children)
	}

	b.Expire(t, a)

	// Session events: expired (old id), then new session with the entry restored.
	ev := next(t, sess, 10*time.Second, "session event")
	for ev.Type == coord.SessionDisconnected || ev.Type == coord.SessionReconnected {
		ev = next(t, sess, 10*time.Second, "session event")
	}
	if ev.Type != coord.SessionExpired || ev.SessionID != oldSID {
		t.Fatalf("first session event = %+v, want expired %d", ev, oldSID)
	}
	ev = next(t, sess, 10*time.Second, "session event")
	if ev.Type != coord.SessionNew || ev.SessionID == oldSID || ev.SessionID != a.SessionID() ||
		!slices.Equal(ev.Restored, []string{"/agents/a"}) || len(ev.Lost) != 0 {
		t.Fatalf("second session event = %+v (session now %d)", ev, a.SessionID())
	}

	// The watcher is told: the old entry is gone and the re-created one has a new
	// creation revision, the new owner and the last value written.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-data:
			if ev.Exists && ev.Entry.Owner == oldSID {
				t.Fatalf("event still shows the expired session's entry: %+v", ev)
			}
			if ev.Exists && ev.Entry.CreateRev != before.CreateRev {
				if ev.Entry.Owner != a.SessionID() || string(ev.Entry.Value) != "v2" {
					t.Fatalf("re-created entry = %+v, want owner %d value v2", ev.Entry, a.SessionID())
				}
				goto restored
			}
		case <-deadline:
			t.Fatal("watcher never saw the entry re-created")
		}
	}
restored:
	// The sequential entry is gone for good and the children watcher saw it go.
	deadline = time.After(10 * time.Second)
	for {
		select {
		case ev := <-kids:
			if !slices.Contains(ev.Children, coordBase(seq)) {
				goto gone
			}
		case <-deadline:
			t.Fatal("children watcher never saw the sequential entry go")
		}
	}
gone:
	_, err = w.Get(ctx, seq)
	mustIs(t, err, coord.ErrNotFound, "sequential ephemeral after expiry")
	// The client works on under its new session.
	_, err = a.Put(ctx, "/agents/a", []byte("v3"), coord.AnyVersion)
	must(t, err, "put after new session")
}

// testWatchFuncExpiry: a function watch goes on across its own client's session expiry (its
// watches dropped and set again on the new session): it gives the key's later states, and
// ends once, when its context does, also while idle.
func testWatchFuncExpiry(t *testing.T, b Backend) {
	ctx := testCtx(t)
	w, s := b.Client(t), b.Client(t)
	_, err := s.Create(ctx, "/fw", []byte("1"), coord.Persistent)
	must(t, err, "create")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := watchFunc(t, wctx, w, "/fw")
	if ev := next(t, ch, 10*time.Second, "initial"); !ev.Exists || string(ev.Entry.Value) != "1" {
		t.Fatalf("initial state %+v", ev)
	}
	b.Expire(t, w)
	for i := 2; i <= 4; i++ {
		_, err := s.Put(ctx, "/fw", []byte(strconv.Itoa(i)), coord.AnyVersion)
		must(t, err, "put")
		want := strconv.Itoa(i)
		deadline := time.After(testenv.Timeout(10 * time.Second))
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					t.Fatalf("watch ended after the session expired")
				}
				if ev.Exists && string(ev.Entry.Value) == want {
					goto seen
				}
			case <-deadline:
				t.Fatalf("value %s never seen after the watcher's session expired", want)
			}
		}
	seen:
	}
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			if _, ok := <-ch; ok {
				t.Fatal("watch still giving states after cancel")
			}
		}
	case <-time.After(testenv.Timeout(5 * time.Second)):
		t.Fatal("watch not ended (done not called) after its context")
	}
}

func coordBase(key string) string {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == '/' {
			return key[i+1:]
		}
	}
	return key
}

func testElection(t *testing.T, b Backend) {
	ctx := testCtx(t)
	const prefix = "/election/master"
	stores := []coord.Store{b.Client(t), b.Client(t), b.Client(t)}
	var elections []*coord.Election
	for i, s := range stores {
		e, err := coord.NewElection(s, prefix, fmt.Sprintf("m%d", i))
		must(t, err, "new election")
		elections = append(elections, e)
	}
	_, err := elections[0].Leader(ctx)
	mustIs(t, err, coord.ErrNoLeader, "leader before campaign")
	l0, err := elections[0].Campaign(ctx)
	must(t, err, "campaign m0")
	// Another client reads through its own server, which an ensemble's followers bring up to
	// date a moment later (ZooKeeper orders each client's view, not all clients' at once).
	testenv.EventuallyWith(t, "m0 leading as another client sees it", 10*time.Second, func() (bool, string) {
		id, err := elections[1].Leader(ctx)
		return err == nil && id == "m0", fmt.Sprintf("leader = %q, %v", id, err)
	})

	type won struct {
		i int
		l *coord.Leadership
	}
	wins := make(chan won, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			l, err := elections[i].Campaign(ctx)
			if err != nil {
				t.Errorf("campaign m%d: %v", i, err)
				return
			}
			wins <- won{i, l}
		}()
		waitCandidates(t, stores[0], prefix, i+1) // m1 stands before m2
	}
	select {
	case w := <-wins:
		t.Fatalf("m%d won while m0 leads", w.i)
	case <-time.After(300 * time.Millisecond):
	}

	// A candidate whose context ends withdraws.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	extra, _ := coord.NewElection(b.Client(t), prefix, "late")
	_, err = extra.Campaign(cctx)
	cancel()
	mustIs(t, err, context.DeadlineExceeded, "campaign with expired ctx")

	must(t, l0.Resign(ctx), "resign")
	select {
	case <-l0.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after Resign")
	}
	w := next(t, wins, 10*time.Second, "next leader")
	if w.i != 1 {
		t.Fatalf("m%d took over, want m1 (next in line)", w.i)
	}
	if id, _ := elections[0].Leader(ctx); id != "m1" {
		t.Fatalf("leader = %q, want m1", id)
	}
	must(t, w.l.Resign(ctx), "resign m1")
	w = next(t, wins, 10*time.Second, "third leader")
	if w.i != 2 {
		t.Fatalf("m%d took over, want m2", w.i)
	}
	select {
	case <-w.l.Done():
		t.Fatal("leadership done without loss")
	default:
	}
	must(t, w.l.Resign(ctx), "resign m2")
	// m0's client sees m2's resignation once its server has it; a withdrawn candidate left
	// behind would lead for ever.
	testenv.EventuallyWith(t, "no leader after all resigned (the withdrawn candidate gone)", 10*time.Second, func() (bool, string) {
		id, err := elections[0].Leader(ctx)
		return errors.Is(err, coord.ErrNoLeader), fmt.Sprintf("leader %q, %v", id, err)
	})
}

func testElectionExpiry(t *testing.T, b Backend) {
	ctx := testCtx(t)
	const prefix = "/election/x"
	a, f := b.Client(t), b.Client(t)
	ea, _ := coord.NewElection(a, prefix, "a")
	ef, _ := coord.NewElection(f, prefix, "f")
	la, err := ea.Campaign(ctx)
	must(t, err, "campaign a")
	won := make(chan *coord.Leadership, 1)
	go func() {
		l, err := ef.Campaign(ctx)
		if err != nil {
			t.Errorf("campaign f: %v", err)
			return
		}
		won <- l
	}()
	waitCandidates(t, a, prefix, 2)
	b.Expire(t, a)
	select {
	case <-la.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("leadership not lost on session expiry")
	}
	lf := next(t, won, 10*time.Second, "follower leads")
	if id, _ := ea.Leader(ctx); id != "f" {
		t.Fatalf("leader = %q, want f", id)
	}
	must(t, la.Resign(ctx), "resign after loss")
	must(t, lf.Resign(ctx), "resign f")
}

// testFencedWrites: a leader whose session expired while another took over writes nothing
// through its fence, by any kind of write; the new leader's fence writes.
func testFencedWrites(t *testing.T, b Backend) {
	ctx := testCtx(t)
	const prefix = "/election/fence"
	a, f := b.Client(t), b.Client(t)
	ea, _ := coord.NewElection(a, prefix, "a")
	ef, _ := coord.NewElection(f, prefix, "f")
	la, err := ea.Campaign(ctx)
	must(t, err, "campaign a")
	if fa := la.Fence(); fa.Key != la.Key() || fa.Version != 0 {
		t.Fatalf("fence = %+v, want the candidate entry %s at version 0", fa, la.Key())
	}
	old := coord.Fenced(a, la.Fence())
	_, err = old.Create(ctx, "/fence/a", []byte("1"), coord.Persistent)
	must(t, err, "fenced create while leading")
	_, err = old.Put(ctx, "/fence/made", []byte("1"), coord.AnyVersion)
	must(t, err, "fenced put of a missing key while leading")
	won := make(chan *coord.Leadership, 1)
	go func() {
		l, err := ef.Campaign(ctx)
		if err != nil {
			t.Errorf("campaign f: %v", err)
			return
		}
		won <- l
	}()
	waitCandidates(t, a, prefix, 2)
	b.Expire(t, a)
	lf := next(t, won, 10*time.Second, "follower leads")
	before, err := a.Get(ctx, "/fence/a")
	must(t, err, "get before")

	writes := []struct {
		name string
		fn   func() error
	}{
		{"put", func() error { _, err := old.Put(ctx, "/fence/a", []byte("2"), before.Version); return err }},
		{"put any", func() error { _, err := old.Put(ctx, "/fence/a", []byte("2"), coord.AnyVersion); return err }},
		{"put any missing", func() error { _, err := old.Put(ctx, "/fence/b", []byte("2"), coord.AnyVersion); return err }},
		{"create", func() error { _, err := old.Create(ctx, "/fence/c", nil, coord.Persistent); return err }},
		{"create ephemeral", func() error { _, err := old.Create(ctx, "/fence/e", nil, coord.Ephemeral); return err }},
		{"delete", func() error { return old.Delete(ctx, "/fence/a", coord.AnyVersion) }},
		{"txn", func() error {
			_, err := old.Txn(ctx, coord.PutOp("/fence/a", []byte("3"), before.Version), coord.CreateOp("/fence/d", nil, coord.Persistent))
			return err
		}},
		{"update", func() error {
			_, err := coord.Update(ctx, old, "/fence/a", func([]byte, bool) ([]byte, error) { return []byte("4"), nil })
			return err
		}},
	}
	for _, w := range writes {
		err := w.fn()
		mustIs(t, err, coord.ErrFenced, "deposed leader's "+w.name)
		if errors.Is(err, coord.ErrNotFound) || errors.Is(err, coord.ErrConflict) {
			t.Fatalf("deposed leader's %s: %v reads as the key's own error", w.name, err)
		}
	}
	after, err := a.Get(ctx, "/fence/a")
	must(t, err, "get after")
	if after.Version != before.Version || string(after.Value) != string(before.Value) {
		t.Fatalf("/fence/a changed under the fence: %q v%d, was %q v%d", after.Value, after.Version, before.Value, before.Version)
	}
	for _, k := range []string{"/fence/b", "/fence/c", "/fence/d", "/fence/e"} {
		if _, err := a.Get(ctx, k); !errors.Is(err, coord.ErrNotFound) {
			t.Fatalf("%s written by a deposed leader: %v", k, err)
		}
	}

	// The new leader's fence writes. A leader gives up its term at once when its connection
	// drops (Done), and a test server's short session can drop on a loaded machine (CI saw
	// it); then its fenced writes rightly fail, so it campaigns again and the checks restart.
	for attempt := 1; ; attempt++ {
		cur := coord.Fenced(f, lf.Fence())
		err := newLeaderWrites(ctx, a, cur)
		if err == nil {
			must(t, la.Resign(ctx), "resign a")
			must(t, lf.Resign(ctx), "resign f")
			mustIs(t, cur.Delete(ctx, "/fence/made", coord.AnyVersion), coord.ErrFenced, "write after resigning")
			return
		}
		if !errors.Is(err, coord.ErrFenced) {
			t.Fatal(err)
		}
		// The client hears of its term's end a moment after the server shows it.
		select {
		case <-lf.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%v, while f's term goes on", err)
		}
		if attempt == 3 {
			t.Fatalf("%v (attempt %d; f's term ended each time)", err, attempt)
		}
		t.Logf("f's term ended during its writes (%v): campaigning again", err)
		must(t, lf.Resign(ctx), "resign f after its term ended")
		lf, err = ef.Campaign(ctx)
		must(t, err, "campaign f again")
	}
}

// newLeaderWrites checks that the leader's fenced kv writes: a put, a transaction that fails
// at the caller's stale op (not at the fence's), and a delete of /fence/a.
func newLeaderWrites(ctx context.Context, r coord.KV, cur coord.KV) error {
	was, err := r.Get(ctx, "/fence/a")
	if err != nil {
		return fmt.Errorf("get /fence/a: %w", err)
	}
	v, err := cur.Put(ctx, "/fence/a", []byte("5"), was.Version)
	if err != nil {
		return fmt.Errorf("new leader's fenced put: %w", err)
	}
	if v != was.Version+1 {
		return fmt.Errorf("new version %d, want %d", v, was.Version+1)
	}
	res, err := cur.Txn(ctx, coord.CheckOp("/fence/a", v), coord.PutOp("/fence/a", []byte("6"), 0))
	var te *coord.TxnError
	if errors.Is(err, coord.ErrFenced) {
		return fmt.Errorf("txn with a stale op: %w", err)
	}
	if !errors.As(err, &te) || te.Index != 1 || !errors.Is(err, coord.ErrConflict) {
		return fmt.Errorf("txn with a stale op: res %v err %v, want a conflict at the caller's op 1", res, err)
	}
	if err := cur.Delete(ctx, "/fence/a", coord.AnyVersion); err != nil {
		return fmt.Errorf("new leader's fenced delete: %w", err)
	}
	return nil
}

func testLeaderKilled(t *testing.T, b Backend) {
	ctx := testCtx(t)
	const prefix = "/election/kill"
	kill := b.StartLeader(t, prefix, "doomed")
	f := b.Client(t)
	ef, _ := coord.NewElection(f, prefix, "follower")
	if id, err := ef.Leader(ctx); err != nil || id != "doomed" {
		t.Fatalf("leader = %q, %v", id, err)
	}
	won := make(chan *coord.Leadership, 1)
	go func() {
		l, err := ef.Campaign(ctx)
		if err != nil {
			t.Errorf("campaign: %v", err)
			return
		}
		won <- l
	}()
	waitCandidates(t, f, prefix, 2)
	start := time.Now()
	kill()
	// The takeover should come within the session timeout and the server's grace; the time is
	// logged, and the bound, with room for a loaded machine, catches a takeover that waits
	// for something else.
	limit := b.SessionTimeout() + testenv.Timeout(b.ExpiryGrace())
	l := next(t, won, limit+5*time.Second, "follower leads after kill")
	took := time.Since(start)
	t.Logf("follower led %s after the leader was killed (session timeout %s)", took, b.SessionTimeout())
	if took > limit {
		t.Fatalf("takeover took %s, more than session timeout + grace %s", took, limit)
	}
	if took < b.SessionTimeout()/2 {
		t.Fatalf("takeover after %s: the killed leader's session cannot have timed out yet", took)
	}
	must(t, l.Resign(ctx), "resign")
}

// testSync: a read after Sync sees every write another client had made before Sync was
// called, whichever server each client talks to.
func testSync(t *testing.T, b Backend) {
	ctx := testCtx(t)
	w, r := b.Client(t), b.Client(t)
	for i := range 20 {
		v := []byte(strconv.Itoa(i))
		_, err := w.Put(ctx, "/synced", v, coord.AnyVersion)
		must(t, err, "put")
		must(t, r.Sync(ctx), "sync")
		e, err := r.Get(ctx, "/synced")
		must(t, err, "get after sync")
		if string(e.Value) != string(v) {
			t.Fatalf("read after sync = %q, want %q (written before the sync)", e.Value, v)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Sync(sctx); err == nil {
		t.Fatal("sync with a cancelled context succeeded")
	}
}

func testClosed(t *testing.T, b Backend) {
	ctx := testCtx(t)
	s := b.Client(t)
	sess := s.SessionEvents(ctx)
	must(t, s.Close(), "close")
	must(t, s.Close(), "second close")
	_, err := s.Put(ctx, "/x", nil, coord.AnyVersion)
	mustIs(t, err, coord.ErrClosed, "put after close")
	_, err = s.Get(ctx, "/x")
	mustIs(t, err, coord.ErrClosed, "get after close")
	mustIs(t, s.Sync(ctx), coord.ErrClosed, "sync after close")
	select {
	case _, ok := <-sess:
		if ok {
			t.Fatal("session event after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("session events not closed by Close")
	}
}
