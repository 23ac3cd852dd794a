package coord

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// apartStore is a fake of what cannot be made to happen at will: a ZooKeeper server come
// apart from its ensemble (seen in a chaos run on ZooKeeper 3.8.0). From the moment split
// is called it goes on showing the entries it had then, though the ensemble (the store it
// wraps) deletes them, and its watches hear of no such delete; writes and transactions are
// decided by the ensemble. Redialing (another server) ends it.
type apartStore struct {
	Store
	mu      sync.Mutex
	shown   map[string]Entry // what the server still shows; nil when not apart
	healed  chan struct{}
	redials int
}

func newApartStore(s Store) *apartStore {
	return &apartStore{Store: s, healed: make(chan struct{})}
}

// split takes the server apart, keeping the entries under prefix as they are now.
func (a *apartStore) split(t *testing.T, prefix string) {
	t.Helper()
	ctx := context.Background()
	names, err := a.Store.Children(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]Entry{}
	for _, n := range names {
		e, err := a.Store.Get(ctx, joinKey(prefix, n))
		if err != nil {
			t.Fatal(err)
		}
		shown[e.Key] = e
	}
	a.mu.Lock()
	a.shown, a.healed = shown, make(chan struct{})
	a.mu.Unlock()
}

func (a *apartStore) redial(why, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.redials++
	if a.shown != nil {
		a.shown = nil
		close(a.healed)
	}
}

func (a *apartStore) redialCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.redials
}

// ghost returns what the server shows of key that the ensemble no longer has.
func (a *apartStore) ghost(key string) (Entry, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.shown[key]
	return e, ok
}

func (a *apartStore) Get(ctx context.Context, key string) (Entry, error) {
	e, err := a.Store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		if g, ok := a.ghost(key); ok {
			return g, nil
		}
	}
	return e, err
}

func (a *apartStore) Children(ctx context.Context, key string) ([]string, error) {
	names, err := a.Store.Children(ctx, key)
	if err != nil {
		return names, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k := range a.shown {
		if parentKey(k) == key && !slices.Contains(names, baseName(k)) {
			names = append(names, baseName(k))
		}
	}
	return names, nil
}

// Watch passes the ensemble's states on, except that a shown entry's delete waits for the
// server to be left.
func (a *apartStore) Watch(ctx context.Context, key string) (<-chan Event, error) {
	in, err := a.Store.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make(chan Event)
	go func() {
		defer close(out)
		for ev := range in {
			if !ev.Exists {
				if _, ok := a.ghost(key); ok {
					a.mu.Lock()
					healed := a.healed
					a.mu.Unlock()
					select {
					case <-healed:
					case <-ctx.Done():
						return
					}
				}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

func newApartTestStores(t *testing.T) (raw Store, apart *apartStore) {
	t.Helper()
	srv, err := NewServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	connect := func() Store {
		c, err := srv.Connect(Options{SessionTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return connect(), newApartStore(connect())
}

// testElection is the prefix of the tests' election.
const testElection = "/election"

// mustLead stands id for election through s and returns once it leads.
func mustLead(ctx context.Context, t *testing.T, s Store, id string) (*Election, *Leadership) {
	t.Helper()
	el, err := NewElection(s, testElection, id)
	if err != nil {
		t.Fatal(err)
	}
	lead, err := el.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return el, lead
}

// A candidate whose server shows a leader the ensemble no longer has leads once the check
// in the store's order finds the leader gone, and leaves that server: the chaos run's
// master waited behind such an entry for good, and nobody placed a worker for minutes.
func TestCampaignBehindAnEntryOnlyItsServerShows(t *testing.T) {
	raw, apart := newApartTestStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, lead := mustLead(ctx, t, raw, "first")
	apart.split(t, testElection)
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second, _ := NewElection(apart, testElection, "second")
	l2, err := second.Campaign(ctx)
	if err != nil {
		t.Fatalf("the candidate never led (it waited behind the entry only its server showed): %v", err)
	}
	defer l2.Resign(context.Background())
	if n := apart.redialCount(); n != 1 {
		t.Fatalf("redials = %d, want 1 (the server apart left once)", n)
	}
	if who, err := first.Leader(ctx); err != nil || who != "second" {
		t.Fatalf("leader = %q, %v; want second", who, err)
	}
}

// A leader whose own entry the ensemble deleted, read from a server that still shows it,
// loses the term: the chaos run's master led on such an entry for minutes, every write of
// it fenced.
func TestLeaderOnAnEntryOnlyItsServerShows(t *testing.T) {
	raw, apart := newApartTestStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, lead := mustLead(ctx, t, apart, "leader")
	apart.split(t, testElection)
	if err := raw.Delete(ctx, lead.Key(), AnyVersion); err != nil {
		t.Fatal(err)
	}
	if _, err := apart.Get(ctx, lead.Key()); err != nil {
		t.Fatalf("the fake server does not show the deleted entry: %v", err)
	}
	select {
	case <-lead.Done():
	case <-ctx.Done():
		t.Fatal("leadership never ended though the ensemble has no entry for it")
	}
	if n := apart.redialCount(); n != 1 {
		t.Fatalf("redials = %d, want 1", n)
	}
	if _, err := Fenced(raw, lead.Fence()).Put(ctx, "/x", nil, AnyVersion); !errors.Is(err, ErrFenced) {
		t.Fatalf("a write with the ended term's fence: %v, want ErrFenced", err)
	}
}

// The check costs nothing visible while the server agrees with its ensemble: no redial,
// the term lasts.
func TestLeaderConfirmedWhileItsServerAgrees(t *testing.T) {
	_, apart := newApartTestStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, lead := mustLead(ctx, t, apart, "leader")
	defer lead.Resign(context.Background())
	// Two checks' worth: evidence that checks ran is the absence of a loss across them.
	deadline := time.After(2*confirmEvery + confirmEvery/2)
	select {
	case <-lead.Done():
		t.Fatal("leadership ended with nothing wrong")
	case <-deadline:
	}
	if n := apart.redialCount(); n != 0 {
		t.Fatalf("redials = %d, want 0", n)
	}
}
